"""Teacher-forced decodes in the cell's own engine, after its free-running generation (harness/judge/
teacher_forced.py compares them):

- a compared cell decodes its oracle's greedy tokens, one forced step at a time, in the same batch the oracle
  generated them in (its prompts in order, or its workload's requests on their runtime path): every position is
  then scored under the oracle's very context, through this cell's decode path (compiled code, graph replays);
- a cell compared with its model's bf16 reference decodes the reference's greedy tokens the same way, a second
  forced decode (`forced_reference`; where the reference is its oracle, the first serves both and the record
  says so), so every KV dtype, backend and mode is compared with the same thing (harness/judge/reference.py);
- an oracle decodes its own greedy tokens again in another batch (its prompts in reverse order, each beside a
  request of its own that ends at another step, so the batch shrinks as it goes): how far the configuration's own
  numerics move with the batch is its noise floor.

The forcing is vLLM's own trace replay or a logits processor, as the release and device take it
(harness/vllm_compat/forcing.py; the runner picks it: `spec.forcing`); the logprobs recorded are vLLM's raw ones.
Where vLLM refuses the mechanism at start, the engine starts again without it and the cell runs free only, saying
why: the forcing is the harness's instrument, never the cell's failure.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvmatrix.harness.cell import workloads
from kvmatrix.harness.cell.spec import CellSpec
from kvmatrix.harness.record.types import CellOutput, ForcedRun
from kvmatrix.harness.vllm_compat import CUDA_ERROR_MARKERS
from kvmatrix.harness.vllm_compat.forcing import (
    forced_request_args,
    forcing_engine_args,
    forcing_refused,
    refused_forcing,
)

MESSAGE_CAP = 500

NOISE_FLOOR_BATCH = "the prompts in reverse order, each beside a request of its own ending at another step"


def _missing(spec: CellSpec, result: CellOutput, why: str) -> None:
    """The cell's forced decodes will not run: their record fields (`forced`, `forced_reference`, `noise_floor`)
    say why."""
    if spec.forced_tokens is not None:
        result["forced"] = {"missing": why}
    if spec.reference_of is not None:
        result["forced_reference"] = {"of": spec.reference_of, "missing": why}
    if spec.noise_floor:
        result["noise_floor"] = {"of": "itself", "missing": why}


def _forces(spec: CellSpec) -> bool:
    """Whether the cell has any forced decode to run: its oracle's tokens, its reference's, or its own."""
    return spec.forced_tokens is not None or spec.reference_tokens is not None or spec.noise_floor


def start_with_forcing(start: Callable[[dict[str, Any]], Any], spec: CellSpec, version: str | None,
                       result: CellOutput) -> Any:
    """The cell's engine (`start(engine_args)`): with the forcing mechanism added where the cell decodes forced
    (the record's `engine_args` stay the configuration's own). Where vLLM cannot or will not take it, the record
    says why and the engine runs free only."""
    if not _forces(spec):
        if spec.reference_of is not None:  # a reference that generated nothing this cell could decode
            result["forced_reference"] = _reference_tokens(result, None, None, spec, 1)
        return start(spec.engine_args)
    refused = forcing_refused(spec.engine_args, spec.forcing, version)
    if refused is not None or spec.forcing is None:
        _missing(spec, result, refused or "no forcing method")
        return start(spec.engine_args)
    try:
        return start({**spec.engine_args, **forcing_engine_args(spec.forcing)})
    except Exception as exc:
        said = _messages(exc)
        if not refused_forcing(said):
            raise
        traceback.print_exc()
        _missing(spec, result, f"vLLM refused the forced decode ({spec.forcing}) at start: {said[:MESSAGE_CAP]}")
        return start(spec.engine_args)


def _messages(exc: BaseException) -> str:
    """The exception's message and its causes' (what vLLM said, not the frames it passed through)."""
    said: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(said) < 5:
        said.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    return " <- ".join(said)


def wants_forced_decode(spec: CellSpec, result: CellOutput) -> bool:
    """Whether the cell has a forced decode to run (none was refused at start)."""
    decodes = (result.get("forced"), result.get("forced_reference"), result.get("noise_floor"))
    refused = any("missing" in (decode or {}) for decode in decodes)
    return _forces(spec) and not refused


def forced_decode(result: CellOutput, vllm: Any, llm: Any, spec: CellSpec) -> None:
    """The cell's forced decodes into its record: `forced` (its oracle's tokens), `forced_reference` (its model
    reference's) and/or `noise_floor` (its own). The free-running generation before them already took the same
    decode path: an exception here is the comparison's loss, recorded as its `missing`, not the cell's crash,
    except a CUDA error (its process is poisoned: the cell crashed)."""
    logprobs = spec.logprobs or 1
    if spec.forced_tokens is not None:
        tokens = spec.forced_tokens
        result["forced"] = _recorded(lambda: _oracle_tokens(result, vllm, llm, spec, tokens, logprobs))
    if spec.reference_of is not None:
        result["forced_reference"] = _reference_tokens(result, vllm, llm, spec, logprobs)
    if spec.noise_floor:
        result["noise_floor"] = _recorded(lambda: _noise_floor(result, vllm, llm, spec, logprobs))


def _recorded(decode: Callable[[], ForcedRun]) -> ForcedRun:
    try:
        return decode()
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        if any(marker in text for marker in CUDA_ERROR_MARKERS):
            raise
        traceback.print_exc()
        return {"missing": f"the forced decode raised {text[:MESSAGE_CAP]}"}


def _reference_tokens(result: CellOutput, vllm: Any, llm: Any, spec: CellSpec, logprobs: int) -> ForcedRun:
    """The model reference's tokens decoded forced, as the oracle's are; where the reference is the cell's oracle,
    the decode of the oracle's tokens is this one (said, not repeated)."""
    of = spec.reference_of
    assert of is not None, "only a cell with a model reference decodes its tokens"
    if of == spec.forced_of:
        return {"of": of, "decoded_as": "forced"}
    tokens = spec.reference_tokens
    if tokens is None:
        return {"of": of, "missing": "the reference recorded no tokens for this cell in this run folder"}
    run = _recorded(lambda: _oracle_tokens(result, vllm, llm, replace(spec, forced_of=of), tokens, logprobs))
    return {**run, "of": of, "batch": "as the reference's"}


def _params(vllm: Any, spec: CellSpec, max_tokens: int, logprobs: int | None, forced: list[int] | None) -> Any:
    assert spec.forcing is not None, "a forced decode runs only with a forcing method"
    return vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs,
                               **(forced_request_args(spec.forcing, forced) if forced else {}))


