"""A whole machine seen as a lower CPU class: `make test CPU_ISA=avx2` on an AVX-512 machine.

The Makefile puts a `.pth` line in the environment that imports this module at every interpreter start while
KVMATRIX_EMULATE_CPU_ISA is set, so every process (the tests, the harness, each cell) finds vLLM's CPU probes
answering as that class does: the class detected, vLLM's refusals and its kernel build all follow. It is how a
developer on an AVX-512 CPU runs the suite an AVX2-only CI machine runs. One cell as another class needs none of
this: `--gpu cpu-avx2 --emulate` patches that cell's process alone.

The probes are patched right after torch is imported, not at start: most processes never import torch (fake cells,
helpers), and importing it in each would make them seconds slower than the tests' timeouts allow.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys


class _PatchTorchOnImport(importlib.abc.MetaPathFinder):
    """Stays on sys.meta_path until torch is really executed: a mere `importlib.util.find_spec("torch")` (vLLM
    asks before it imports torch) also comes here, and the spec it gets is not the one the import then uses."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # find torch's real spec without coming back here
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader.exec_module = _then_patch(spec.loader.exec_module, self)
        return spec


def _then_patch(exec_module, finder=None):
    def run(module):
        exec_module(module)
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        from kvmatrix.harness.vllm_compat import emulate_cpu_isa, installed_vllm_version

        emulate_cpu_isa(os.environ["KVMATRIX_EMULATE_CPU_ISA"], installed_vllm_version())

    return run


if "torch" in sys.modules:
    _then_patch(lambda module: None)(sys.modules["torch"])
else:
    sys.meta_path.insert(0, _PatchTorchOnImport())
