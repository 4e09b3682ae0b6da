"""How long `kvmatrix repro`'s scripts are, two commits side by side in one invocation, over every findings entry's
script (reports/findings/registry.yaml) and every failing cell of the fixture runs (fail, xfail or error in
tests/fixtures/runs/*.tar.xz and tests/fixtures/records/**: each (cell, class) once).

Each arm runs in its own process with its own checkout on PYTHONPATH (BASE in a temporary worktree) and writes every
script as `kvmatrix repro CELL --gpu CLASS` would on a machine of that class's kind (an H200 for CUDA classes, an
AMX Xeon for CPU ones); a cell the arm cannot write a script for (a trained model, a case this checkout lacks) is
counted apart with its reason. Prints, per arm and set: scripts written, median and largest line count, bytes.

    python benchmarks/repro_lengths.py --base 714724b [--head HEAD]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAILING = ("fail", "xfail", "error")


def failing_cells() -> dict[tuple[str, str], dict]:
    """(cell id, class) -> how to write its script: the cases folder (relative to the checkout) its case lives in,
    and its record (what it failed on decides what the script observes, as `kvmatrix repro --run` does)."""
    found: dict[tuple[str, str], dict] = {}

    def add(text: bytes | str) -> None:
        try:
            record = json.loads(text)
        except ValueError:
            return
        if isinstance(record, dict) and record.get("verdict") in FAILING and record.get("gpu_class"):
            cell = record["cell_id"]
            cases = "cases/surface" if cell.startswith("surface-") else "cases"
            found.setdefault((cell, record["gpu_class"]), {"cases": cases, "record": record})

    for archive in sorted(glob.glob(str(REPO / "tests/fixtures/runs/*.tar.xz"))):
        with tarfile.open(archive) as opened:
            for member in opened.getmembers():
                if member.isfile() and member.name.endswith(".json") and "--" in Path(member.name).name:
                    add(opened.extractfile(member).read())  # type: ignore[union-attr]
    for path in sorted(glob.glob(str(REPO / "tests/fixtures/records/**/*.json"), recursive=True)):
        add(Path(path).read_text())
    return found


def findings_scripts() -> dict[tuple[str, str], dict]:
    """(cell id, class) -> how the registry has its script written (cases folder, observation, weights)."""
    import yaml

    entries = yaml.safe_load((REPO / "reports/findings/registry.yaml").read_text())
    return {(s["cell"], s["gpu"]): {"cases": s.get("cases_dir", "cases"), "observe": s["observe"],
                                    "weights": s.get("weights")} for e in entries for s in e.get("scripts", [])}


def arm(checkout: Path, pairs: list[dict], cache: Path) -> dict[str, dict]:
    """Run this file in `checkout`'s kvmatrix: each pair's script length (or why there is none)."""
    done = subprocess.run([sys.executable, __file__, "--measure", str(checkout), "--cache-dir", str(cache)],
                          input=json.dumps(pairs), capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(checkout)}, cwd=checkout)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def measure(checkout: Path, pairs: list[dict], cache: Path) -> dict[str, dict]:
    """In the arm's process: each script as that checkout's `kvmatrix repro` writes it."""
    import contextlib
    import io

    from kvmatrix.harness.record.task import Task

    try:  # where `kvmatrix repro`'s logic lives since its arguments moved to harness/cli/repro.py
        from kvmatrix.harness.repro import cell_script as command
    except ImportError:  # a commit before that
        from kvmatrix.harness.repro import command

    out = {}
    for pair in pairs:
        cell_id, gpu = pair["cell"], pair["gpu"]
        native = "cpu-amx" if gpu.startswith("cpu") else "H200"
        try:
            cell, models, pool = command.find_cell(checkout / pair["cases"], cell_id)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                text = script_text(command, Task(cell, gpu, pool[gpu]), models, cache, native, pair, checkout)
            out[pair["key"]] = {"lines": len(text.splitlines()), "bytes": len(text.encode())}
        except Exception as err:  # noqa: BLE001 - a cell an arm cannot write is counted apart, with its reason
            out[pair["key"]] = {"error": f"{type(err).__name__}: {str(err)[:160]}"}
    return out


def script_text(command, task, models, cache: Path, native: str, pair: dict, checkout: Path) -> str:
    """The script `kvmatrix repro` writes: its `script_for` (or `write`, at a commit before the CLI's arguments left
    harness/repro/; `--run`'s record, or the registry's observation) or, at a base before either, the full script."""
    if hasattr(command, "script_for"):
        request = command.ScriptRequest(cache, "repro.py", observe=pair.get("observe"), weights=pair.get("weights"))
        return command.script_for(task, models, request, pair.get("record"), native, checkout / pair["cases"])[0]
    if hasattr(command, "write"):
        args = argparse.Namespace(full=False, hub=False, cache_dir=str(cache), observe=pair.get("observe"),
                                  weights=pair.get("weights"), finding=None, out="repro.py")
        return command.write(task, models, args, pair.get("record"), native, checkout / pair["cases"])[0]
    from kvmatrix.harness.repro.generate import render, script_spec
    from kvmatrix.harness.vllm_compat import installed_vllm_version

    return render(script_spec(task, models, cache, False, installed_vllm_version()), "kvmatrix repro")


def summary(results: dict[str, dict], keys: list[str]) -> str:
    lines = [results[k]["lines"] for k in keys if "lines" in results[k]]
    sizes = [results[k]["bytes"] for k in keys if "bytes" in results[k]]
    if not lines:
        return "no script written"
    long = sum(1 for n in lines if n > 120)
    return (f"{len(lines):3} scripts, lines median {statistics.median(lines):6.0f} largest {max(lines):5} "
            f"({long} over 120), bytes median {statistics.median(sizes):7.0f} largest {max(sizes):6}; "
            f"{len(keys) - len(lines)} not written")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the commit before")
    parser.add_argument("--head", default=None, help="the commit after (default: this checkout as it is)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", default=str(REPO / ".cache"))
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(Path(args.measure), json.loads(sys.stdin.read()), Path(args.cache_dir))))
        return
    findings, failing = findings_scripts(), failing_cells()
    sets = {"findings entries": findings, "failing fixture cells": failing}
    pairs = [{"key": f"{title}: {cell}@{gpu}", "cell": cell, "gpu": gpu, **how}
             for title, chosen in sets.items() for (cell, gpu), how in chosen.items()]
    with tempfile.TemporaryDirectory() as scratch:
        arms = {}
        for name, commit in (("base", args.base), ("head", args.head)):
            if commit is None:
                arms[f"{name} (this checkout)"] = arm(REPO, pairs, Path(args.cache_dir))
                continue
            tree = Path(scratch) / name
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(tree), commit], check=True)
            try:
                arms[f"{name} {commit}"] = arm(tree, pairs, Path(args.cache_dir))
            finally:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
    for title, chosen in sets.items():
        keys = [f"{title}: {cell}@{gpu}" for cell, gpu in chosen]
        print(f"{title} ({len(keys)}):")
        for name, results in arms.items():
            print(f"  {name:28} {summary(results, keys)}")
    for name, results in arms.items():
        reasons = sorted({r["error"].split(":")[0] + ": " + r["error"].split(": ", 1)[-1][:70]
                          for r in results.values() if "error" in r})
        print(f"not written by {name}: " + ("; ".join(reasons[:8]) or "none"))


if __name__ == "__main__":
    main()