def _oracle_tokens(result: CellOutput, vllm: Any, llm: Any, spec: CellSpec, tokens: list[list[int]],
                   logprobs: int) -> ForcedRun:
    run: ForcedRun = {"of": spec.forced_of or "the oracle", "batch": "as the oracle's"}
    if spec.workload is None:
        if len(tokens) != len(spec.prompts):
            return {**run, "missing": f"{len(tokens)} oracle sequences for {len(spec.prompts)} prompts"}
        params = [_params(vllm, spec, len(t), logprobs, t) for t in tokens]
        got = workloads.outputs_of(llm.generate(spec.prompts, params, use_tqdm=False), logprobs)
    else:
        got, facts = workloads.run_workload(vllm, llm, spec.workload, result, spec.max_tokens, logprobs,
                                            forced=tokens, forcing=spec.forcing)
        if not got:
            return {**run, "missing": f"workload {spec.workload['name']}: {facts.get('detail')}"}
        run["batch"] = f"the {spec.workload['name']} workload's, as this cell's own"
    return {**run, "tokens": got["tokens"], "logprobs": got.get("logprobs", [])}


def _noise_floor(result: CellOutput, vllm: Any, llm: Any, spec: CellSpec, logprobs: int) -> ForcedRun:
    """The oracle's own greedy tokens decoded again, forced, in another batch: the prompts reversed, each beside
    an unforced request of the same prompt that stops after a share of the tokens (the batch shrinks step by
    step, so the decode steps run at other batch sizes than the oracle's free run)."""
    own = result.get("tokens") or []
    n = len(spec.prompts)
    if len(own) != n:
        return {"of": "itself", "missing": f"{len(own)} sequences for {n} prompts"}
    order = list(reversed(range(n)))
    prompts = [spec.prompts[i] for i in order] + list(spec.prompts)
    params = [_params(vllm, spec, len(own[i]), logprobs, own[i]) for i in order]
    params += [_params(vllm, spec, max(1, (k + 1) * spec.max_tokens // (n + 1)), None, None) for k in range(n)]
    got = workloads.outputs_of(llm.generate(prompts, params, use_tqdm=False)[:n], logprobs)
    back = {i: k for k, i in enumerate(order)}
    return {"of": "itself", "batch": NOISE_FLOOR_BATCH,
            "tokens": [got["tokens"][back[i]] for i in range(n)],
            "logprobs": [got.get("logprobs", [])[back[i]] for i in range(n)] if got.get("logprobs") else []}
