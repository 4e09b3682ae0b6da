"""The harness's own reading and writing, side by side in one invocation: every record of the fixture folders
(tests/fixtures/records/) encoded as a record file holds it (`json_text`: one field a line, each value through
the C encoder) and as `json.dumps(indent=1)` wrote it before (Python's pure-Python encoder); and the shipped case
folder's models, pool and cases loaded `--loads` times in one process (what a test process or a pytest front end
does), each data file's YAML parsed once for the same text against parsed every time. Rounds alternate which side
goes first; prints each side's CPU seconds and the ratio. No vLLM.

    PYTHONPATH=. .venv/bin/python benchmarks/record_io.py [--rounds 3] [--loads 20]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from kvmatrix.harness.record.files import json_text
from kvmatrix.matrix import data_file
from kvmatrix.matrix.load import case_files, load_cases, load_models, load_pool

RECORDS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "records"


def cpu_seconds(work: Callable[[], object]) -> float:
    started = time.process_time()
    work()
    return time.process_time() - started


def records() -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(RECORDS.glob("*/*.json"))]


def load_shipped(times: int) -> None:
    for _ in range(times):
        load_cases(case_files())
        load_models()
        load_pool()


def compare(name: str, rounds: int, new: Callable[[], object], old: Callable[[], object]) -> None:
    times: dict[str, float] = {"new": 0.0, "old": 0.0}
    for i in range(rounds):
        for side in (("new", "old") if i % 2 == 0 else ("old", "new")):
            times[side] += cpu_seconds(new if side == "new" else old)
    print(f"{name}: now {times['new']:.2f} CPU-s, before {times['old']:.2f} CPU-s "
          f"({rounds} rounds): before / now = {times['old'] / times['new']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loads", type=int, default=20)
    args = parser.parse_args()
    held = records()
    compare(f"{len(held)} records written as text", args.rounds,
            lambda: [json_text(r) for r in held],
            lambda: [json.dumps(r, indent=1, sort_keys=False, default=str) for r in held])
    cached = data_file._parsed

    def uncached() -> None:
        data_file._parsed = cached.__wrapped__  # the same parse without the cache: every call parses
        try:
            load_shipped(args.loads)
        finally:
            data_file._parsed = cached

    def fresh_cache() -> None:
        cached.cache_clear()  # each round's first load parses, as a new process's does
        load_shipped(args.loads)

    compare(f"the shipped cases, models and pool loaded {args.loads} times", args.rounds, fresh_cache, uncached)


if __name__ == "__main__":
    main()
