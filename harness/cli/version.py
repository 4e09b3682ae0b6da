"""`kvmatrix --version`: this kvmatrix's version (the checkout's pyproject.toml, else the installed metadata) and
the vLLM it would run."""

from __future__ import annotations

import argparse
import importlib.metadata
from collections.abc import Sequence
from typing import Any

import tomllib

from kvmatrix.harness.record.paths import CHECKOUT, PACKAGE_ROOT


def kvmatrix_version() -> str:
    if CHECKOUT:
        with (CHECKOUT / "pyproject.toml").open("rb") as f:
            return f"{tomllib.load(f)['project']['version']} (checkout {CHECKOUT})"
    return f"{importlib.metadata.version('kvmatrix')} ({PACKAGE_ROOT})"


def version_text() -> str:
    from kvmatrix.harness.vllm_compat import installed_vllm_distribution  # read only when asked

    dist, version = installed_vllm_distribution()
    return f"kvmatrix {kvmatrix_version()}; {dist} {version}" if version else \
        f"kvmatrix {kvmatrix_version()}; no vLLM installed"


class VersionAction(argparse.Action):
    """argparse's version action, worked out only when asked (reading the installed vLLM costs a metadata scan)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, help="show kvmatrix's and the installed vLLM's versions")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(version_text())
        parser.exit()
