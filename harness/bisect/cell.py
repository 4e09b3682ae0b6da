"""One bisection step's cells, run inside that step's environment: `python -m kvmatrix.harness.bisect.cell REQUEST.json`
(cells, runs_dir, run_id, cache_dir, out, gpu, isolation). Writes OUT: {"records": {cell: path}} for the cells that
ran (each record has the matrix's verdict) and {"skips": {cell: why}} for those this vLLM cannot express at all
(e.g. a newer case file names a dtype an older vLLM lacks). The cells run together, as one run of the matrix
(`plan_run` → `execute`, as `kvmatrix run` runs them): in one warm worker with `isolation: worker`.

Unlike `kvmatrix run --cell`, case files are read without checking every cell against this vLLM: only the
cells' dtypes and engine arguments have to exist here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvmatrix.harness.record.files import write_json_atomic
from kvmatrix.harness.run.model_builds import models_needed
from kvmatrix.harness.run.plan import RunOptions, execute, narrowed, plan_run
from kvmatrix.harness.run.task.spec import engine_args_for
from kvmatrix.harness.vllm_compat import known_engine_args, known_kv_cache_dtypes
from kvmatrix.matrix.expand import Cell, expand_case
from kvmatrix.matrix.load import CASES_DIR, load_case, load_models, load_pool
from kvmatrix.matrix.schema import CaseError


def _find_cell(cell_id: str, cases_dir: Path) -> Cell | str:
    """The cell, or why this step cannot express it."""
    case_name = cell_id.split("[", 1)[0]
    try:
        case = load_case(cases_dir / f"{case_name}.yaml")
        cells = expand_case(case, load_models(cases_dir), load_pool(cases_dir))
    except (CaseError, OSError) as err:
        return f"case {case_name} does not load: {err}"
    cell = next((c for c in cells if c.cell_id == cell_id), None)
    if cell is None:
        return f"case {case_name} has no cell {cell_id}"
    known = known_kv_cache_dtypes()
    dtype = cell.axes.get("kv_cache_dtype")
    if known and dtype not in known:
        return f"this vLLM has no kv_cache_dtype {dtype!r}"
    return cell


def run(cell_ids: list[str], runs_dir: Path, run_id: str, cache_dir: Path, gpu: str | None = None,
        isolation: str = "process", cases_dir: Path = CASES_DIR) -> dict[str, dict[str, str]]:
    found = {c: _find_cell(c, cases_dir) for c in cell_ids}
    skips = {c: why for c, why in found.items() if isinstance(why, str)}
    cells = tuple(cell for cell in found.values() if not isinstance(cell, str))
    plan = plan_run(step_options(cells, runs_dir, run_id, cache_dir, gpu, isolation, cases_dir), claim=False)
    skips |= {c.cell_id: f"{c.cell_id} does not run on {plan.gpu_name}" for c in cells
              if c.cell_id not in {t.cell.cell_id for t in plan.tasks}}
    settings = plan.settings
    known_args = known_engine_args()
    runnable = []
    for task in plan.tasks:
        if known_args:
            # The arguments' names do not depend on where a model is built: each cell builds its own as it starts.
            stand_ins = {name: cache_dir / name for name in models_needed(task.cell)}
            args = engine_args_for(task.cell, task.gpu, settings.models, stand_ins, settings.use_hub)
            unknown = sorted(set(args) - known_args)
            if unknown:
                skips[task.cell.cell_id] = f"this vLLM has no engine argument {', '.join(unknown)}"
                continue
        runnable.append(task)
    records = execute(narrowed(plan, runnable)) if runnable else []
    return {"records": {r["cell_id"]: str(plan.settings.run_dir.record_path(r["cell_id"], r["gpu_class"]))
                        for r in records},
            "skips": skips}


def step_options(cells: tuple[Cell, ...], runs_dir: Path, run_id: str, cache_dir: Path, gpu: str | None,
                 isolation: str, cases_dir: Path) -> RunOptions:
    """A step's run: its cells, as the class asked (emulated on this machine's GPU) or this machine's, together in
    one slot (one warm worker with `isolation: worker`), judged without waivers (the raw verdict is what changed),
    without a canary or templates (a step's environment is the thing under test, each cell's error its own), and in
    their own order (what runs in other environments saw does not apply)."""
    return RunOptions(gpu=gpu, emulate=gpu is not None, run_id=run_id, runs_dir=runs_dir, cache_dir=cache_dir,
                      cases_dir=cases_dir, cells=cells, jobs=1, isolation=isolation, template=False, waivers=False,
                      canary=False, read_past=False)


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text())
    answer = run(request["cells"], Path(request["runs_dir"]), request["run_id"], Path(request["cache_dir"]),
                 request.get("gpu"), request.get("isolation") or "process")
    write_json_atomic(Path(request["out"]), answer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
