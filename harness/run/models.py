"""Building the tiny local models a run needs, once per run, before any cell starts (cells only read them)."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.run.engine_args import models_needed
from matrix.schema import ModelEntry


def build_models(tasks: list, models: dict[str, ModelEntry], cache_dir: Path) -> dict[str, Path]:
    """name → checkpoint folder for every registry model the tasks use. A model that fails to build is left
    out (its cells then end as `error` naming it); the others still run."""
    from harness.models import tiny as tiny_models  # torch is imported only when models are built
    from harness.models import trained as trained_models

    built: dict[str, Path] = {}
    for name in dict.fromkeys(n for t in tasks for n in models_needed(t.cell)):
        entry = models[name]
        if entry.tiny is None:
            continue
        try:
            builder = trained_models if entry.tiny in trained_models.BUILDERS else tiny_models
            built[name] = builder.build(entry.tiny, cache_dir)
        except Exception as err:  # noqa: BLE001 - any builder failure must not stop the other models
            print(f"kvmatrix: building {name} ({entry.tiny}) failed: {err!r}", file=sys.stderr)
    return built
