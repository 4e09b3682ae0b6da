"""Reading `cases/`: case files (one case per file, named by the file), the model registry (`_models.yaml`)
and the GPU pool (`_pool.yaml`). Files whose name starts with `_` are shared data, never cases; a case may pull
shared blocks in with `include: [_file.yaml]` (the lm-evaluation-harness idea), its own keys winning.

YAML is read with a SafeLoader only (`read_yaml`, matrix/data_file.py): case files are data, nothing in them is
executed, and what they may say is bounded (size, UTF-8, no aliases; the cells they expand to, matrix/expand.py).
What a folder other than the built-in one may say is matrix/trust.py's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from kvmatrix.matrix.case import Case
from kvmatrix.matrix.combinations import MAX_CELLS, check_size, combinations
from kvmatrix.matrix.data_file import read_yaml, shown
from kvmatrix.matrix.messages import did_you_mean, excerpt, unknown_name
from kvmatrix.matrix.schema import (
    CaseError,
    GpuClass,
    ModelEntry,
    Vocabulary,
    case_engine_arg_problem,
    case_env_problem,
    every_problem,
    wrap_validation_error,
)
from kvmatrix.matrix.spelling import current_spelling
from kvmatrix.matrix.trust import (
    TRUST_HINT,
    code_trusted,
    is_builtin,
    model_entry_problems,
    pool_class_problems,
    speculative_field_problem,
)

# The default case set: cases/ of the checkout, package data of an installed kvmatrix (wherever it was installed).
CASES_DIR = Path(str(resources.files("kvmatrix.cases")))
MODELS_FILE = "_models.yaml"
POOL_FILE = "_pool.yaml"


def case_files(cases_dir: Path = CASES_DIR) -> list[Path]:
    if not Path(cases_dir).is_dir():
        raise CaseError(str(cases_dir), None, None, "no such folder of case files")
    return sorted(p for p in cases_dir.glob("*.yaml") if not p.name.startswith("_"))


def _with_includes(path: Path, data: dict, case: str, seen: tuple[Path, ...] = ()) -> dict:
    data = current_spelling(str(path), case, data)
    includes = data.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise CaseError(str(path), case, "include", "a list of file names next to this one")
    merged: dict = {}
    for name in includes:
        if "\0" in name:  # no file can be named so: Path.resolve would raise ValueError, not name the field
            raise CaseError(str(path), case, "include", f"{name!r} is not a file name")
        target = (path.parent / name).resolve()
        if target.parent != path.parent.resolve():
            raise CaseError(str(path), case, "include", f"{name!r} is not a file in {path.parent}")
        if target in seen:
            raise CaseError(str(path), case, "include", f"{name!r} includes itself")
        try:
            block = read_yaml(target)
        except CaseError as err:
            raise CaseError(str(path), case, "include", f"{name}: {err.message}") from None
        if not isinstance(block, dict):
            raise CaseError(str(path), case, "include", f"{name} is not a mapping of fields")
        merged.update(_with_includes(target, block, case, (*seen, target)))
    merged.update(data)
    return merged


# A case's name is its file's: it is part of every cell id, record file name, report row and command line that
# names a cell. So it is printable UTF-8 text without spaces (a line break split the report's rows, bytes that are
# not UTF-8 could not be printed) and without what cell ids, report tables, selections and markup give a meaning to.
NOT_IN_A_CASE_NAME = frozenset("[]|*?<>&`")


def case_name_problem(name: str) -> str | None:
    """Why a case file's name cannot be a case's name; None where it can."""
    if name.isprintable() and not any(c.isspace() or c in NOT_IN_A_CASE_NAME for c in name):
        return None
    return ("a case is named by its file, and a case name is printable UTF-8 text without spaces, line breaks or "
            f"any of {' '.join(sorted(NOT_IN_A_CASE_NAME))}; rename the file")


def load_case(path: Path, vocabulary: Vocabulary | None = None, max_cells: int | None = MAX_CELLS) -> Case:
    """A case file, checked (the installed vLLM's names too, with `vocabulary`); CaseError naming file, case and
    field. `max_cells`: the cells its matrix may expand to (None: any number), checked before anything expands it."""
    name = path.stem
    if problem := case_name_problem(name):
        raise CaseError(shown(path), None, None, problem)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise CaseError(str(path), name, None, "a case file is a mapping of fields")
    data = _with_includes(path, dict(data), name)
    data.setdefault("name", name)
    if data["name"] != name:
        raise CaseError(str(path), name, "name", f"is {data['name']!r}; a case is named by its file ({name!r})")
    try:
        case = Case.model_validate(data)
    except ValidationError as err:
        raise wrap_validation_error(err, str(path), name) from None
    except RecursionError:
        raise CaseError(str(path), name, None, "nested too deeply to check") from None
    if id_problems := list(_id_value_problems(path, case)):  # before any message quotes a value of the matrix
        raise every_problem(id_problems)
    check_size(case, str(path), max_cells)
    problems = [*_data_only_problems(path, case),
                *(_vocabulary_problems(path, case, vocabulary) if vocabulary is not None else ())]
    if problems:  # every one, not only the first: one `kvmatrix check` shows them all
        raise every_problem(problems)
    return case


def _data_only_problems(path: Path, case: Case) -> Iterator[CaseError]:
    """A case's environment and engine arguments are data: nothing that loads code or files (schema.py says why)."""
    for name, value in case.env.items():
        if problem := case_env_problem(name, value):
            yield CaseError(str(path), case.name, f"env.{name}", problem)
    for name, value in case.engine_args.items():
        if problem := case_engine_arg_problem(name, value):
            yield CaseError(str(path), case.name, f"engine_args.{name}", problem)
    for name, value in case.speculative_config.items():
        if problem := speculative_field_problem(name, value):
            yield CaseError(str(path), case.name, f"speculative_config.{name}", problem)


# An axis value is part of its cells' ids, and so of every progress line, record file name, report row and waiver
# line naming them: a word, a number or a dotted version, nothing that breaks a line, escapes the terminal, opens
# HTML or means something in a cell id (`[`, `,`, `=`).
_ID_VALUE = re.compile(r"[A-Za-z0-9_.:+-]{1,64}")


def _strings(value: Any, where: str) -> Iterable[tuple[str, str]]:
    """(dotted field, text) for every string inside a dumped model."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{where}.{i}")


def _id_value_problems(path: Path, case: Case) -> Iterator[CaseError]:
    for field, text in _strings(case.matrix.model_dump(), "matrix"):
        if not _ID_VALUE.fullmatch(text):
            yield CaseError(str(path), case.name, field,
                            f"{excerpt(text)}: an axis value is part of cell ids, so it is a word, a number or a "
                            "version (letters, digits and _ . : + -, at most 64), no space, line break or markup")


def _vocabulary_problems(path: Path, case: Case, vocabulary: Vocabulary) -> Iterator[CaseError]:
    named = [(f"matrix.kv_cache_dtype.{i}", d) for i, d in enumerate(case.matrix.kv_cache_dtype)]
    named += [
        (f"matrix.extra.{i}.kv_cache_dtype", c.kv_cache_dtype)
        for i, c in enumerate(case.matrix.extra)
        if c.kv_cache_dtype is not None
    ]
    named += [(f"matrix.draft_kv_cache_dtype.{i}", d) for i, d in enumerate(case.matrix.draft_kv_cache_dtype) if d]
    named += [(f"matrix.extra.{i}.draft_kv_cache_dtype", c.draft_kv_cache_dtype)
              for i, c in enumerate(case.matrix.extra) if c.draft_kv_cache_dtype]
    for field, dtype in named:
        if vocabulary.kv_cache_dtypes and dtype not in vocabulary.kv_cache_dtypes:
            yield CaseError(str(path), case.name, field, unknown_name("kv_cache_dtype", dtype,
                                                                      vocabulary.kv_cache_dtypes)
                            + " (the installed vLLM's CacheDType)")
    yield from _signature_name_problems(path, case, vocabulary)
    yield from _skip_layer_problems(path, case, vocabulary)
    for name in case.speculative_config:
        if vocabulary.speculative_fields and name not in vocabulary.speculative_fields:
            yield CaseError(str(path), case.name, f"speculative_config.{name}",
                            "not a field of vLLM's speculative_config in any release the harness knows "
                            "(harness/vllm_compat/speculative.py)")
    for name in case.env:
        if name not in vocabulary.env_vars:
            yield CaseError(str(path), case.name, f"env.{name}",
                            f"not an environment variable the installed vLLM reads (vllm.envs)"
                            f"{did_you_mean(name, vocabulary.env_vars)}; case files may set only those")
    for name in case.engine_args:
        if vocabulary.engine_args and name not in vocabulary.engine_args:
            yield CaseError(str(path), case.name, f"engine_args.{name}",
                            f"not an engine argument of the installed vLLM (vllm.engine.arg_utils.EngineArgs)"
                            f"{did_you_mean(name, vocabulary.engine_args)}")


def _signature_name_problems(path: Path, case: Case, vocabulary: Vocabulary) -> Iterator[CaseError]:
    """A `crash:` or `refuse:` rule names failures the classifier knows: a made-up name would never match, and
    the rule would fail every cell it applies to for the wrong reason."""
    if not vocabulary.signatures:
        return
    for i, rule in enumerate(case.expect):
        for kind, expected in (("crash", rule.crash), ("refuse", rule.refuse)):
            for name in getattr(expected, "names", []):
                if name not in vocabulary.signatures:
                    yield CaseError(str(path), case.name, f"expect.{i}.{kind}.signature",
                                    unknown_name("failure signature", name, vocabulary.signatures, limit=200)
                                    + " (harness/vllm_compat/signatures.py)")


def _skip_layer_problems(path: Path, case: Case, vocabulary: Vocabulary) -> Iterator[CaseError]:
    """Every skip-list entry names a layer of the cell's engine (its target's, then its draft's, numbered on) or
    a word vLLM knows: vLLM ignores anything else silently, so such a cell would test nothing it claims to."""
    target = vocabulary.model_layers.get(case.model)
    for combo in combinations(case):
        # A draft whose layers are not known (no local build) leaves the cell unchecked, like such a target.
        draft = vocabulary.model_layers.get(combo["speculative"]) if combo["speculative"] else 0
        for entry in combo["kv_cache_dtype_skip_layers"] or []:
            if entry.isdigit():
                if target is not None and draft is not None and int(entry) >= target + draft:
                    spec = f" and its draft {combo['speculative']!r} ({draft})" if combo["speculative"] else ""
                    yield CaseError(str(path), case.name, "matrix.kv_cache_dtype_skip_layers",
                                    f"layer {entry} is not a layer of {case.model!r}: its engine has layers 0-"
                                    f"{target + draft - 1} ({case.model!r}: {target}{spec})")
            elif vocabulary.skip_layer_words and entry not in vocabulary.skip_layer_words:
                yield CaseError(str(path), case.name, "matrix.kv_cache_dtype_skip_layers",
                                f"{entry!r} is neither a layer index nor a word vLLM reads there "
                                f"({', '.join(sorted(vocabulary.skip_layer_words))})")


def load_cases(paths: Iterable[Path] | None = None, vocabulary: Vocabulary | None = None) -> list[Case]:
    return [load_case(p, vocabulary) for p in (case_files() if paths is None else paths)]


def _load_named(path: Path, cls: type[BaseModel], what: str,
                untrusted: Callable[[Any], list[tuple[str, str]]] | None = None) -> dict[str, Any]:
    """A registry or pool file's entries; `untrusted`: each entry's values that load code or files, refused
    unless the file is the built-in one or the user trusts the folder's code (matrix/trust.py)."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise CaseError(str(path), None, None, f"the {what} file is a mapping of name to entry")
    check = untrusted if untrusted and not is_builtin(path, CASES_DIR) and not code_trusted() else None
    builtin = _builtin_entries(path.name) if check else {}
    out = {}
    for name, entry in data.items():
        try:
            out[str(name)] = cls.model_validate(entry if entry is not None else {})
        except ValidationError as err:
            problem = wrap_validation_error(err, str(path), None)
            raise CaseError(str(path), None, f"{name}.{problem.field}" if problem.field else str(name),
                            problem.message) from None
        verbatim = name in builtin and builtin[name] == entry  # the built-in's own entry, copied: trusted as it is
        for field, refused in check(out[str(name)]) if check and not verbatim else []:
            raise CaseError(str(path), None, f"{name}.{field}", refused + TRUST_HINT)
    return out


@functools.cache
def _builtin_entries(name: str) -> dict:
    """The built-in registry's or pool's entries as written (`name`: the file's name), for a folder's copies."""
    data = read_yaml(CASES_DIR / name) if (CASES_DIR / name).is_file() else {}
    return data if isinstance(data, dict) else {}


def shared_file(cases_dir: Path, name: str) -> Path:
    """A case folder's model registry, pool or waivers file: its own, or the default case set's where it has none
    (a folder of only case files runs with the built-in registry, pool and known failures)."""
    own = Path(cases_dir) / name
    return own if own.exists() else CASES_DIR / name


def cases_option(cases_dir: Path | None) -> list[str]:
    """`--cases-dir FOLDER` for a command line repeating a run made with a folder other than the built-in cases
    (nothing for those: a printed command stays short, and works on any installation)."""
    return ["--cases-dir", str(cases_dir)] if cases_dir and Path(cases_dir).resolve() != CASES_DIR.resolve() else []


def load_models(cases_dir: Path = CASES_DIR) -> dict[str, ModelEntry]:
    return _load_named(shared_file(cases_dir, MODELS_FILE), ModelEntry, "model registry", model_entry_problems)


def load_pool(cases_dir: Path = CASES_DIR) -> dict[str, GpuClass]:
    return _load_named(shared_file(cases_dir, POOL_FILE), GpuClass, "GPU pool", pool_class_problems)
