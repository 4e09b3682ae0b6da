"""The packages are layered: a module imports only its own unit and the layers below it (module-level and
in-function imports alike), so a low layer (what a record holds, the cases' schemas) never pulls in the run
machinery or the reports. Inside a unit the big rooms are rooms of their own: each sub-package and lone module of
harness/run/ and harness/judge/ (run/order/, run/task/, run/host/, run/process/, judge/verdict.py, ...) is a unit,
and no two of them import each other, through any chain; nor do any two modules anywhere."""

from __future__ import annotations

from collections.abc import Callable
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
# Rooms whose sub-rooms are each a unit of their own, with no circle between them.
SPLIT_ROOMS = ("kvmatrix.harness.run", "kvmatrix.harness.judge")
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


def _edges() -> dict[str, set[str]]:
    """Each module → the project's modules it imports (`from a.b import c` counts c where it is a module)."""
    known = modules()
    return {name: {t for n in imported(path) if (t := n if n in known else n.rpartition(".")[0]) in known} - {name}
            for name, path in known.items()}


def sub_room(module: str) -> str:
    """The sub-package or lone module of a split room a module belongs to (run/order/canary.py → run.order); any
    other module is its own."""
    room = next((r for r in SPLIT_ROOMS if module.startswith(r + ".")), None)
    return module if room is None else f"{room}.{module[len(room) + 1:].split('.')[0]}"


def circles(edges: dict[str, set[str]], unit: Callable[[str], str]) -> list[list[str]]:
    """The groups of units (`unit(module)`) that import each other, through any chain of imports."""
    graph: dict[str, set[str]] = {}
    for source, targets in edges.items():
        graph.setdefault(unit(source), set()).update(unit(t) for t in targets if unit(t) != unit(source))

    def reached(start: str) -> set[str]:
        seen, stack = set(), [start]
        while stack:
            for nxt in graph.get(stack.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    reach = {u: reached(u) for u in graph}
    groups = {tuple(sorted(u2 for u2 in reach[u] if u in reach.get(u2, ()))) for u in graph if u in reach[u]}
    return sorted(list(g) for g in groups)


def test_no_two_sub_rooms_of_run_or_judge_import_each_other():
    assert circles(_edges(), sub_room) == []


def test_no_two_modules_import_each_other():
    assert circles(_edges(), lambda module: module) == []


def test_a_planted_circle_between_sub_rooms_is_found():
    """process/ imports host/ (groups.py: a GPU's baseline; env.py through settings.py); host/ importing process/
    back closes a circle that no module-to-module import does (slots.py → groups.py → gpu_memory.py), and the check
    names the rooms on it."""
    edges = _edges()
    assert "kvmatrix.harness.run.host.gpu_memory" in edges["kvmatrix.harness.run.process.groups"]
    slots = "kvmatrix.harness.run.host.slots"
    planted = {**edges, slots: edges[slots] | {"kvmatrix.harness.run.process.groups"}}
    assert circles(planted, lambda module: module) == []
    assert circles(planted, sub_room) == [["kvmatrix.harness.run.host", "kvmatrix.harness.run.process",
                                           "kvmatrix.harness.run.settings"]]
