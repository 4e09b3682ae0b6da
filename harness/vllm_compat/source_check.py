"""Whether the installed vLLM's source still holds what this package's tables name for its version: the modules of
backends, builders, KV-cache specs and the calls the harness makes (modules.py, emulation.py, teardown.py), the
modules a template process imports before it forks cells (preimport.py), the
files sources.py reads, the paths `kvmatrix pr` selects every cell for, every attribute name the probe reads
(engine.py) and the words of the log lines that time an engine's start (phase_log.py). Read from files, nothing
imported: run it where a new release is staged,

    python -m kvmatrix.harness.vllm_compat.source_check

and a table entry that a rename left behind shows as MISSING before a matrix of records goes blind on it. An
attribute is looked for as a word anywhere in vLLM's source: one that appears nowhere was certainly renamed (one
that appears may still live elsewhere: the records of a real run are the proof of those).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvmatrix.harness.vllm_compat import (
    emulation,
    engine,
    modules,
    phase_log,
    preimport,
    sources,
    speculative,
    teardown,
)
from kvmatrix.harness.vllm_compat.versions import for_version, installed_vllm_version

Check = tuple[str, str, bool]  # (what the table names, where it is looked for, found)


def source_checks(package: Path, version: str | None) -> list[Check]:
    """Every name of the tables for `version`, looked for in the vLLM package folder `package`."""
    texts = [path.read_text(errors="replace") for path in package.rglob("*.py")]
    words = frozenset(word for text in texts for word in re.findall(r"\w+", text))
    return [*_module_checks(package, version), *_file_checks(package, version),
            *_attribute_checks(words, version), *_speculative_checks(package, version),
            *_log_checks(texts, version)]


def _module_file(package: Path, module: str) -> Path | None:
    """The source file of a dotted vLLM module, if the package has it."""
    relative = Path(*module.split(".")[1:])
    for candidate in (package / relative.with_suffix(".py"), package / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _defines(path: Path | None, name: str) -> bool:
    return path is not None and re.search(rf"^(?:class|def) {name}\b|^{name}\s*=", path.read_text(), re.M) is not None


def _module_checks(package: Path, version: str | None) -> Iterator[Check]:
    for table in for_version(modules.BACKEND_MODULES, version):
        for backend, module in table.items():
            yield f"backend {backend}", module, _module_file(package, module) is not None
    for table in for_version(modules.BUILDER_MODULES, version):
        for builder, module in table.items():
            yield f"builder {builder}", module, _defines(_module_file(package, module), builder)
    for module in for_version(modules.SPEC_MODULE, version) + for_version(emulation.CUDA_PLATFORM_MODULE, version):
        yield "module", module, _module_file(package, module) is not None
    for engine_modules in for_version(preimport.ENGINE_MODULES, version):
        for module in engine_modules:
            yield "module a template imports", module, _module_file(package, module) is not None
    calls = for_version(teardown.TEARDOWN_CALLS, version) + for_version(emulation.DEVICE_CAPABILITY_CLASS, version)
    for module, name in calls:
        yield name, module, _defines(_module_file(package, module), name)


def _file_checks(package: Path, version: str | None) -> Iterator[Check]:
    for table in (sources.CACHE_DTYPE_SOURCES, sources.ENGINE_ARGS_SOURCES, sources.ENV_SOURCES):
        for relative in for_version(table, version):
            yield "source read by sources.py", f"vllm/{relative}", (package / relative).is_file()
    for paths in for_version(modules.SELECT_ALL_PATHS, version):
        for prefix, _reason in paths:
            yield "path that selects every cell", prefix, (package.parent / prefix).exists()


def _log_checks(texts: list[str], version: str | None) -> Iterator[Check]:
    """The words of the log lines that time an engine's start (phase_log.py), each somewhere in the source."""
    for words in for_version(phase_log.SOURCE_WORDS, version):
        for phrase in words:
            yield "log line that times a phase", phrase, any(phrase in text for text in texts)


def _attribute_checks(words: frozenset[str], version: str | None) -> Iterator[Check]:
    """Each attribute path the probe tries (the first that resolves wins, so one whole alternative suffices)."""
    path_tables: tuple[Sequence[tuple[str, tuple[str, ...]]], ...] = (
        engine.MODEL_RUNNER_PATHS, engine.FORWARD_CONTEXT_PATHS, engine.KV_CACHE_CONFIG_PATHS,
        engine.ATTN_GROUPS_PATHS, engine.DRAFT_LAYER_NAME_PATHS, engine.LAYER_BACKEND_CALLS,
        engine.LAYER_BACKEND_ATTRS, engine.TARGET_MODEL_CALLS, engine.TARGET_MODEL_PATHS)
    for table in path_tables:
        for alternatives in for_version(table, version):
            yield "probe path", " | ".join(alternatives), any(
                all(part in words for part in path.split(".")) for path in alternatives)
    for scales in for_version(engine.LAYER_SCALE_ATTRS, version):
        for scale, attrs in scales.items():
            yield f"layer {scale}", " | ".join(attrs), any(a in words for a in attrs)
    for names in for_version(engine.BUILDER_DTYPE_ATTRS, version):
        for name in names:
            yield "builder dtype attribute", name, name in words
    for name in (*engine.KV_SPEC_FIELDS, engine.PER_LAYER_SPECS_ATTR):
        yield "KV-cache spec field", name, name in words
    for args in for_version(engine.PROBE_ONLY_ARG_NAMES, version):
        for name in args.values():
            yield "probe-only engine argument", name, name in words


def speculative_config_fields_in(package: Path) -> frozenset[str]:
    """The annotated fields of SpeculativeConfig in a vLLM package's vllm/config/speculative.py (none: no file)."""
    path = package / "config" / "speculative.py"
    if not path.is_file():
        return frozenset()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "SpeculativeConfig":
            return frozenset(s.target.id for s in node.body
                             if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name))
    return frozenset()


def _speculative_checks(package: Path, version: str | None) -> Iterator[Check]:
    """Both ways: every field the table gives this release is in its SpeculativeConfig, and every field there
    that a user sets is in the table (a new field the harness would otherwise skip cells for)."""
    table = speculative.speculative_config_fields(version) or frozenset()
    source = speculative_config_fields_in(package) - speculative.FIELDS_VLLM_FILLS_IN
    for name in sorted(table):
        yield "speculative_config field", name, name in source
    for name in sorted(source - table):
        yield "speculative_config field not in the table", name, False


def main() -> int:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        print("vLLM is not installed: nothing to check", file=sys.stderr)
        return 2
    version = installed_vllm_version()
    checks = source_checks(Path(spec.origin).parent, version)
    for what, where, found in checks:
        print(f"{'ok' if found else 'MISSING':8} {what}: {where}")
    missing = sum(not found for _what, _where, found in checks)
    print(f"vLLM {version} ({spec.origin}): {len(checks)} names, {missing} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
