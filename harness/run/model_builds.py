"""Building the tiny local models a run needs (cells only read them): before a run, or as its cells start."""

from __future__ import annotations

import sys
import threading
from collections import defaultdict
from pathlib import Path

from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.schema import ModelEntry

# One builder per model at a time within this harness; other processes are kept apart by build_once's atomic rename.
_BUILDING: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
_FAILED: set[tuple[str, str]] = set()  # (cache folder, model): a build that failed is not tried again per cell
# The builders' libraries are imported by one thread at a time: transformers' lazy top-level import is not
# thread-safe (on a cold H200 a slot's build failed with "cannot import name 'LlamaConfig' from 'transformers'"
# while another slot's build was importing it).
_IMPORTING = threading.Lock()


def models_needed(cell: Cell) -> list[str]:
    """The registry models a cell runs: its model, and its draft's where it decodes speculatively."""
    return [cell.model] + ([cell.axes["speculative"]] if cell.axes["speculative"] else [])


def build_models(tasks: list, models: dict[str, ModelEntry], cache_dir: Path) -> dict[str, Path]:
    """name → checkpoint folder for every registry model the tasks use. A model that fails to build is left
    out (its cells then end as `error` naming it); the others still run."""
    built: dict[str, Path] = {}
    for name in dict.fromkeys(n for t in tasks for n in models_needed(t.cell)):
        path = _build(name, models[name], cache_dir)
        if path is not None:
            built[name] = path
    return built


def ensure_models(task, models: dict[str, ModelEntry], cache_dir: Path, built: dict[str, Path]) -> None:
    """Build what `task` needs and `built` lacks (or names a folder missing here: a Ray node gets the head's
    paths), into `built`, as its cell starts: the other slots run cells of other models meanwhile (before this,
    a cold H200 run spent its first 57 s training the accuracy model while no cell ran)."""
    for name in unbuilt(task, models, built):
        with _BUILDING[name]:
            if not _present(built, name) and (path := _build(name, models[name], cache_dir)) is not None:
                built[name] = path


def unbuilt(task, models: dict[str, ModelEntry], built: dict[str, Path]) -> list[str]:
    """The local models `task` needs that are not built yet (hub-only ones are never built)."""
    return [n for n in models_needed(task.cell) if models[n].tiny is not None and not _present(built, n)]


def trainings_waited_on(task, models: dict[str, ModelEntry], built: dict[str, Path]) -> set[str]:
    """The training `task` would wait for as it starts, if any: the trained family's builders share one training
    of a minute or more, one build at a time. Random-weight models build in seconds, not worth reordering a run
    for (on a cold H200, passing over cells for a llama build started the FlashInfer pilots 30 and 56 s late)."""
    return {"trained family" for n in unbuilt(task, models, built) if _trained_builder(models[n].tiny)}


def _trained_builder(tiny: str | None) -> bool:
    from kvmatrix.harness.models import trained as trained_models  # no torch at import
    from kvmatrix.harness.models import trained_draft

    return tiny in trained_models.BUILDERS or tiny in trained_draft.BUILDERS


class TrainingAhead:
    """The trained family's models trained in a thread of their own from the run's start, while the template
    imports vLLM and the first cells run: a cell of theirs would otherwise start the training in its slot once it
    came up (a fresh clone's 2-core CPU run began it after 40 s, when both slots had cells to run). `busy()` is what
    cells must not wait for while it trains (as `trainings_waited_on` names it)."""

    def __init__(self, tasks: list, models: dict[str, ModelEntry], cache_dir: Path, built: dict[str, Path]) -> None:
        training = [t for t in tasks if trainings_waited_on(t, models, built)]
        self.thread = None
        if training:
            def train() -> None:
                for task in training:
                    ensure_models(task, models, cache_dir, built)

            self.thread = threading.Thread(target=train, name="kvmatrix-training", daemon=True)
            self.thread.start()

    def busy(self) -> set[str]:
        return {"trained family"} if self.thread is not None and self.thread.is_alive() else set()


def _present(built: dict[str, Path], name: str) -> bool:
    return name in built and Path(built[name]).exists()


def _build(name: str, entry: ModelEntry, cache_dir: Path) -> Path | None:
    if entry.tiny is None or (str(cache_dir), name) in _FAILED:
        return None
    with _IMPORTING:  # the builders import torch and transformers only inside a build
        from kvmatrix.harness.models import tiny as tiny_models
        from kvmatrix.harness.models import trained as trained_models
        from kvmatrix.harness.models import trained_draft

    try:
        builder = next((family for family in (trained_models, trained_draft) if entry.tiny in family.BUILDERS),
                       tiny_models)
        if not (cache_dir / builder.folder_name(entry.tiny)).is_dir():
            with _IMPORTING:  # one thread at a time, and only to build: a model already built costs no import
                import transformers  # noqa: F401
        return builder.build(entry.tiny, cache_dir)
    except Exception as err:  # noqa: BLE001 - any builder failure must not stop the other models
        _FAILED.add((str(cache_dir), name))
        print(f"kvmatrix: building {name} ({entry.tiny}) failed: {err!r}", file=sys.stderr)
        return None

