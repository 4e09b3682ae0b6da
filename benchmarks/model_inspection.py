"""vLLM's model-class inspection on a cold cache, side by side: in the child process vLLM starts for it, and in
the cell's own process (harness/vllm_compat/registry.py, what a one-rank kvmatrix cell does), for the
architectures of the default matrix's tiny models.

    PYTHONPATH=. .venv/bin/python benchmarks/model_inspection.py [ARCH ...]

Each architecture, on an emptied modelinfo cache: inspected in vLLM's child process, then in this process, where
the first inspection pays the model module's import (in a cell, vLLM imports it moments later anyway). Prints
seconds per architecture and the ratio child / in-process; the two answers must be equal.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
import time

# What vLLM resolved for the default matrix's tiny models and drafts (the runs' logs: "Resolved architecture").
ARCHITECTURES = ["LlamaForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM", "Gemma3ForCausalLM",
                 "NemotronHForCausalLM", "Glm4MoeLiteForCausalLM", "Glm4MoeLiteMTPModel", "GlmMoeDsaForCausalLM",
                 "DeepSeekMTPModel", "LlamaForCausalLMEagle3", "DFlashDraftModel"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("architectures", nargs="*", default=ARCHITECTURES)
    args = parser.parse_args()
    os.environ["VLLM_CACHE_ROOT"] = cache = tempfile.mkdtemp(prefix="kvmatrix-modelinfo-")
    from vllm.model_executor.models.registry import ModelRegistry

    from kvmatrix.harness import vllm_compat

    def inspect(arch: str, in_process: bool) -> tuple[float, dict]:
        shutil.rmtree(os.path.join(cache, "modelinfos"), ignore_errors=True)
        started = time.perf_counter()
        if in_process:
            with vllm_compat.model_info_in_process(None):
                info = ModelRegistry.models[arch].inspect_model_cls()
        else:
            info = ModelRegistry.models[arch].inspect_model_cls()
        return time.perf_counter() - started, dataclasses.asdict(info)

    print("| architecture | child process (s) | in-process (s) | child / in-process |")
    print("|---|---|---|---|")
    totals = [0.0, 0.0]
    for arch in args.architectures:
        child_s, child_answer = inspect(arch, in_process=False)
        here_s, here_answer = inspect(arch, in_process=True)
        if child_answer != here_answer:
            raise SystemExit(f"{arch}: the answers differ: {child_answer} != {here_answer}")
        totals[0] += child_s
        totals[1] += here_s
        print(f"| {arch} | {child_s:.2f} | {here_s:.3f} | {child_s / here_s:.0f}x |", flush=True)
    print(f"| all {len(args.architectures)} | {totals[0]:.1f} | {totals[1]:.2f} | {totals[0] / totals[1]:.0f}x |")
    print("answers equal for every architecture")
    shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
