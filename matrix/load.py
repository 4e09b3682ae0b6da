"""Reading `cases/`: case files (one case per file, named by the file), the model registry (`_models.yaml`)
and the GPU pool (`_pool.yaml`). Files whose name starts with `_` are shared data, never cases; a case may pull
shared blocks in with `include: [_file.yaml]` (the lm-evaluation-harness idea), its own keys winning.

YAML is read with a SafeLoader only (`read_yaml`): case files are data, nothing in them is executed, and what they
may say is bounded (size, UTF-8, no aliases; the cells they expand to, matrix/expand.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from kvmatrix.matrix.case import Case
from kvmatrix.matrix.expand import MAX_CELLS, check_size, combinations
from kvmatrix.matrix.messages import did_you_mean, unknown_name
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

# The default case set: cases/ of the checkout, package data of an installed kvmatrix (wherever it was installed).
CASES_DIR = Path(str(resources.files("kvmatrix.cases")))
MODELS_FILE = "_models.yaml"
POOL_FILE = "_pool.yaml"


# Bounds on a data file: the shipped ones are at most a few KiB, and nothing in one is worth more.
MAX_FILE_BYTES = 1 << 20


class _DataLoader(yaml.SafeLoader):
    """`yaml.safe_load` without what no data file needs and a hostile one abuses: aliases (`*name`: 600 bytes of
    nested aliases expand to a 112 MB engine argument) and a key given twice (YAML keeps the last one silently:
    a second `expect:` would drop the first's rules)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.MarkedYAMLError(None, None, "an alias (*name): data files repeat nothing by reference; "
                                       "write the value out, or share a block with include:",
                                       self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.MarkedYAMLError(None, None, f"key {key!r} appears twice in one mapping",
                                           key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def shown(path: Path | str) -> str:
    """A path as messages show it: a character that is not printable (a line break, bytes that are not UTF-8)
    escaped, so that the message stays one line and can be printed."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(path))


def read_yaml(path: Path) -> Any:
    """A data file's YAML (nothing in it executed), or CaseError naming the file: unreadable, not a regular file,
    over MAX_FILE_BYTES, not UTF-8, not YAML, nested past the parser's depth, or with aliases or a key twice."""
    where = shown(path)
    try:
        if not Path(path).is_file():
            raise CaseError(where, None, None, "not a regular file")
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise CaseError(where, None, None, f"cannot read: {err.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise CaseError(where, None, None, f"over {MAX_FILE_BYTES >> 10} KiB: no data file needs that much")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise CaseError(where, None, None, f"not UTF-8 text: byte 0x{data[err.start]:02x} on line {line}") from None
    try:
        return yaml.load(text, Loader=_DataLoader)  # noqa: S506 - _DataLoader is a SafeLoader
    except yaml.YAMLError as err:
        raise CaseError(where, None, None, f"not valid YAML: {_one_line(err)}") from None
    except RecursionError:
        raise CaseError(where, None, None, "not valid YAML: nested too deeply to read") from None


def case_files(cases_dir: Path = CASES_DIR) -> list[Path]:
    if not Path(cases_dir).is_dir():
        raise CaseError(str(cases_dir), None, None, "no such folder of case files")
    return sorted(p for p in cases_dir.glob("*.yaml") if not p.name.startswith("_"))


def _one_line(err: yaml.YAMLError) -> str:
    """PyYAML's error as one line: what is wrong and where (its own message spans several, with a snippet)."""
    if not isinstance(err, yaml.MarkedYAMLError):
        return " ".join(str(err).split())
    where = f" (line {err.problem_mark.line + 1}, column {err.problem_mark.column + 1})" if err.problem_mark else ""
    return " ".join(filter(None, [err.context, err.problem])) + where


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
# not UTF-8 could not be printed) and without what cell ids, report tables and selections give a meaning to.
NOT_IN_A_CASE_NAME = frozenset("[]|*?")


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


def _load_named(path: Path, cls: type[BaseModel], what: str) -> dict[str, Any]:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise CaseError(str(path), None, None, f"the {what} file is a mapping of name to entry")
    out = {}
    for name, entry in data.items():
        try:
            out[str(name)] = cls.model_validate(entry if entry is not None else {})
        except ValidationError as err:
            problem = wrap_validation_error(err, str(path), None)
            raise CaseError(str(path), None, f"{name}.{problem.field}" if problem.field else name,
                            problem.message) from None
    return out


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
    return _load_named(shared_file(cases_dir, MODELS_FILE), ModelEntry, "model registry")


def load_pool(cases_dir: Path = CASES_DIR) -> dict[str, GpuClass]:
    return _load_named(shared_file(cases_dir, POOL_FILE), GpuClass, "GPU pool")
