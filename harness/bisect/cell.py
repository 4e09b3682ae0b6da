"""One bisection step's cell, run inside that step's environment: `python -m harness.bisect.cell CELL RUNS RUN_ID
CACHE OUT`. Writes OUT: {"record": path} (the cell ran: the record has the matrix's verdict), or {"skip": why}
when this vLLM cannot express the cell at all (e.g. a newer case file names a dtype an older vLLM lacks).

Unlike `kvmatrix run --cell`, the case file is read without checking every cell against this vLLM: only the one
cell's dtype and engine arguments have to exist here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.records import write_json_atomic
from harness.run.engine_args import engine_args_for, models_needed
from harness.run.pool import run_tasks
from harness.run.session import open_session
from harness.vllm_compat import known_engine_args, known_kv_cache_dtypes
from matrix.expand import expand_case
from matrix.load import CASES_DIR, load_case, load_models, load_pool
from matrix.schema import CaseError


def run(cell_id: str, runs_dir: Path, run_id: str, cache_dir: Path, cases_dir: Path = CASES_DIR) -> dict[str, str]:
    case_name = cell_id.split("[", 1)[0]
    try:
        case = load_case(cases_dir / f"{case_name}.yaml")
        cells = expand_case(case, load_models(cases_dir), load_pool(cases_dir))
    except (CaseError, OSError) as err:
        return {"skip": f"case {case_name} does not load: {err}"}
    cell = next((c for c in cells if c.cell_id == cell_id), None)
    if cell is None:
        return {"skip": f"case {case_name} has no cell {cell_id}"}
    known = known_kv_cache_dtypes()
    dtype = cell.axes.get("kv_cache_dtype")
    if known and dtype not in known:
        return {"skip": f"this vLLM has no kv_cache_dtype {dtype!r}"}
    session = open_session(run_id=run_id, runs_dir=runs_dir, cache_dir=cache_dir, cases_dir=cases_dir,
                           with_waivers=False)
    tasks = session.tasks([cell])
    if not tasks:
        return {"skip": f"{cell_id} does not run on {session.gpu_name}"}
    session.build_models(tasks)
    settings = session.settings
    known_args = known_engine_args()
    # (a model that did not build is left to run_tasks, whose record names it)
    if known_args and settings.built.keys() >= set(models_needed(cell)):
        args = engine_args_for(cell, tasks[0].gpu, settings.models, settings.built, settings.use_hub)
        unknown = sorted(set(args) - known_args)
        if unknown:
            return {"skip": f"this vLLM has no engine argument {', '.join(unknown)}"}
    (record,) = run_tasks(tasks, settings)
    return {"record": str(session.run_dir.record_path(record["cell_id"], record["gpu_class"]))}


def main(argv: list[str]) -> int:
    cell_id, runs_dir, run_id, cache_dir, out = argv
    write_json_atomic(Path(out), run(cell_id, Path(runs_dir), run_id, Path(cache_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
