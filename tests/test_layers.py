"""The packages are layered: a module imports only its own unit and the layers below it (module-level and
in-function imports alike), so no import cycle can form and a low layer (what a record holds, the cases'
schemas) never pulls in the run machinery or the reports."""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import imported, modules

# Lowest first; units of one layer do not import each other.
LAYERS = [
    ("kvmatrix.matrix",),
    ("kvmatrix.harness.record",),
    ("kvmatrix.harness.vllm_compat",),
    ("kvmatrix.harness.models",),
    ("kvmatrix.harness.judge", "kvmatrix.harness.cell"),
    ("kvmatrix.harness.run", "kvmatrix.harness.results", "kvmatrix.harness.pipelines"),
    ("kvmatrix.reports", "kvmatrix.harness.bisect", "kvmatrix.harness.audit", "kvmatrix.harness.repro"),
    ("kvmatrix.harness.pr", "kvmatrix.harness.surface", "kvmatrix.harness.qualify", "kvmatrix.harness.finish"),
    ("kvmatrix.harness.cli",),
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str | None:
    return next((u for u in sorted(RANK, key=len, reverse=True) if module == u or module.startswith(u + ".")), None)


def _imported(path: Path) -> set[str]:
    return {n for n in imported(path) if _unit(n) is not None}


def test_every_module_belongs_to_a_layer():
    assert [name for name in modules() if name not in ("kvmatrix.harness",) and _unit(name) is None] == []


def test_no_module_imports_a_higher_layer_or_a_sibling_unit():
    wrong = []
    for name, path in modules().items():
        unit = _unit(name)
        if unit is None:
            continue
        for target in _imported(path):
            other = _unit(target)
            if other != unit and RANK[other] >= RANK[unit]:
                wrong.append(f"{name} imports {target} ({other}: layer {RANK[other]}, {unit}: layer {RANK[unit]})")
    assert wrong == []
