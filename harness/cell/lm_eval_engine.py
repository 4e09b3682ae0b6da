"""The accuracy phase of a cell: lm-eval on the cell's own, already-built `vllm.LLM` (one engine per cell, so the
accuracy belongs to exactly the configuration the probe recorded), with per-sample scores for paired comparison.

Runs inside the cell process (harness/cell/main.py); lm_eval is imported only there and only for accuracy cases.
"""

from __future__ import annotations

import os
from typing import Any

from lm_eval.api.model import LM

from kvmatrix.harness.record.types import AccuracyResult


class EngineLM(LM):
    """lm-eval's model interface over a live engine: greedy generate_until, which is what exact-match tasks use.
    Greedy because a paired comparison must compare configurations, not sampling noise."""

    def __init__(self, llm: Any):
        super().__init__()
        self.llm = llm
        self.tokens: dict[tuple[str, int], list[int]] = {}  # (task, doc_id) → generated token ids

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from vllm import SamplingParams

        params = []
        for request in requests:
            kwargs = request.args[1]
            until = kwargs.get("until") or []
            params.append(SamplingParams(temperature=0.0, max_tokens=kwargs.get("max_gen_toks", 256),
                                         stop=[until] if isinstance(until, str) else list(until)))
        outputs = self.llm.generate([r.args[0] for r in requests], params, use_tqdm=False)
        for request, output in zip(requests, outputs, strict=True):
            self.tokens[(request.task_name, request.doc_id)] = list(output.outputs[0].token_ids)
        return [o.outputs[0].text for o in outputs]

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("kvmatrix evaluates generate_until tasks only")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("kvmatrix evaluates generate_until tasks only")


def evaluate(llm: Any, spec: dict[str, Any]) -> AccuracyResult:
    """Score the engine on `spec['task']`: the aggregate metric and, in doc order, each sample's score and tokens.
    `spec`: task, metric (`name,filter`), limit, num_fewshot, include_path (folders of local task YAMLs)."""
    # Local tasks read local files; a hub task (gsm8k) only runs where the case allows hub access.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1" if spec.get("offline", True) else "0")
    import lm_eval
    from lm_eval.tasks import TaskManager

    lm = EngineLM(llm)
    tasks = TaskManager(include_path=spec.get("include_path"), include_defaults=spec.get("include_defaults", True))
    results = lm_eval.simple_evaluate(
        model=lm, tasks=[spec["task"]], limit=spec.get("limit"), num_fewshot=spec.get("num_fewshot"),
        task_manager=tasks, log_samples=True,
        bootstrap_iters=0,  # the harness computes its own (paired) intervals
    )
    task, metric = spec["task"], spec["metric"]
    name, _, filter_name = metric.partition(",")
    samples = sorted(
        (s for s in results["samples"][task] if s.get("filter", "none") == (filter_name or "none")),
        key=lambda s: s["doc_id"],
    )
    return {
        "task": task,
        "metric": metric,
        "score": float(results["results"][task][metric]),
        "n": len(samples),
        "doc_ids": [s["doc_id"] for s in samples],
        "samples": [float(s[name]) for s in samples],
        "tokens": [lm.tokens.get((task, s["doc_id"]), []) for s in samples],
    }
