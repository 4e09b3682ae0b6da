"""What a stranger's case folder may say: data only. A folder other than the built-in one (its case files, the blocks
they include, `_models.yaml`, `_pool.yaml`, `_waivers.txt`) may come from anyone (a pull request, a shared
archive), so nothing in it may make vLLM import a module, read a path or run a model's own code: the speculative
fields a case adds, the registry's engine arguments, draft entries and hub ids, and the pool's engine defaults hold
words, numbers and flags only. The built-in registry needs more (DeepSeek-V2-Lite's `trust_remote_code`), and so
may a user's own folder: `--trust-case-code` (or KVMATRIX_TRUST_CASE_CODE=1, which the flag sets for the processes a
command starts) says the folder is the user's own, to be trusted like code (docs/case-files.md)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from kvmatrix.matrix.messages import did_you_mean, excerpt
from kvmatrix.matrix.schema import (
    CASE_ENGINE_ARGS,
    CASE_NESTED_ENGINE_ARGS,
    GpuClass,
    ModelEntry,
    case_engine_arg_problem,
    plain_value,
)

TRUST_CASE_CODE_ENV = "KVMATRIX_TRUST_CASE_CODE"
TRUST_HINT = ("; a folder of your own may name such things with --trust-case-code (it is then trusted like code: "
              "docs/case-files.md)")

# Fields of vLLM's speculative_config that take a size, a dtype, a backend, a mode or a flag (names of several
# releases: harness/vllm_compat/speculative.py). Not here: `method` and `model`, the registry draft entry's
# (`method: custom_class` imports `model` as a Python class), and the revisions, load configs, custom methods and
# options that name code or files.
DATA_SPECULATIVE_FIELDS = frozenset({
    "attention_backend", "kv_cache_dtype", "parallel_drafting", "prompt_lookup_max", "prompt_lookup_min",
    "enforce_eager", "max_model_len", "quantization", "moe_backend", "tensor_parallel_size",
    "draft_tensor_parallel_size", "draft_decode_context_parallel_size", "disable_padded_drafter_batch",
    "disable_eagle_block_drop", "disable_lookahead_block_hashes", "draft_sample_method", "rejection_sample_method",
    "synthetic_acceptance_length", "synthetic_acceptance_rates", "use_local_argmax_reduction",
    "use_heterogeneous_vocab", "index_share_for_mtp_iteration", "enable_adaptive_verification", "dspark_draft_topk",
    "num_speculative_tokens_per_batch_size", "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_max_tree_depth", "suffix_decoding_min_token_prob", "draft_lm_head_quantization",
    "fly_entropy_threshold", "fly_entropy_top_k", "fly_window_size", "xpress_topc",
})
# A draft method vLLM turns into an import: `custom_class` loads the draft's `model` as `module.Class`.
CODE_LOADING_DRAFT_METHODS = frozenset({"custom_class"})
# What a registry adds to a case's engine arguments without trust: how dummy weights load and config overrides
# (hf_overrides: plain values, no `auto_map` naming remote code).
REGISTRY_DATA_ENGINE_ARGS = frozenset({"load_format", "hf_overrides"})
# A hub id is `org/name`: no absolute or relative path, no home folder, no `..`.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
# A value in hf_overrides: a config's word, number or flag (`M*M*` is a layer pattern), never a path.
_OVERRIDE_TEXT = re.compile(r"[A-Za-z0-9_*+=:,-]{0,256}")


def code_trusted() -> bool:
    """Whether the user said that the case folder is their own (--trust-case-code)."""
    return os.environ.get(TRUST_CASE_CODE_ENV) == "1"


def speculative_field_problem(name: str, value: Any) -> str | None:
    """Why a case's `speculative_config:` (or an untrusted registry draft's `config:`) may not set `name` to
    `value` (None: it may)."""
    if name not in DATA_SPECULATIVE_FIELDS:
        return (f"not a field a case may set in speculative_config{did_you_mean(name, DATA_SPECULATIVE_FIELDS)}: "
                "the draft's method and model are the model "
                "registry's (method custom_class imports the model as code), and revisions, load configs and custom "
                "methods name code or files (matrix/trust.py DATA_SPECULATIVE_FIELDS)")
    if not all(plain_value(v) for v in (value if isinstance(value, list) else [value])):
        return f"{excerpt(value)} is not a plain value (a word, a finite number or a flag; no path or dotted name)"
    return None


def _override_problem(value: Any) -> str | None:
    if isinstance(value, dict):
        if "auto_map" in value:
            return "auto_map names remote code"
        return next(filter(None, (_override_problem(v) for v in value.values())), None)
    if isinstance(value, list):
        return next(filter(None, (_override_problem(v) for v in value)), None)
    if value is None or isinstance(value, str) and _OVERRIDE_TEXT.fullmatch(value) or plain_value(value):
        return None
    return f"{excerpt(value)} is not a plain value"


def registry_engine_arg_problem(name: str, value: Any) -> str | None:
    """Why an untrusted registry entry's (or pool class's) engine arguments may not set `name` to `value`."""
    if name == "hf_overrides":
        return _override_problem(value) if isinstance(value, dict) else "a mapping of config fields"
    if name == "load_format":
        return None if plain_value(value) else f"{excerpt(value)} is not a plain word"
    if name in CASE_ENGINE_ARGS or name in CASE_NESTED_ENGINE_ARGS:
        return case_engine_arg_problem(name, value)
    return ("names a model, tokenizer, remote code, path, class or plugin, or is not an engine argument a stranger's "
            f"registry may set (those of a case, and {', '.join(sorted(REGISTRY_DATA_ENGINE_ARGS))})")


def model_entry_problems(entry: ModelEntry) -> list[tuple[str, str]]:
    """(field, problem) for each value of an untrusted registry entry that could import code or read a path."""
    problems = [(f"{group}.{arg}", problem)
                for group, args in (("engine_args", entry.engine_args), ("hub_engine_args", entry.hub_engine_args))
                for arg, value in args.items() if (problem := registry_engine_arg_problem(arg, value))]
    if entry.hub_id is not None and (not _HUB_ID.fullmatch(entry.hub_id) or ".." in entry.hub_id):
        problems.append(("hub_id", f"{excerpt(entry.hub_id)} is not a hub id (org/name): no path"))
    if entry.tiny is not None and not plain_value(entry.tiny):
        problems.append(("tiny", f"{excerpt(entry.tiny)} is not a builder's name"))
    if entry.draft is not None:
        if entry.draft.method in CODE_LOADING_DRAFT_METHODS or not plain_value(entry.draft.method):
            problems.append(("draft.method", f"{excerpt(entry.draft.method)} makes vLLM import the draft as code"))
        problems += [(f"draft.config.{name}", problem) for name, value in entry.draft.config.items()
                     if (problem := speculative_field_problem(name, value))]
    return problems


def pool_class_problems(gpu_class: GpuClass) -> list[tuple[str, str]]:
    """(field, problem) for each engine default of an untrusted pool class that could import code or read a path."""
    return [(f"engine_defaults.{arg}", problem) for arg, value in gpu_class.engine_defaults.items()
            if (problem := registry_engine_arg_problem(arg, value))]


def is_builtin(path: Path, builtin_dir: Path) -> bool:
    """Whether `path` is a file of the built-in case folder (trusted: it ships with kvmatrix)."""
    return Path(path).resolve().parent == Path(builtin_dir).resolve()
