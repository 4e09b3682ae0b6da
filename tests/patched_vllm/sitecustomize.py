"""Alters lines of the installed vLLM on purpose, for tests that must see a cell's verdict flip.

Put this folder first on PYTHONPATH and set KVM_PATCH_MODULE, KVM_PATCH_OLD and KVM_PATCH_NEW (one line of one
module), or KVM_PATCHES to a JSON list of {"module", "old", "new"} (several modules, one replacement each): when
such a module is imported, its source is read from the installed vLLM, the text is replaced (exactly once, or the
import fails loudly), and the result is compiled in its place. Nothing on disk changes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys


def _patches() -> dict[str, tuple[str, str]]:
    """module -> (old, new), from KVM_PATCHES and the single KVM_PATCH_MODULE / OLD / NEW."""
    patches = {p["module"]: (p["old"], p["new"]) for p in json.loads(os.environ.get("KVM_PATCHES") or "[]")}
    if os.environ.get("KVM_PATCH_MODULE"):
        patches[os.environ["KVM_PATCH_MODULE"]] = (os.environ.get("KVM_PATCH_OLD", ""),
                                                   os.environ.get("KVM_PATCH_NEW", ""))
    return patches


PATCHES = _patches()


class PatchingLoader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, old: str, new: str):
        super().__init__(fullname, path)
        self.old, self.new = old, new

    def get_data(self, path):
        data = super().get_data(path)
        if not path.endswith(".py"):
            return data
        source = data.decode()
        if source.count(self.old) != 1:
            raise ImportError(f"kvmatrix test patch: {self.old!r} occurs {source.count(self.old)} times in {path}")
        return source.replace(self.old, self.new).encode()

    def path_stats(self, path):
        raise OSError  # never use the cached bytecode of the unpatched file


class PatchingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            return None
        spec.loader = PatchingLoader(fullname, spec.origin, *PATCHES[fullname])
        return spec


if PATCHES:
    sys.meta_path.insert(0, PatchingFinder())
