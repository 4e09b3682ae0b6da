"""Size: a 10,000-cell synthetic matrix through the pure-Python path (case files → cells → judged records →
Markdown, HTML and JUnit), and a 100-run history loaded back from SQLite. No vLLM: records are synthesized in
the shape the cell process writes. Prints each stage's time (goal: a couple of seconds for the matrix).

    python benchmarks/matrix_size.py [--cases 25] [--classes 4] [--runs 100] [--run-cells 300]

A matrix cell here is one (cell, GPU class) pair, as the report's table has them: `--cases` case files of 100
cells each, every cell on `--classes` GPU classes (defaults: 25 × 100 × 4 = 10,000).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import yaml

from kvmatrix.harness.judge.verdict import judge
from kvmatrix.harness.results import history
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import CASES_DIR, load_cases, load_models, load_pool
from kvmatrix.reports import html, html_details, junit, markdown

CLASSES = ("L4", "A100", "H100", "H200", "B200", "RTX-PRO-6000")
STATUSES = ("ok", "ok", "ok", "ok", "ok", "ok", "crash", "timeout")  # mostly healthy, as a nightly is


def synthetic_case(i: int, classes: list[str]) -> dict:
    """100 cells: 5 dtypes × 5 skip lists × 2 drafts × 2 backends, minus 4 excluded, plus 4 included."""
    return {
        "description": f"synthetic case {i}",
        "model": "llama",
        "gpus": classes,
        "matrix": {
            "kv_cache_dtype": ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"],
            "kv_cache_dtype_skip_layers": [[], ["0"], ["3"], ["0", "3"], ["1", "2"]],
            "speculative": [None, "llama-dflash"],
            "attention_backend": [None, "FLASH_ATTN"],
            "exclude": [{"kv_cache_dtype": "auto", "kv_cache_dtype_skip_layers": ["0", "3"]}],
            "include": [{"kv_cache_dtype": d, "attention_backend": "TRITON_ATTN"}
                        for d in ("auto", "bfloat16", "fp8", "fp8_e5m2")],
        },
        "skip": [{"when": {"gpu": "RTX*", "speculative": "llama-dflash"}, "reason": "no draft on RTX"}],
        "expect": [
            {"crash": False, "when": {"kv_cache_dtype": ["auto", "bfloat16", "fp8*"]}},
            {"when": {"kv_cache_dtype": "fp8*"}, "layers": {"select": "not_skipped", "kv_cache_dtype": "fp8*"}},
            {"when": {"kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": ["0", "3"]},
             "layers": {"select": "skipped", "spec_dtype": "bfloat16"},
             "page_size_ratio": {"of": "skipped", "to": "not_skipped", "equals": 2}},
            {"when": {"gpu": {"compute_capability": "<9.0"}, "kv_cache_dtype": "fp8_e5m2"},
             "crash": {"signature": "dtype_mismatch_at_decode", "link": "https://example.org/issue/1"}},
        ],
    }


def synthetic_record(cell, gpu_name: str, n: int, run_id: str) -> dict:
    """A record as the runner writes it: resolved layers, KV groups, builders, timings, a status."""
    status = STATUSES[n % len(STATUSES)]
    kv = cell.axes["kv_cache_dtype"]
    skip = set(cell.axes["kv_cache_dtype_skip_layers"])
    layers = [{"name": f"model.layers.{i}.self_attn.attn", "index": i, "role": "target",
               "kv_cache_dtype": "auto" if str(i) in skip or kv == "auto" else kv, "backend": "FLASH_ATTN",
               "spec_dtype": "bfloat16" if str(i) in skip or kv in ("auto", "bfloat16") else "uint8",
               "page_size_bytes": 32768 if str(i) in skip else 16384, "group": int(str(i) in skip)}
              for i in range(4)]
    groups = [{"group": g, "layer_names": [la["name"] for la in layers if la["group"] == g], "block_size": 16,
               "page_size_bytes": 16384 * (g + 1), "dtype": "bfloat16"} for g in (0, 1)]
    builders = [{"group": g["group"], "backend": "FLASH_ATTN", "layer_names": g["layer_names"],
                 "builder": {"q_data_type_prefill": "torch.bfloat16", "q_data_type_decode": "torch.bfloat16"}}
                for g in groups]
    return {
        "cell_id": cell.cell_id, "case": cell.case.name, "model": cell.model, "axes": cell.axes,
        "gpu_class": gpu_name, "emulated_from": None, "run_id": run_id, "vllm_version": "0.32.0",
        "status": status, "phase": "done" if status == "ok" else "generate",
        "signature": "dtype_mismatch_at_decode" if status == "crash" else None,
        **({} if status == "ok" else {"error_tail": f"{status} in phase generate"}),  # a str where there is one
        "layers": layers, "kv_groups": groups, "attn_groups": builders,
        "timings": {"import_s": 3.1, "init_s": 8.2 + n % 7, "generate_s": 0.1, "total_s": 11.4 + n % 7},
        "log": f"logs/{gpu_name}--{cell.cell_id}.log", "finished_at": f"2026-11-{1 + n % 28:02d}T02:00:00Z",
    }


@contextmanager
def stage(name: str, times: dict[str, float]):
    started = time.perf_counter()
    yield
    times[name] = time.perf_counter() - started
    print(f"  {name:<34} {times[name]:7.3f} s", flush=True)


def matrix_benchmark(scratch: Path, n_cases: int, n_classes: int) -> float:
    cases_dir = scratch / "cases"
    cases_dir.mkdir()
    for name in ("_models.yaml", "_pool.yaml"):
        shutil.copy(CASES_DIR / name, cases_dir / name)
    classes = list(CLASSES[:n_classes])
    for i in range(n_cases):
        (cases_dir / f"synthetic-{i:03d}.yaml").write_text(yaml.safe_dump(synthetic_case(i, classes)))
    times: dict[str, float] = {}
    with stage("load case files", times):
        cases = load_cases(sorted(cases_dir.glob("[!_]*.yaml")))
        models, pool = load_models(cases_dir), load_pool(cases_dir)
    with stage("expand", times):
        cells = expand_all(cases, models, pool)
    records = []
    with stage("judge (skip rules + expectations)", times):
        for cell in cells:
            for gpu_name in cell.gpu_classes:
                context = cell.context(gpu_name, pool[gpu_name], "0.32.0", False)
                record = synthetic_record(cell, gpu_name, len(records), "synthetic")
                if reason := cell.skip_reason(context):
                    record.update(status="skipped", verdict="skip", reason=reason, expectations=[])
                else:
                    judged = judge(record, cell.case.expect, context)
                    record.update(verdict=judged.verdict, reason=judged.reason, expectations=judged.results)
                records.append(record)
    with stage("render Markdown", times):
        markdown.render(records, "synthetic")
    with stage("render HTML (grids, details JSON, list)", times):
        page = html.render(records, "synthetic")
    print(f"  (HTML page: {len(page.encode()) / 2**20:.1f} MiB, of it the details JSON "
          f"{len(html_details.details_json(records).encode()) / 2**20:.1f} MiB)")
    with stage("render JUnit", times):
        junit.render(records)
    judging = times["judge (skip rules + expectations)"]
    total = sum(times.values())
    print(f"matrix: {len(cells)} cells × {n_classes} classes = {len(records)} matrix cells: load, expand and "
          f"render {total - judging:.2f} s (goal: a couple of seconds), judging {judging:.2f} s, all {total:.2f} s")
    return total


def history_benchmark(scratch: Path, n_runs: int, run_cells: int) -> float:
    cases_dir = scratch / "cases"
    cells = expand_all(load_cases(sorted(cases_dir.glob("[!_]*.yaml"))), load_models(cases_dir),
                       load_pool(cases_dir))[:run_cells]
    db = history.open_db(scratch / "history.sqlite")
    started = time.perf_counter()
    for r in range(n_runs):
        records = [synthetic_record(c, "H200", r + i, f"night-{r:03d}") for i, c in enumerate(cells)]
        for rec in records:
            rec.update(verdict="pass" if rec["status"] == "ok" else "fail", reason="", expectations=[],
                       finished_at=f"2026-{1 + r // 28 % 12:02d}-{1 + r % 28:02d}T02:00:00Z")
        history.import_records(db, records)
    print(f"  (setup: importing {n_runs} runs × {len(cells)} records: {time.perf_counter() - started:.2f} s)")
    times: dict[str, float] = {}
    with stage("runs overview (runs_frame)", times):
        runs = history.runs_frame(db)
    with stage("latest run vs its previous run", times):
        latest = history.latest_run(db)
        previous = history.previous_run(db, latest, "H200")
        history.records_of(db, latest, "H200"), history.records_of(db, previous, "H200")
    with stage("every run's records (records_of)", times):
        n = sum(len(history.records_of(db, run_id)) for run_id in runs["run_id"])
    total = sum(times.values())
    print(f"history: {len(runs)} runs, {n} records, total {total:.2f} s")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=25)
    parser.add_argument("--classes", type=int, default=4, choices=range(1, len(CLASSES) + 1))
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--run-cells", type=int, default=300)
    args = parser.parse_args()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cores")
    scratch = Path(tempfile.mkdtemp(prefix="kvm-size-"))
    try:
        matrix_benchmark(scratch, args.cases, args.classes)
        history_benchmark(scratch, args.runs, args.run_cells)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
