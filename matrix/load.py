"""Reading `cases/`: case files (one case per file, named by the file), the model registry (`_models.yaml`)
and the GPU pool (`_pool.yaml`). Files whose name starts with `_` are shared data, never cases; a case may pull
shared blocks in with `include: [_file.yaml]` (the lm-evaluation-harness idea), its own keys winning.

YAML is read with `yaml.safe_load` only: case files are data, nothing in them is executed.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from kvmatrix.matrix.case import Case
from kvmatrix.matrix.expand import combinations
from kvmatrix.matrix.messages import did_you_mean, unknown_name
from kvmatrix.matrix.schema import CaseError, GpuClass, ModelEntry, Vocabulary, wrap_validation_error

# The default case set: cases/ of the checkout, package data of an installed kvmatrix (wherever it was installed).
CASES_DIR = Path(str(resources.files("kvmatrix.cases")))
MODELS_FILE = "_models.yaml"
POOL_FILE = "_pool.yaml"


def read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as err:
        raise CaseError(str(path), None, None, f"cannot read: {err.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise CaseError(str(path), None, None, f"not valid YAML: {err}") from None


def case_files(cases_dir: Path = CASES_DIR) -> list[Path]:
    if not Path(cases_dir).is_dir():
        raise CaseError(str(cases_dir), None, None, "no such folder of case files")
    return sorted(p for p in cases_dir.glob("*.yaml") if not p.name.startswith("_"))


def _with_includes(path: Path, data: dict, case: str, seen: tuple[Path, ...] = ()) -> dict:
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


def load_case(path: Path, vocabulary: Vocabulary | None = None) -> Case:
    name = path.stem
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
    if vocabulary is not None:
        _check_vocabulary(path, case, vocabulary)
    return case


def _check_vocabulary(path: Path, case: Case, vocabulary: Vocabulary) -> None:
    named = [(f"matrix.kv_cache_dtype.{i}", d) for i, d in enumerate(case.matrix.kv_cache_dtype)]
    named += [
        (f"matrix.include.{i}.kv_cache_dtype", c.kv_cache_dtype)
        for i, c in enumerate(case.matrix.include)
        if c.kv_cache_dtype is not None
    ]
    for field, dtype in named:
        if vocabulary.kv_cache_dtypes and dtype not in vocabulary.kv_cache_dtypes:
            raise CaseError(str(path), case.name, field, unknown_name("kv_cache_dtype", dtype,
                                                                      vocabulary.kv_cache_dtypes)
                            + " (the installed vLLM's CacheDType)")
    _check_signature_names(path, case, vocabulary)
    _check_skip_layers(path, case, vocabulary)
    for name in case.env:
        if name not in vocabulary.env_vars:
            raise CaseError(str(path), case.name, f"env.{name}",
                            f"not an environment variable the installed vLLM reads (vllm.envs)"
                            f"{did_you_mean(name, vocabulary.env_vars)}; case files may set only those")
    for name in case.engine_args:
        if vocabulary.engine_args and name not in vocabulary.engine_args:
            raise CaseError(str(path), case.name, f"engine_args.{name}",
                            f"not an engine argument of the installed vLLM (vllm.engine.arg_utils.EngineArgs)"
                            f"{did_you_mean(name, vocabulary.engine_args)}")


def _check_signature_names(path: Path, case: Case, vocabulary: Vocabulary) -> None:
    """A `crash:` or `refuse:` rule names failures the classifier knows: a made-up name would never match, and
    the rule would fail every cell it applies to for the wrong reason."""
    if not vocabulary.signatures:
        return
    for i, rule in enumerate(case.expect):
        for kind, expected in (("crash", rule.crash), ("refuse", rule.refuse)):
            for name in getattr(expected, "names", []):
                if name not in vocabulary.signatures:
                    raise CaseError(str(path), case.name, f"expect.{i}.{kind}.signature",
                                    unknown_name("failure signature", name, vocabulary.signatures, limit=200)
                                    + " (harness/vllm_compat/signatures.py)")


def _check_skip_layers(path: Path, case: Case, vocabulary: Vocabulary) -> None:
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
                    raise CaseError(str(path), case.name, "matrix.kv_cache_dtype_skip_layers",
                                    f"layer {entry} is not a layer of {case.model!r}: its engine has layers 0-"
                                    f"{target + draft - 1} ({case.model!r}: {target}{spec})")
            elif vocabulary.skip_layer_words and entry not in vocabulary.skip_layer_words:
                raise CaseError(str(path), case.name, "matrix.kv_cache_dtype_skip_layers",
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
