"""The runtime paths a cell's generation takes (the `workload` axis, matrix/axes.py), run in the cell's engine, and
the same prompts run plainly in an oracle's engine (its `references`) for the differential rule.

- plain: the case's prompts in one batch (what every cell generated before the axis).
- shared_prefix: two requests, one after the other, whose common prefix covers 2 KV blocks and 8 tokens; the
  second reuses the first's cached blocks (prefix caching on). Reached when vLLM reports >= 2 blocks cached.
- chunked_prefill: one prompt longer than 3 x `max_num_batched_tokens`, so its later chunks read the KV of the
  earlier ones. Reached when vLLM kept chunked prefill on with that batch size.
- preemption: more sequences than the KV cache holds (each one block of prompt that decodes into a second block),
  so the scheduler preempts and recomputes some. Reached when vLLM's preemption counter moved.

Prompts are token ids drawn with a fixed seed from the model's non-special tokens; their lengths depend only on
the plan's parameters and the KV block size the engine resolved (the same in a cell and its oracle: the
differential rule checks that first), so an oracle regenerates exactly the cell's prompts. The oracle runs each
request alone after emptying the prefix cache (no reuse, no chunking: its batch is vLLM's default, no preemption:
its KV cache is the class's usual size), the preemption batch at once.
"""

from __future__ import annotations

import random
from typing import Any, TypedDict

from kvmatrix.harness import vllm_compat as compat
from kvmatrix.harness.record.types import CellOutput, Reference, WorkloadRun
from kvmatrix.harness.vllm_compat.forcing import forced_request_args

WORKLOAD_SEED = 34
SUFFIX_TOKENS = 8


def token_pool(llm: Any) -> list[int]:
    """Ordinary token ids of the engine's tokenizer (no special tokens), in id order."""
    tokenizer = llm.get_tokenizer()
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return [i for i in range(len(tokenizer)) if i not in special]


def _draw(pool: list[int], n: int, rng: random.Random) -> list[int]:
    return [rng.choice(pool) for _ in range(n)]


