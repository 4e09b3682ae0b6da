"""A fresh clone's first run, two commits side by side in one invocation: each arm clones this repository at its
commit into a new folder and times `make matrix` there (the venv, the tiny models, their training, bytecode and
compile caches all made from nothing; the package installer's download cache is the machine's, shared by both).

Prints each arm's wall, its install and run parts, the verdict counts (they must agree), and the ratio base/head
per round; `--rounds 2` alternates the arms (base, head, head, base) so that neither always runs on a machine the
other warmed.

    python benchmarks/first_run.py --base COMMIT [--head COMMIT] [--rounds N]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN_LINE = re.compile(r"\((\d+) s total\)")
VERDICTS = re.compile(r"^\d+ cells: .*$", re.M)


def first_run(commit: str, scratch: Path) -> dict:
    clone = scratch / commit
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
    started = time.monotonic()
    done = subprocess.run(["make", "matrix"], cwd=clone, capture_output=True, text=True)
    wall = time.monotonic() - started
    output = done.stdout + done.stderr
    (scratch / f"{commit}.log").write_text(output)
    run = RUN_LINE.search(output)
    counts = VERDICTS.search(output)
    shutil.rmtree(clone, ignore_errors=True)
    return {"wall": wall, "run": float(run.group(1)) if run else float("nan"), "exit": done.returncode,
            "counts": counts.group(0) if counts else "no summary (see the log)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True)
    parser.add_argument("--head", default="HEAD")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    commits = {arm: subprocess.run(["git", "rev-parse", "--short", getattr(args, arm)], cwd=REPO, check=True,
                                   capture_output=True, text=True).stdout.strip() for arm in ("base", "head")}
    scratch = Path(tempfile.mkdtemp(prefix="kvm-first-run-"))
    print(f"base {commits['base']}, head {commits['head']}; logs in {scratch}")
    for round_ in range(args.rounds):
        order = ("base", "head") if round_ % 2 == 0 else ("head", "base")
        result = {arm: first_run(commits[arm], scratch) for arm in order}
        for arm in order:
            r = result[arm]
            print(f"round {round_ + 1} {arm:4} {commits[arm]}: {r['wall']:.0f} s "
                  f"(install {r['wall'] - r['run']:.0f} s, run {r['run']:.0f} s), exit {r['exit']}, {r['counts']}")
        print(f"round {round_ + 1} base/head: {result['base']['wall'] / result['head']['wall']:.2f}x")


if __name__ == "__main__":
    main()
