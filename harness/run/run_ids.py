"""Which results folder a run writes: a new one by default, as pytest and lm-eval start every invocation afresh, so
a command run again after a fix (a findings page's reproducer) runs vLLM again instead of replaying stored records;
an earlier run only when asked (`--resume [RUN_ID|latest]`, or naming its `--run-id`)."""

from __future__ import annotations

import time
from pathlib import Path

from kvmatrix.harness.run.guards import RUN_META, GuardError

LATEST = "latest"


def new_run_id(gpu_name: str, vllm_version: str | None, runs_dir: Path) -> str:
    """`<date>-<time>-<class>-vllm<version>`, a name no folder under `runs_dir` has yet (a second run within the
    same second gets `-2`, ...): the folder is this run's alone."""
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{gpu_name}-vllm{vllm_version}"
    run_id, n = base, 1
    while (Path(runs_dir) / run_id).exists():
        n += 1
        run_id = f"{base}-{n}"
    return run_id


def checked_run_id(run_id: str) -> str:
    """A run id is a folder name under --runs-dir: `../x` or an absolute path would put the run folder elsewhere."""
    if run_id in ("", ".", "..") or "/" in run_id or "\\" in run_id or "\0" in run_id:
        raise GuardError(f"--run-id {run_id!r}: a run id is one folder name under --runs-dir (no / or ..); "
                         "--runs-dir says where the run folders go")
    return run_id


def runs_in(runs_dir: Path) -> list[Path]:
    """The run folders under `runs_dir` (those a run claimed: they hold its run.json), the latest started last."""
    folders = [meta.parent for meta in Path(runs_dir).glob(f"*/{RUN_META}")]
    return sorted(folders, key=lambda folder: ((folder / RUN_META).stat().st_mtime, folder.name))


def resumed_run_id(wanted: str, runs_dir: Path) -> str:
    """The run id `--resume` names: `latest` (the run under `runs_dir` started or resumed last), a run id, or a
    run folder's path; a run that is not there is an error listing the ones that are."""
    runs = runs_in(runs_dir)
    if wanted == LATEST:
        if not runs:
            raise GuardError(f"--resume latest: no run under {runs_dir} to resume; `kvmatrix run` starts one")
        return runs[-1].name
    name = Path(wanted).name if Path(wanted).parent.resolve() == Path(runs_dir).resolve() else wanted
    if not (Path(runs_dir) / name / RUN_META).is_file():
        known = ", ".join(folder.name for folder in runs[-5:]) or "none"
        raise GuardError(f"--resume {wanted}: no run {name!r} under {runs_dir} (the latest there: {known}); "
                         f"`--resume latest` takes the last one")
    return name