def workload_prompts(params: dict[str, Any], block_size: int, pool: list[int], max_tokens: int = 8
                     ) -> list[list[int]]:
    """The token-id prompts of one workload (params: the plan's, harness/run/task/spec.py) for a generation of
    `max_tokens` tokens."""
    rng = random.Random(f"{WORKLOAD_SEED}-{params['name']}")
    name = params["name"]
    if name == "shared_prefix":
        prefix = _draw(pool, 2 * block_size + SUFFIX_TOKENS, rng)
        return [prefix + _draw(pool, SUFFIX_TOKENS, rng), prefix + _draw(pool, SUFFIX_TOKENS, rng)]
    if name == "chunked_prefill":
        return [_draw(pool, 3 * params["chunk_tokens"] + 7, rng)]
    if name == "preemption":
        # One block; decoding `max_tokens` tokens (2 in probe-only mode) crosses into the second.
        length = max(1, block_size - max(1, max_tokens // 2))
        return [_draw(pool, length, rng) for _ in range(params["sequences"])]
    raise ValueError(f"unknown workload {name!r}")


def block_size_of(record: CellOutput) -> int | None:
    """The KV block size the engine resolved (the largest of its KV-cache groups)."""
    sizes = [size for g in record.get("kv_groups") or [] if (size := g.get("block_size"))]
    return max(sizes) if sizes else None


def preemptions(llm: Any) -> int | None:
    """vLLM's count of preempted requests so far (None where the engine keeps no metrics)."""
    name = compat.for_version(compat.PREEMPTION_METRICS, None)[0]
    try:
        metrics = llm.get_metrics()
    except Exception:
        return None
    values = [getattr(m, "value", None) for m in metrics if getattr(m, "name", None) == name]
    return int(sum(v for v in values if v is not None)) if values else None


class Generation(TypedDict, total=False):
    """What requests generated, one entry per request in order (the record's tokens, texts and logprobs)."""

    tokens: list[list[int]]
    texts: list[str]
    cached_tokens: list[int | None]
    logprobs: list[list[dict[str, float]]]


def outputs_of(outputs: list[Any], logprobs: int | None) -> Generation:
    """tokens, texts and (when asked) each position's chosen-token and top logprobs of request outputs."""
    data: Generation = {
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "texts": [o.outputs[0].text for o in outputs],
        "cached_tokens": [getattr(o, "num_cached_tokens", None) for o in outputs],
    }
    if logprobs:
        data["logprobs"] = [_logprobs(o.outputs[0]) for o in outputs]
    return data


def _logprobs(completion: Any) -> list[dict[str, float]]:
    """Per generated position: {token id: logprob} for the top tokens and the chosen one."""
    out = []
    for position in completion.logprobs or []:
        out.append({str(token): round(float(getattr(lp, "logprob", lp)), 5) for token, lp in position.items()})
    return out


def run_workload(vllm: Any, llm: Any, params: dict[str, Any], record: CellOutput, max_tokens: int,
                 logprobs: int | None, forced: list[list[int]] | None = None, forcing: str | None = None
                 ) -> tuple[Generation, WorkloadRun]:
    """(what the generation gave: tokens, texts, logprobs, cached tokens; the workload's facts: prompt lengths,
    block size, whether its path was reached and why). `forced`: each request's tokens to emit, one forced step at
    a time by the `forcing` method (harness/cell/forced.py), instead of its greedy ones."""
    block = block_size_of(record)
    runtime = record.get("runtime") or {}
    facts: WorkloadRun = {"name": params["name"], "block_size": block}
    if block is None:
        return {}, {**facts, "reached": False, "detail": "no KV block size recorded"}
    prompts = workload_prompts(params, block, token_pool(llm), max_tokens)
    facts["prompt_tokens"] = [len(p) for p in prompts]
    limit = runtime.get("max_model_len")
    if limit is not None and max(map(len, prompts)) + max_tokens > limit:
        return {}, {**facts, "reached": False,
                    "detail": f"a prompt of {max(map(len, prompts))} tokens does not fit max_model_len {limit}"}
    requests = [{"prompt_token_ids": p} for p in prompts]
    if forced is not None and len(forced) != len(requests):
        return {}, {**facts, "reached": False, "detail": f"{len(forced)} forced sequences for {len(requests)} requests"}
    sampling = _sampling(vllm, len(requests), max_tokens, logprobs, forced, forcing)
    name = params["name"]
    if name == "shared_prefix":
        got = outputs_of([o for r, s in zip(requests, sampling, strict=True)
                          for o in llm.generate([r], s, use_tqdm=False)], logprobs)
        cached = got["cached_tokens"][1] or 0
        reached = cached >= 2 * block
        detail = f"second request reused {cached} cached tokens ({cached // block} blocks of {block})"
        if not runtime.get("enable_prefix_caching", True):
            detail += "; vLLM turned prefix caching off"
    elif name == "chunked_prefill":
        got = outputs_of(llm.generate(requests, sampling, use_tqdm=False), logprobs)
        batch = runtime.get("max_num_batched_tokens")
        chunked = bool(runtime.get("enable_chunked_prefill"))
        reached = chunked and batch is not None and len(prompts[0]) > batch
        detail = (f"prompt of {len(prompts[0])} tokens, max_num_batched_tokens {batch}, chunked prefill "
                  + ("on" if chunked else "off"))
    else:  # preemption
        before = preemptions(llm)
        got = outputs_of(llm.generate(requests, sampling, use_tqdm=False), logprobs)
        after = preemptions(llm)
        count = None if before is None or after is None else after - before
        facts["preemptions"] = count
        reached = bool(count)
        detail = (f"{len(prompts)} sequences of {len(prompts[0])} tokens in {runtime.get('num_blocks')} KV blocks "
                  f"of {block}: {count if count is not None else 'unknown'} preemptions")
    return got, {**facts, "reached": reached, "detail": detail}


def _sampling(vllm: Any, count: int, max_tokens: int, logprobs: int | None, forced: list[list[int]] | None,
              forcing: str | None) -> list[Any]:
    """Each request's sampling parameters: greedy, or forced to given tokens."""
    if forced is None or forcing is None:
        return [vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs)] * count
    return [vllm.SamplingParams(temperature=0.0, max_tokens=len(tokens), ignore_eos=True, logprobs=logprobs,
                                **forced_request_args(forcing, tokens)) for tokens in forced]


def run_reference(vllm: Any, llm: Any, params: dict[str, Any], record: CellOutput, max_tokens: int,
                  logprobs: int | None) -> Reference:
    """A workload's prompts generated plainly in an oracle's engine: each request alone after the prefix cache is
    emptied (the preemption batch at once, in a KV cache that holds it)."""
    sampling = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs)
    block = block_size_of(record)
    if block is None:
        return {"missing": "no KV block size recorded"}
    prompts = workload_prompts(params, block, token_pool(llm), max_tokens)
    limit = (record.get("runtime") or {}).get("max_model_len")
    if limit is not None and max(map(len, prompts)) + max_tokens > limit:
        return {"missing": f"a prompt of {max(map(len, prompts))} tokens does not fit max_model_len {limit}"}
    requests = [{"prompt_token_ids": p} for p in prompts]
    if params["name"] == "preemption":
        llm.reset_prefix_cache()
        return {**outputs_of(llm.generate(requests, sampling, use_tqdm=False), logprobs), "block_size": block}
    outputs = []
    for request in requests:
        llm.reset_prefix_cache()
        outputs += llm.generate([request], sampling, use_tqdm=False)
    return {**outputs_of(outputs, logprobs), "block_size": block}
