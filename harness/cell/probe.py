"""What vLLM resolved, read inside the worker: `llm.collective_rpc(probe)`.

The frontend's config can say `auto` while the workers run fp8, so everything here comes from the worker's model
runner: each attention layer, the KV-cache groups that were allocated, and the attention metadata builders.
Attribute paths come from vllm_compat; a missing attribute is recorded as null rather than raised, so one renamed
attribute costs one field, not the record.
"""

from __future__ import annotations

import enum
import re
from typing import Any, cast

from kvmatrix.harness import vllm_compat as compat
from kvmatrix.harness.record.types import AttnGroup, Builder, CellOutput, KvGroup, Layer, Runtime

_MISSING = object()


def probe(worker: Any) -> CellOutput:
    import vllm

    version = vllm.__version__
    runner = _first_path(worker, compat.MODEL_RUNNER_PATHS, version)
    if runner is None:
        raise RuntimeError(f"no model runner on {type(worker).__name__}")
    forward_context = _first_path(runner, compat.FORWARD_CONTEXT_PATHS, version) or {}
    attention = {name: m for name, m in forward_context.items() if hasattr(m, compat.LAYER_MARKER_ATTR)}
    groups = list(getattr(_first_path(runner, compat.KV_CACHE_CONFIG_PATHS, version), "kv_cache_groups", None) or [])
    draft = set(_first_path(runner, compat.DRAFT_LAYER_NAME_PATHS, version) or ())  # the drafter's own record
    return {
        "worker_cache_dtype": _plain(_path(runner, "vllm_config.cache_config.cache_dtype")),
        "layers": [_layer(name, module, groups, draft, version) for name, module in attention.items()],
        "kv_groups": [_kv_group(i, group) for i, group in enumerate(groups)],
        "attn_groups": _attn_groups(runner, version),
        "runtime": _runtime(runner, version),
        "weight_dtypes": _weight_dtypes(runner, version),
    }


def _weight_dtypes(runner: Any, version: str) -> list[str] | None:
    """The dtypes of the target model's parameters (FP8 weights show as float8_*), or None where the model is not
    found."""
    model = None
    for name in (n for names in compat.for_version(compat.TARGET_MODEL_CALLS, version) for n in names):
        method = getattr(runner, name, None)
        if callable(method):
            try:
                model = method()
            except Exception:  # noqa: BLE001 - a runner without a loaded model: try the attribute
                model = None
            if model is not None:
                break
    model = model if model is not None else _first_path(runner, compat.TARGET_MODEL_PATHS, version)
    parameters = getattr(model, "parameters", None)
    if not callable(parameters):
        return None
    return sorted({_plain(p.dtype) for p in parameters()})


def _runtime(runner: Any, version: str) -> Runtime:
    """What the engine resolved for the execution mode and the workloads' runtime paths (compilation and CUDA-graph
    mode, prefix caching, chunked prefill, batch limits, KV blocks)."""
    paths = compat.for_version(compat.RUNTIME_CONFIG_PATHS, version)[0]
    # The table's keys are Runtime's fields, unknown to mypy (check_cell_output checks them as the cell saves its
    # result).
    return cast(Runtime, {field: _plain(_path(runner, path)) for field, path in paths.items()})


def layer_index(name: str) -> int | None:
    """The layer number in a module name: model.layers.3.self_attn.attn -> 3 (the first numeric part)."""
    match = re.search(r"(?:^|\.)(\d+)(?:\.|$)", name)
    return int(match.group(1)) if match else None


def _layer(name: str, module: Any, groups: list, draft: set[str], version: str) -> Layer:
    group_index, spec = _spec_of(name, groups)
    backend = _layer_backend(module, version)
    scales = compat.for_version(compat.LAYER_SCALE_ATTRS, version)[0]
    layer: Layer = {
        "name": name,
        "index": layer_index(name),
        "role": "draft" if name in draft else "target",
        "kv_cache_dtype": _plain(getattr(module, "kv_cache_dtype", None)),
        "backend": _backend_name(backend),
        "backend_module": compat.class_module(backend),
        "quant_method_module": compat.class_module(_first_path(module, compat.LAYER_QUANT_METHOD_ATTRS, version)),
        "spec_dtype": _plain(getattr(spec, "dtype", None)),
        "page_size_bytes": _plain(getattr(spec, "page_size_bytes", None)),
        "group": group_index,
    }
    # The table's keys are Layer's scale fields (k_scale, v_scale), unknown to mypy; last, as they always were.
    layer.update(cast(Layer, {key: _scale(module, attrs) for key, attrs in scales.items()}))
    return layer


