"""Templates: the same real CPU cells run twice in one invocation, side by side, through `LocalExecutor` (warm workers
and their fresh-process confirmations, as `kvmatrix run` runs them):

  exec   every cell process and worker starts as a new interpreter that imports torch and vLLM (`--no-template`)
  fork   every one is forked from a template that imported them once (harness/run/process/template_client.py)

Prints each arm's wall, the ratio exec/fork, how many processes each started and how (the records'
`process_start`), and checks that both gave every cell the same verdict, resolved state and greedy tokens
(tests/isolation.py). Each arm runs in a fresh run folder on the shared caches, warmed first by one
unmeasured cell.

    python benchmarks/templates.py [-k PATTERN] [--isolation worker|process] [--jobs N] [--gpu CLASS [--emulate]]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import tempfile
from pathlib import Path

from warm_workers import print_differences, run_timed  # this folder is the script's first import path

from kvmatrix.harness.cli.selection import load_cells
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.paths import PACKAGE_ROOT
from kvmatrix.harness.run.session import open_session

ARMS = {"exec": False, "fork": True}  # arm -> fork_from_template


def run_arm(tasks, settings, arm: str, jobs: int, slot_env, scratch: Path) -> tuple[float, list[dict]]:
    arm_settings = dataclasses.replace(settings, run_dir=RunDir(scratch / arm), fork_from_template=ARMS[arm])
    return run_timed(tasks, arm_settings, arm, jobs, slot_env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", default="ct-llama", help="cell id substring or glob (default: ct-llama)")
    parser.add_argument("--isolation", default="worker", choices=("worker", "process"))
    parser.add_argument("--jobs", type=int, default=0, help="slots (default: the class's)")
    parser.add_argument("--gpu")
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--cache-dir", default=".cache")
    args = parser.parse_args()
    selection = argparse.Namespace(cases_dir=str(PACKAGE_ROOT / "cases"), case=None, k=args.k, cell=None)
    cells, _, _ = load_cells(selection)
    scratch = Path(tempfile.mkdtemp(prefix="kvm-templates-"))
    session = open_session(gpu=args.gpu, emulate=args.emulate, run_id="templates", runs_dir=scratch,
                           cache_dir=Path(args.cache_dir).resolve())
    if session.host.device != "cpu":
        parser.error("templates fork only on CPU classes")
    tasks = session.tasks(cells)
    session.build_models(tasks)
    slots = session.slots(args.jobs or 0)
    settings, jobs = dataclasses.replace(session.settings, isolation=args.isolation), slots.count
    print(f"{len(tasks)} cells of {session.gpu_name}, vLLM {settings.vllm_version}, isolation {args.isolation}, "
          f"{jobs} slot(s), {os.cpu_count()} cores, {platform.processor() or platform.machine()}", flush=True)
    run_arm(tasks[:1], settings, "exec", 1, slots.env, scratch / "warm-up")
    walls, records = {}, {}
    for arm in ARMS:
        walls[arm], records[arm] = run_arm(tasks, settings, arm, jobs, slots.env, scratch)
    report(walls, records)
    shutil.rmtree(scratch, ignore_errors=True)


def report(walls: dict[str, float], records: dict[str, list[dict]]) -> None:
    print("\n| arm | wall | cells run | cells by process start |\n|---|---|---|---|")
    for arm, wall in walls.items():
        ran = [r for r in records[arm] if r["verdict"] != "skip"]
        starts = {how: sum(r.get("process_start") == how for r in ran) for how in ("exec", "fork")}
        print(f"| {arm} | {wall:.1f} s | {len(ran)} | {starts['exec']} exec, {starts['fork']} fork |")
    print(f"exec/fork {walls['exec'] / walls['fork']:.2f}")
    print_differences(records["exec"], records["fork"], "both ways")


if __name__ == "__main__":
    main()
