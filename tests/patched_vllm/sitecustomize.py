"""Alters one line of the installed vLLM on purpose, for tests that must see a cell's verdict flip.

Put this folder first on PYTHONPATH and set KVM_PATCH_MODULE, KVM_PATCH_OLD and KVM_PATCH_NEW: when that module
is imported, its source is read from the installed vLLM, the one line is replaced (exactly once, or the import
fails loudly), and the result is compiled in its place. Nothing on disk changes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

MODULE = os.environ.get("KVM_PATCH_MODULE")
OLD, NEW = os.environ.get("KVM_PATCH_OLD", ""), os.environ.get("KVM_PATCH_NEW", "")


class PatchingLoader(importlib.machinery.SourceFileLoader):
    def get_data(self, path):
        data = super().get_data(path)
        if not path.endswith(".py"):
            return data
        source = data.decode()
        if source.count(OLD) != 1:
            raise ImportError(f"kvmatrix test patch: {OLD!r} occurs {source.count(OLD)} times in {path}")
        return source.replace(OLD, NEW).encode()

    def path_stats(self, path):
        raise OSError  # never use the cached bytecode of the unpatched file


class PatchingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            return None
        spec.loader = PatchingLoader(fullname, spec.origin)
        return spec


if MODULE:
    sys.meta_path.insert(0, PatchingFinder())
