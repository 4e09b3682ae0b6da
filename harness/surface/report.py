"""The declared surface (harness/surface/declared.py) as `kvmatrix surface` shows it (its arguments are
harness/cli/surface.py's): read here, from another machine's JSON or in another vLLM environment (given as for
`kvmatrix bisect --env`); its table per GPU class; the diff of two environments' surfaces (what a release newly
promises, what it withdrew, backends added or gone); the broken promises runs of the generated cases found."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from tabulate import tabulate

from kvmatrix.harness.bisect.envs import EnvBuildError
from kvmatrix.harness.bisect.given import GivenEnv, check
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.paths import CELL_CWD, import_root
from kvmatrix.harness.surface.declared import Surface, declared_surface, summary_rows
from kvmatrix.harness.surface.promises import HEADERS, promise_table
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import case_files, load_cases, load_models, load_pool
from kvmatrix.matrix.machine import PoolError


def surface_in(env: GivenEnv) -> Surface:
    """The declared surface as `env`'s vLLM reads it (a subprocess in that environment)."""
    check(env)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "surface.json"
        done = subprocess.run([*env.command, "-m", "kvmatrix.harness.surface.declared", str(out)], capture_output=True,
                              text=True, cwd=CELL_CWD,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join([*env.path_first, str(import_root())])))
        if done.returncode != 0 or not out.exists():
            raise EnvBuildError(f"{env.spec}: the surface could not be read: {done.stderr.strip()[-500:]}")
        return Surface.from_json(json.loads(out.read_text()))


def read_surface(gpus: list[str] | None, from_json: Path | None = None) -> Surface:
    """The installed vLLM's surface for these classes of the pool (default: every class), or the one another
    machine read (its --json), cut to these classes."""
    pool = load_pool()
    unknown = [g for g in gpus or [] if g not in pool]
    if unknown:
        raise PoolError(f"GPU class {unknown[0]!r} is not in the pool; known: {', '.join(pool)}")
    if from_json is None:
        return declared_surface(pool, gpus)
    surface = Surface.from_json(json.loads(Path(from_json).read_text()))
    surface.points = [p for p in surface.points if not gpus or p.gpu_class in gpus]
    return surface


def diff_lines(old: Surface, new: Surface, old_name: str, new_name: str) -> list[str]:
    """What `new` declares differently from `old`, point by point (class, backend, KV dtype, model)."""
    before, after = {p.key: p for p in old.points}, {p.key: p for p in new.points}
    backends_before, backends_after = {p.backend for p in old.points}, {p.backend for p in new.points}
    promised = [k for k in after.keys() & before.keys() if after[k].supported and not before[k].supported]
    withdrawn = [k for k in after.keys() & before.keys() if before[k].supported and not after[k].supported]
    new_points = [k for k in after.keys() - before.keys() if after[k].supported]
    gone_points = [k for k in before.keys() - after.keys() if before[k].supported]

    def fmt(keys, side):
        return [f"  {g} {b} kv={d} ({m})" + (f": {'; '.join(side[(g, b, d, m)].reasons)}"
                                                if side[(g, b, d, m)].reasons else "") for g, b, d, m in sorted(keys)]

    lines = [f"kvmatrix surface --diff: {old_name} (vLLM {old.vllm_version}) -> {new_name} (vLLM {new.vllm_version})",
             f"backends added: {', '.join(sorted(backends_after - backends_before)) or '-'}",
             f"backends gone: {', '.join(sorted(backends_before - backends_after)) or '-'}",
             f"newly declared supported ({len(promised)}):", *fmt(promised, after),
             f"no longer declared supported ({len(withdrawn)}), with {new_name}'s reasons:", *fmt(withdrawn, after),
             f"new points declared supported ({len(new_points)}):", *fmt(new_points, after),
             f"points gone that were declared supported ({len(gone_points)}):", *fmt(gone_points, before)]
    return lines


def render(surface: Surface) -> str:
    rows = summary_rows(surface)
    lines = [f"kvmatrix surface: vLLM {surface.vllm_version}, {len(surface.points)} points",
             tabulate(rows, headers=["class", "points", "declared supported", "refused by the declaration",
                                     "refused for this install's build", "backends declared for some KV dtype"],
                      tablefmt="github")]
    if surface.unreadable:
        lines += ["", "declarations not readable in this install:",
                  *(f"  {b}: {why}" for b, why in sorted(surface.unreadable.items()))]
    return "\n".join(lines)


def promises_report(run_dirs: list[str], cases_dir: Path) -> str:
    """The broken promises the surface cells of these run folders found, per class (harness/surface/promises.py)."""
    pool = load_pool(cases_dir)
    cells = {c.cell_id: c for c in expand_all(load_cases(case_files(cases_dir)), load_models(cases_dir), pool)}
    records = [r for folder in run_dirs for r in RunDir(Path(folder)).records()]
    return tabulate(promise_table(records, cells, pool), headers=HEADERS, tablefmt="github")
