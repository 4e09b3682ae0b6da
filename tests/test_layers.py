"""The packages are layered: a module imports only its own unit and the layers below it (module-level and
in-function imports alike), so no import cycle can form and a low layer (what a record holds, the cases'
schemas) never pulls in the run machinery or the reports."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Lowest first; units of one layer do not import each other.
LAYERS = [
    ("kvmatrix.matrix",),
    ("kvmatrix.harness.record",),
    ("kvmatrix.harness.vllm_compat",),
    ("kvmatrix.harness.models",),
    ("kvmatrix.harness.judge", "kvmatrix.harness.cell"),
    ("kvmatrix.harness.run", "kvmatrix.harness.nightly"),
    ("kvmatrix.reports", "kvmatrix.harness.bisect", "kvmatrix.harness.audit", "kvmatrix.harness.repro"),
    ("kvmatrix.harness.pr", "kvmatrix.harness.surface", "kvmatrix.harness.qualify"),
    ("kvmatrix.harness.cli",),
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def _modules() -> dict[str, Path]:
    out = {}
    for path in [*REPO.glob("harness/**/*.py"), *REPO.glob("matrix/*.py"), *REPO.glob("reports/*.py")]:
        name = ".".join(("kvmatrix", *path.relative_to(REPO).with_suffix("").parts)).removesuffix(".__init__")
        out[name] = path
    return out


def _unit(module: str) -> str | None:
    return next((u for u in sorted(RANK, key=len, reverse=True) if module == u or module.startswith(u + ".")), None)


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from kvmatrix.harness import vllm_compat` imports the sub-package itself
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {n for n in names if _unit(n) is not None}


def test_every_module_belongs_to_a_layer():
    assert [name for name in _modules() if name not in ("kvmatrix.harness",) and _unit(name) is None] == []


def test_no_module_imports_a_higher_layer_or_a_sibling_unit():
    wrong = []
    for name, path in _modules().items():
        unit = _unit(name)
        if unit is None:
            continue
        for target in _imported(path):
            other = _unit(target)
            if other != unit and RANK[other] >= RANK[unit]:
                wrong.append(f"{name} imports {target} ({other}: layer {RANK[other]}, {unit}: layer {RANK[unit]})")
    assert wrong == []
