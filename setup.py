"""The package list, found rather than written out: kvmatrix, and every package under the folders that
pyproject.toml's package-dir maps into it (a new sub-package ships without touching this file)."""

from setuptools import find_packages, setup

PARTS = ("harness", "matrix", "reports", "cases")

setup(packages=["kvmatrix", *(f"kvmatrix.{name}" for name in find_packages(include=[f"{p}*" for p in PARTS]))])
