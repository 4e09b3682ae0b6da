"""Where the classes a cell resolves are defined (their vLLM source modules), and which vLLM source files every
cell depends on: what `kvmatrix pr` reads to select the cells a vLLM change touches.

The probe records each class's module as it ran (`backend_module`, `quant_method_module` per layer,
`spec_module` per KV-cache group, `backend_module` and the builder's `module` per attention group). Records made
before it did carry only names (the backend's `get_name()`, the builder's and the spec's class names); the
tables below give those names' modules, by version, so older records select cells too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from kvmatrix.harness.vllm_compat.versions import for_version

# From an attention layer: its quantization method (an object; the module of its class is recorded).
LAYER_QUANT_METHOD_ATTRS = [("", ("quant_method",))]

# Record fields that hold a module: per layer, per KV-cache group, per attention group and per builder.
LAYER_MODULE_FIELDS = ("backend_module", "quant_method_module")
KV_GROUP_MODULE_FIELDS = ("spec_module",)
ATTN_GROUP_MODULE_FIELDS = ("backend_module",)
BUILDER_MODULE_FIELD = "module"

# ---------------------------------------------------------------------------------------------------------------
# Fallback for records without module fields: a backend's get_name() -> its module (vLLM's backend registry,
# v1/attention/backends/registry.py, 0.26 and 0.32), a builder class that lives elsewhere than its backend, and
# the one module every KV-cache spec class is defined in.

_V1 = "vllm.v1.attention.backends"
BACKEND_MODULES = [("", {
    "CPU_ATTN": f"{_V1}.cpu_attn",
    "CPU_MLA": f"{_V1}.mla.cpu_mla",
    "FLASH_ATTN": f"{_V1}.flash_attn",
    "FLASHINFER": f"{_V1}.flashinfer",
    "TRITON_ATTN": f"{_V1}.triton_attn",
    "FLEX_ATTENTION": f"{_V1}.flex_attention",
    "FLASH_ATTN_MLA": f"{_V1}.mla.flashattn_mla",
    "FLASH_ATTN_MLA_SPARSE": f"{_V1}.mla.flashattn_mla_sparse",
    "FLASHMLA": f"{_V1}.mla.flashmla",
    "FLASHMLA_SPARSE": f"{_V1}.mla.flashmla_sparse",
    "FLASHINFER_MLA": f"{_V1}.mla.flashinfer_mla",
    "TRITON_MLA": f"{_V1}.mla.triton_mla",
    "CUTLASS_MLA": f"{_V1}.mla.cutlass_mla",
    "DEEPSEEK_V32_INDEXER": f"{_V1}.mla.indexer",
    "MAMBA2_ATTN": f"{_V1}.mamba2_attn",
})]
# Builders defined away from their backend's module (the others are taken to live with their backend).
BUILDER_MODULES = [(">=0.32", {"MLACommonMetadataBuilder": "vllm.model_executor.layers.attention.mla_attention"})]
SPEC_MODULE = [("", "vllm.v1.kv_cache_interface")]

# ---------------------------------------------------------------------------------------------------------------
# Source paths (prefixes, relative to a vLLM checkout) whose change can move any cell, whatever it resolved:
# `kvmatrix pr` selects every cell for them, with the reason shown.
SELECT_ALL_PATHS = [("", (
    ("vllm/config/", "engine, model and cache configuration: every cell's --kv-cache-dtype and backend choice "
                     "is resolved there"),
    ("vllm/engine/arg_utils.py", "engine arguments: how every cell's arguments become its configuration"),
    ("vllm/v1/core/kv_cache_manager.py", "the KV-cache manager every cell allocates through"),
    ("vllm/v1/core/kv_cache_utils.py", "KV-cache sizing and grouping (page sizes, block counts) of every cell"),
    ("vllm/v1/core/kv_cache_coordinator.py", "coordinates every cell's KV-cache groups"),
    ("vllm/v1/core/single_type_kv_cache_manager.py", "per-group KV-cache managers of every cell"),
    ("vllm/v1/core/block_pool.py", "the KV block pool of every cell"),
    ("vllm/model_executor/layers/attention/attention.py", "the Attention layer every attention layer is: it "
                                                          "decides the layer's KV dtype (explicit vs checkpoint)"),
    ("vllm/platforms/", "platform rules: backend selection and dtype support for every cell"),
))]


def _one(table: list, version: str | None) -> Any:
    found = for_version(table, version)
    return found[0] if found else None


def class_module(obj: Any) -> str | None:
    """The module a class (or an object's class) is defined in; None for None."""
    if obj is None:
        return None
    cls = obj if isinstance(obj, type) else type(obj)
    return getattr(cls, "__module__", None)


def backend_module(name: str | None, version: str | None) -> str | None:
    return (_one(BACKEND_MODULES, version) or {}).get(name) if name else None


def builder_module(builder_class: str | None, backend: str | None, version: str | None) -> str | None:
    elsewhere = {k: v for table in for_version(BUILDER_MODULES, version) for k, v in table.items()}
    return elsewhere.get(builder_class) or backend_module(backend, version) if builder_class else None


def recorded_modules(record: dict) -> Iterator[tuple[str, str]]:
    """(where in the record, module) for every module the record names: its own fields first, else the modules
    its recorded names stand for (records made before the probe recorded modules)."""
    version = record.get("vllm_version")
    for layer in record.get("layers") or []:
        yield from _layer_modules(layer, version)
    spec_module = _one(SPEC_MODULE, version)
    for group in record.get("kv_groups") or []:
        module = group.get("spec_module") or (spec_module if group.get("spec_type") else None)
        if module:
            yield f"KV group {group.get('group')} spec {group.get('spec_type')}", module
    for group in record.get("attn_groups") or []:
        yield from _attention_group_modules(group, version)
    exception = record.get("exception") or {}
    for module in traceback_modules(f"{exception.get('traceback_tail') or ''}\n{record.get('log_tail') or ''}"):
        yield "its crash's traceback", module


def _layer_modules(layer: dict, version: str | None) -> Iterator[tuple[str, str]]:
    where = f"{layer.get('role') or 'target'} layer"
    if not any(layer.get(f) for f in LAYER_MODULE_FIELDS):
        if module := backend_module(layer.get("backend"), version):
            yield f"{where} backend {layer.get('backend')}", module
    for field in LAYER_MODULE_FIELDS:
        if layer.get(field):
            yield f"{where} {field.removesuffix('_module')}", layer[field]


def _attention_group_modules(group: dict, version: str | None) -> Iterator[tuple[str, str]]:
    where = f"attention group {group.get('group')}.{group.get('subgroup')}"
    module = group.get("backend_module") or backend_module(group.get("backend"), version)
    if module:
        yield f"{where} backend {group.get('backend')}", module
    builder = group.get("builder") or {}
    module = builder.get(BUILDER_MODULE_FIELD) or builder_module(builder.get("class"), group.get("backend"), version)
    if module:
        yield f"{where} builder {builder.get('class')}", module


# A traceback frame in vLLM's package (the last `/vllm/` of the path: a checkout may itself be named vllm):
_FRAME = re.compile(r'File "[^"]*/(vllm/(?:\w+/)*\w+)\.py"')


def traceback_modules(text: str) -> list[str]:
    """The vLLM modules a traceback (or a log holding one) runs through, in order, each once."""
    return list(dict.fromkeys(m.replace("/", ".").removesuffix(".__init__") for m in _FRAME.findall(text)))


def select_all_reason(path: str, version: str | None) -> str | None:
    """Why a change to this source path can move every cell; None if it does not by itself."""
    for prefix, reason in _one(SELECT_ALL_PATHS, version) or ():
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return reason
    return None
