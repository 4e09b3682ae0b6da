"""`kvmatrix check`: lint a folder of case files without running anything: every case file that does not load
(named by file, case and field, all of them, not only the first), every rule that can never apply (matrix/lint.py:
a `when:`, `exclude:` or `skip:` matching no cell), and a waivers file of the folder's own that does not parse or
waives no cell. Exit 0 when clean, 1 when anything was found (as linters do)."""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import FAILED, OK
from kvmatrix.harness.judge.waivers import WAIVERS_FILE, WaiverError, cell_keys, load_waivers, waiver_problems
from kvmatrix.harness.run.guards import cases_dir_for
from kvmatrix.harness.run.session import vllm_vocabulary
from kvmatrix.harness.vllm_compat import known_kv_cache_dtypes
from kvmatrix.matrix.data_file import read_yaml
from kvmatrix.matrix.expand import Cell, expand_case, model_problem
from kvmatrix.matrix.lint import DeadRule, dead_rules
from kvmatrix.matrix.load import case_files, load_case, load_models, load_pool
from kvmatrix.matrix.schema import CaseError, GpuClass, ModelEntry, every_problem


def add_arguments(chk: argparse.ArgumentParser) -> None:
    chk.add_argument("--cases-dir", help="folder of case files (default: the built-in cases)")
    chk.set_defaults(func=cmd_check)


def _sets(path: Path, key: str) -> bool:
    data = read_yaml(path)
    return isinstance(data, dict) and key in data


def origin(path: Path, key: str) -> Path:
    """The file a case's top-level `key` comes from: the case file itself, else the shared block it includes that
    sets it (the last one, as loading merges them; loading has refused include cycles)."""
    data = read_yaml(path)
    if not isinstance(data, dict) or key in data:
        return path
    includes = data.get("include") or []
    for name in reversed([includes] if isinstance(includes, str) else includes):
        block = path.parent / str(name)
        if block.is_file() and _sets(found := origin(block, key), key):
            return found
    return path


def reported(found: dict[Path, list[tuple[str, DeadRule]]], users: dict[Path, set[str]]) -> list[str]:
    """A case's own rule wherever it is dead; a shared block's only where it is dead in every case that includes
    the block (a rule for one model of several is not dead)."""
    lines = []
    for source, dead in found.items():
        cases_by_field: dict[str, set[str]] = defaultdict(set)
        for case, rule in dead:
            cases_by_field[rule.field].add(case)
        for case, rule in dead:
            if cases_by_field[rule.field] < users[source]:
                continue
            if len(users[source]) == 1:
                lines.append(f"{source}: case '{case}': field '{rule.field}': {rule.message}")
            elif case == min(cases_by_field[rule.field]):
                lines.append(f"{source}: field '{rule.field}' (every case that includes it: "
                             f"{', '.join(sorted(users[source]))}): {rule.message}")
    return lines


def more_problems(path: Path, models: dict[str, ModelEntry], pool: dict[str, GpuClass]) -> list[CaseError]:
    """What else is wrong with a case file that did not load, so that one check says every mistake: a case that
    loads without the installed vLLM's names is expanded (its model, drafts, classes); one that does not load at
    all has its `model:` looked up."""
    try:
        case = load_case(path)
    except CaseError:
        try:
            data = read_yaml(path)
        except (CaseError, OSError, ValueError):  # a file that does not read: its own problem says so
            return []
        model = data.get("model") if isinstance(data, dict) else None
        return [model_problem(str(path), path.stem, model, models)] if isinstance(model, str) and \
            model not in models else []
    try:
        expand_case(case, models, pool, str(path))
    except CaseError as err:
        return [err]
    return []


def lint_folder(cases_dir: Path) -> tuple[list[str], list[Cell]]:
    """(every problem, one line each; every cell of the cases that loaded)."""
    models, pool = load_models(cases_dir), load_pool(cases_dir)
    vocabulary = vllm_vocabulary(models)
    names = {"kv_cache_dtype": known_kv_cache_dtypes(), "model": list(models),
             "speculative": [name for name, entry in models.items() if entry.draft is not None]}
    problems: list[str] = []
    cells: list[Cell] = []
    found: dict[Path, list[tuple[str, DeadRule]]] = defaultdict(list)
    users: dict[Path, set[str]] = defaultdict(set)
    for path in case_files(cases_dir):
        try:
            case = load_case(path, vocabulary)
            mine = expand_case(case, models, pool, str(path))
        except CaseError as err:
            problems += [str(one) for one in every_problem([err, *more_problems(path, models, pool)]).each()]
            continue
        cells += mine
        for key in ("matrix", "skip", "expect", "accuracy"):
            users[origin(path, key)].add(case.name)
        for rule in dead_rules(case, mine, pool, names):
            found[origin(path, rule.field.split('.', 1)[0])].append((case.name, rule))
    return problems + reported(found, users), cells


def waivers_file_problems(cases_dir: Path, cells: list[Cell]) -> list[str]:
    """The folder's own waivers file: parse errors and waivers that match no cell (a borrowed one is not its own)."""
    own = Path(cases_dir) / WAIVERS_FILE.name
    if not own.is_file():
        return []
    try:
        waivers = load_waivers(own, load_pool(cases_dir))
    except WaiverError as err:
        return [str(err)]
    problems = waiver_problems([], waivers, known_cells=cell_keys(cells))
    return [str(p) for p in problems if p.is_error]


def cmd_check(args: argparse.Namespace) -> int:
    cases_dir = cases_dir_for(args.cases_dir)
    problems, cells = lint_folder(cases_dir)
    problems += waivers_file_problems(cases_dir, cells)
    for line in problems:
        print(line)
    files = len(case_files(cases_dir))
    print(f"{cases_dir}: {files} case files, {len(cells)} cells, "
          + (f"{len(problems)} problems" if problems else "no problems"))
    return FAILED if problems else OK
