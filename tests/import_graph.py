"""The project's imports, read from the code with an ast walk (module-level and in-function imports alike): the
data behind tests/test_layers.py, and a drawing of the rooms for a person.

`python -m tests.import_graph` prints each room (a package of harness/, or matrix/, reports/) with the rooms it
imports and how many module-to-module imports make each arrow; `python -m tests.import_graph harness/run` prints
the modules of one room with theirs (imports within the room only), so a redesign can be drawn before and after.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def modules() -> dict[str, Path]:
    """Every module of the project by its import name (kvmatrix.harness.run.plan → harness/run/plan.py)."""
    out = {}
    for path in [*REPO.glob("harness/**/*.py"), *REPO.glob("matrix/*.py"), *REPO.glob("reports/*.py")]:
        name = ".".join(("kvmatrix", *path.relative_to(REPO).with_suffix("").parts)).removesuffix(".__init__")
        out[name] = path
    return out


def imported(path: Path) -> set[str]:
    """The absolute import names a module uses; `from kvmatrix.harness import vllm_compat` names the sub-package."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {n for n in names if n.startswith("kvmatrix.")}


def room(module: str) -> str:
    """harness/<package>, harness/<module> for a lone module, or matrix / reports."""
    parts = module.split(".")[1:]
    return "/".join(parts[:2] if parts[0] == "harness" and len(parts) > 1 else parts[:1])


def arrows(inside: str | None = None) -> Counter[tuple[str, str]]:
    """(from, to) → how many modules of one import modules of the other: between rooms, or between the modules of
    room `inside` (e.g. harness/run)."""
    known = modules()
    counted: Counter[tuple[str, str]] = Counter()
    for name, path in known.items():
        # `from a.b import c` names a.b and a.b.c: c counts where it is a module, else a.b does
        targets = {t for n in imported(path) if (t := n if n in known else n.rpartition(".")[0]) in known}
        for target in targets - {name}:
            if inside is None:
                if room(name) != room(target):
                    counted[room(name), room(target)] += 1
            elif room(name) == inside == room(target):
                counted[_short(name, inside), _short(target, inside)] += 1
    return counted


def _short(module: str, inside: str) -> str:
    package = "kvmatrix." + inside.replace("/", ".")
    return "__init__" if module == package else module.removeprefix(package + ".")


def drawing(inside: str | None = None) -> str:
    counted = arrows(inside)
    names = sorted({a for a, _ in counted} | {b for _, b in counted})
    if inside is not None:
        names = sorted(set(names) | {_short(m, inside) for m in modules() if room(m) == inside})
    lines = [f"{'room' if inside is None else inside + ' module'} -> what it imports (modules)"]
    for name in names:
        out = sorted((b, n) for (a, b), n in counted.items() if a == name)
        lines.append(f"{name:32} -> " + (", ".join(f"{b} ({n})" for b, n in out) or "-"))
    return "\n".join(lines)


if __name__ == "__main__":
    print(drawing(sys.argv[1].strip("/") if len(sys.argv) > 1 else None))
