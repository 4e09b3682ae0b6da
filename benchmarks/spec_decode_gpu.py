"""The speculative-decoding cases on a GPU machine within a fixed budget, its trained models carried from a CPU
machine instead of trained there (training is CPU work on one thread: minutes of a lent GPU's time for nothing).

On the CPU machine, from the checkout (after the trained models were built by a run of `spec-draft-kv`):

    python benchmarks/spec_decode_gpu.py export          # -> .cache/carry-models/ (about 1.2 MiB, git-ignored)

On the GPU machine, with vLLM on PYTHONPATH and the checkout after it, carrying `.cache/carry-models`:

    python3 benchmarks/spec_decode_gpu.py run --gpu H200 --budget 200 --out "$OUT"
    python3 benchmarks/spec_decode_gpu.py run --gpu B200 --emulate --budget 200 --out "$OUT"

`run` puts the carried checkpoints where this environment's builders look for them (a folder name carries the
fingerprint of the library versions, which differ between the machines; the weights are the CPU's), runs the
spec cases as that class until the budget ends (an interrupted run keeps every finished record), renders the
report and packs the run folder into `$OUT/spec-<class>.tgz` with `matrix.md` beside it: two files.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".cache" / "carry-models"
MODELS = ROOT / ".cache" / "models"
CASES = ["spec-draft-kv", "spec-draft-backends", "spec-draft-shapes", "spec-draft-mtp"]


def _families():
    from kvmatrix.harness.models import trained, trained_draft

    return [(trained, "trained_llama"), (trained_draft, "trained_llama_draft")]


def export() -> None:
    """The trained checkpoints built here, copied under their builder names (no fingerprint)."""
    for family, name in _families():
        built = MODELS / family.folder_name(name)
        if not built.is_dir():
            sys.exit(f"{built} is not built: run `python -m kvmatrix run --case spec-draft-kv` first")
        shutil.rmtree(CARRY / name, ignore_errors=True)
        shutil.copytree(built, CARRY / name)
        print(f"{built.name} -> {CARRY / name}")


def place_carried() -> None:
    for family, name in _families():
        target = MODELS / family.folder_name(name)
        if not target.exists() and (CARRY / name).is_dir():
            MODELS.mkdir(parents=True, exist_ok=True)
            shutil.copytree(CARRY / name, target)
            print(f"carried {name} -> {target.name}", flush=True)


def run(gpu: str, emulate: bool, budget: int, out: Path, jobs: int, cases: list[str]) -> int:
    place_carried()
    run_id = f"spec-{gpu}" + ("-emulated" if emulate else "") + ("" if cases == CASES else "-" + "-".join(
        c.removeprefix("spec-draft-") for c in cases))
    runs = ROOT / "reports" / "runs"
    command = [sys.executable, "-m", "kvmatrix", "run", "--gpu", gpu, "--run-id", run_id, "--jobs", str(jobs),
               *(["--emulate"] if emulate else []), *[arg for case in cases for arg in ("--case", case)]]
    harness = subprocess.Popen(command, cwd=ROOT)
    try:
        status = harness.wait(timeout=budget)
    except subprocess.TimeoutExpired:  # stopped as on Ctrl-C: its cells end with it, finished records stay
        print(f"budget of {budget} s spent: reporting the cells that finished", flush=True)
        harness.terminate()
        try:
            harness.wait(timeout=30)
        except subprocess.TimeoutExpired:
            harness.kill()
            harness.wait()
        status = 124
    folder = runs / run_id
    subprocess.run([sys.executable, "-m", "kvmatrix", "report", str(folder)], cwd=ROOT, timeout=120)
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / f"{run_id}.tgz", "w:gz") as tar:
        tar.add(folder, arcname=run_id)
    if (folder / "matrix.md").exists():
        shutil.copy(folder / "matrix.md", out / f"{run_id}.md")
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("export", help="copy the trained checkpoints built here to .cache/carry-models")
    go = sub.add_parser("run", help="run the spec cases as a GPU class within a budget, packed into --out")
    go.add_argument("--gpu", required=True)
    go.add_argument("--emulate", action="store_true")
    go.add_argument("--budget", type=int, default=200, help="seconds the harness may run")
    go.add_argument("--jobs", type=int, default=8)
    go.add_argument("--out", type=Path, required=True)
    go.add_argument("--case", action="append", help=f"only these cases (default: {', '.join(CASES)})")
    args = parser.parse_args()
    if args.command == "export":
        export()
        return 0
    return run(args.gpu, args.emulate, args.budget, args.out, args.jobs, args.case or CASES)


if __name__ == "__main__":
    sys.exit(main())
