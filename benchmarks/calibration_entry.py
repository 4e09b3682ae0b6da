"""A run folder's entry for harness/judge/calibration.yaml: what its clean pairs measured, per kind of numerics.

    python benchmarks/calibration_entry.py RUN_DIR [RUN_DIR ...] [--fp8-weights MODEL ...] [--source TEXT]

Clean pairs are the passing cells' comparisons: with their oracle (the teacher-forced decode, or the positions
decoded under the same context where no decode was forced), a draft cell with its no-draft twin, and a cell with
its model's bf16 reference (`against: reference`, teacher-forced on the reference's tokens or under the same
context likewise). Each is keyed as harness/judge/allowances.py keys an allowance:
the KV cache as the layers resolved it, the target's weights, whether a draft ran. The records are read as judged
in their folder: judge a copy again first (`kvmatrix rejudge COPY`) to count the pairs today's rules compare.
benchmarks/calibration.py prints its clean run's entry with this; a default matrix run on a GPU class gives one too.

`--fp8-weights MODEL`: a model whose weights are FP8, for records made before the probe recorded the loaded
weights' dtypes (`weight_dtypes`); such a record of another model counts as bf16 weights.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from kvmatrix.harness.judge.allowances import kv_kind, weights_kind
from kvmatrix.harness.record.files import RunDir


def passed(record: dict) -> bool:
    """A record whose pairs a run folder counts as clean: one that passed (a failure may be vLLM's)."""
    return record.get("verdict") == "pass"


def clean_pairs(record: dict, clean: Callable[[dict], bool] = passed) -> Iterator[tuple[str, bool, dict[str, Any]]]:
    """(against, draft, numbers) of each comparison a clean record made: with its oracle, a draft's with its
    no-draft twin (both judged by the allowance against an oracle), with its model's bf16 reference (`reference`,
    or `reference, same-context` where the cell was not forced on the reference's tokens)."""
    if not clean(record):
        return
    draft = bool((record.get("axes") or {}).get("speculative"))
    d = record.get("differential") or {}
    compared = record.get("reference") or {}
    forced = (compared.get("teacher_forced") or {}).get("cell")
    for against, is_draft, numbers in (
            ("oracle", draft, (d.get("teacher_forced") or {}).get("cell") or d.get("shared_context")),
            ("oracle", True, (record.get("speculative") or {}).get("shared_context")),
            ("reference" if forced else "reference, same-context", draft, forced or compared.get("shared_context"))):
        if numbers and numbers.get("positions"):
            yield against, is_draft, numbers


def clean_lines(runs: Iterable[RunDir], fp8_weight_models: Collection[str] = (),
                clean: Callable[[dict], bool] = passed) -> list[dict[str, Any]]:
    """Per kind of numerics (KV cache, weights, draft, against its oracle or the bf16 reference) the largest typical
    distance and flip rate of a clean pair in the runs (`clean`: which records are, by default those that passed),
    the most positions one pair scored, and the cell that gave the largest distance (the first in cell order where
    several did): the `clean` lines of an entry."""
    worst: dict[tuple, dict[str, Any]] = {}
    records = sorted((r for run in runs for r in run.records()), key=lambda r: r["cell_id"])
    for record in records:
        weights = weights_kind(record) or ("fp8" if record.get("model") in fp8_weight_models else "bf16")
        for against, draft, numbers in clean_pairs(record, clean):
            line = worst.setdefault((kv_kind(record), weights, draft, against),
                                    {"typical": 0.0, "flip_rate": 0.0, "positions": 0, "cells": ""})
            if not line["cells"] or numbers["typical"] > line["typical"]:
                line.update(typical=numbers["typical"], cells=record["cell_id"])
            line["flip_rate"] = max(line["flip_rate"], numbers.get("flip_rate") or 0.0)
            line["positions"] = max(line["positions"], numbers["positions"])
    return [{"kv": kv, "weights": w, "draft": draft, **_against(a), **values}
            for (kv, w, draft, a), values in sorted(worst.items())]


def _against(against: str) -> dict[str, str]:
    """A clean line's `against` and `measured` keys (calibration.yaml; an oracle is the default)."""
    if against == "oracle":
        return {}
    return {"against": "reference", "measured": "same-context"} if against.endswith("same-context") else \
        {"against": "reference"}


def measured_entry(runs: Iterable[RunDir], name: str, version: str | None, device: str, source: str,
                   fp8_weight_models: Collection[str] = (), clean: Callable[[dict], bool] = passed) -> str:
    """The runs' entry for harness/judge/calibration.yaml, as YAML (one flow-style line per kind)."""
    entry = [{"class": name, "vllm": version, "device": device, "source": source,
              "clean": clean_lines(runs, fp8_weight_models, clean)}]
    return yaml.safe_dump(entry, sort_keys=False, width=118, default_flow_style=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="run folders of one class and release (their records as "
                                                           "judged there)")
    parser.add_argument("--fp8-weights", action="append", default=[], metavar="MODEL",
                        help="a model with FP8 weights, for records that do not say their weights' dtype")
    parser.add_argument("--source", help="where the records came from (default: the run folder)")
    args = parser.parse_args()
    runs = [RunDir(folder) for folder in args.runs]
    ran = {(r["gpu_class"], r.get("vllm_version")) for run in runs for r in run.records() if r["status"] != "skipped"}
    if len(ran) != 1:
        sys.exit(f"{', '.join(map(str, args.runs))}: records of {len(ran)} classes and releases ({sorted(ran)}), "
                 "an entry is one's")
    [(name, version)] = ran
    print(measured_entry(runs, name, version, "cpu" if name.startswith("cpu-") else "cuda",
                         args.source or ", ".join(map(str, args.runs)), args.fp8_weights), end="")


if __name__ == "__main__":
    main()
