"""A whole machine seen as a lower CPU class: `make test CPU_ISA=avx2` on an AVX-512 machine.

The Makefile puts a `.pth` line in the environment that imports this module at every interpreter start while
KVMATRIX_EMULATE_CPU_ISA is set, so every process (the tests, the harness, each cell) finds vLLM's CPU probes
answering as that class does: the class detected, vLLM's refusals and its kernel build all follow. It is how a
developer on an AVX-512 CPU runs the suite an AVX2-only CI machine runs. One cell as another class needs none of
this: `--gpu cpu-avx2 --emulate` patches that cell's process alone.
"""

from __future__ import annotations

import os

from harness.vllm_compat import emulate_cpu_isa, installed_vllm_version

emulate_cpu_isa(os.environ["KVMATRIX_EMULATE_CPU_ISA"], installed_vllm_version())