def _spec_of(name: str, groups: list) -> tuple[int | None, Any]:
    """A layer's KV group and its own spec (a UniformTypeKVCacheSpecs group holds one spec per layer)."""
    for i, group in enumerate(groups):
        if name in (getattr(group, "layer_names", None) or ()):
            spec = getattr(group, "kv_cache_spec", None)
            per_layer = getattr(spec, compat.PER_LAYER_SPECS_ATTR, None)
            return i, per_layer.get(name) if isinstance(per_layer, dict) else spec
    return None, None


def _kv_group(index: int, group: Any) -> KvGroup:
    spec = getattr(group, "kv_cache_spec", None)
    kv_group: KvGroup = {
        "group": index,
        "layer_names": list(getattr(group, "layer_names", None) or []),
        "spec_type": type(spec).__name__ if spec is not None else None,
        "spec_module": compat.class_module(spec),
    }
    # KV_SPEC_FIELDS are KvGroup's spec fields, which mypy cannot tell from a tuple of strings.
    kv_group.update(cast(KvGroup, {field: _plain(getattr(spec, field, None)) for field in compat.KV_SPEC_FIELDS}))
    return kv_group


def _attn_groups(runner: Any, version: str) -> list[AttnGroup]:
    out: list[AttnGroup] = []
    nested = _first_path(runner, compat.ATTN_GROUPS_PATHS, version) or []
    for g, subgroups in enumerate(nested):
        for j, group in enumerate(subgroups):
            builders = getattr(group, "metadata_builders", None) or []
            out.append({
                "group": _plain(getattr(group, "kv_cache_group_id", g)),
                "subgroup": j,
                "backend": _backend_name(getattr(group, "backend", None)),
                "backend_module": compat.class_module(getattr(group, "backend", None)),
                "layer_names": list(getattr(group, "layer_names", None) or []),
                # Further builders (one per micro-batch) are copies of the first.
                "builder": _builder(builders[0], version) if builders else None,
            })
    return out


def _builder(builder: Any, version: str) -> Builder:
    named = [a for attrs in compat.for_version(compat.BUILDER_DTYPE_ATTRS, version) for a in attrs]
    fields: dict[str, Any] = {"class": type(builder).__name__, "module": compat.class_module(builder)}
    fields.update({attr: _plain(getattr(builder, attr, None)) for attr in named})
    for attr, value in vars(builder).items():
        if attr not in fields and _is_dtype_like(attr, value):
            fields[attr] = _plain(value)
    return compat.normalized_builder(fields, version)


def _is_dtype_like(attr: str, value: Any) -> bool:
    import torch

    return isinstance(value, torch.dtype) or ("dtype" in attr and isinstance(value, (str, type(None))))


def _layer_backend(module: Any, version: str) -> Any:
    """The layer's attention backend class (None if it has none that names itself)."""
    for method in compat.for_version(compat.LAYER_BACKEND_CALLS, version)[0]:
        call = getattr(module, method, None)
        if callable(call):
            try:
                backend = call()
            except Exception:  # some layers raise before their backend is chosen; the attribute may still say
                continue
            if _backend_name(backend):
                return backend
    for attr in compat.for_version(compat.LAYER_BACKEND_ATTRS, version)[0]:
        backend = getattr(module, attr, None)
        if _backend_name(backend):
            return backend
    return None


def _backend_name(backend: Any) -> str | None:
    get_name = getattr(backend, "get_name", None)
    return get_name() if callable(get_name) else None


def _scale(module: Any, attrs: tuple[str, ...]) -> float | None:
    for attr in attrs:
        value = getattr(module, attr, None)
        if value is not None:
            try:
                return float(value)
            except (TypeError, ValueError, RuntimeError):  # a per-head tensor has no single value
                return None
    return None


def _first_path(obj: Any, table: list, version: str) -> Any:
    for paths in compat.for_version(table, version):
        for path in paths:
            value = _path(obj, path)
            if value is not None:
                return value
    return None


def _path(obj: Any, dotted: str) -> Any:
    for attr in filter(None, dotted.split(".")):
        obj = getattr(obj, attr, _MISSING)
        if obj is _MISSING:
            return None
    return obj


def _plain(value: Any) -> Any:
    """A JSON value: dtypes without the `torch.` prefix, enums by name."""
    if isinstance(value, enum.Enum):  # before the int check: an IntEnum would print as its number
        return value.name
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value).removeprefix("torch.")
