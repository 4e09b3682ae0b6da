"""Models are built as their cells start (harness/run/models.py: ensure_models): each once, however many cells of
it start together, and a build that failed is not tried again for every cell."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from harness.models import tiny
from harness.run import models as run_models
from matrix.schema import ModelEntry


class _Cell:
    def __init__(self, model: str) -> None:
        self.model, self.axes = model, {"speculative": None}


class _Task:
    def __init__(self, model: str) -> None:
        self.cell = _Cell(model)


def test_concurrent_cells_build_their_model_once(tmp_path, monkeypatch):
    calls: list[str] = []

    def slow_build(name: str, cache_dir: Path) -> Path:
        calls.append(name)
        time.sleep(0.2)
        folder = Path(cache_dir) / name
        folder.mkdir()
        return folder

    monkeypatch.setattr(tiny, "build", slow_build)
    models = {"llama": ModelEntry(tiny="llama"), "hub": ModelEntry(hub_id="org/model")}
    built: dict[str, Path] = {}
    threads = [threading.Thread(target=run_models.ensure_models, args=(_Task("llama"), models, tmp_path, built))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["llama"] and built == {"llama": tmp_path / "llama"}
    run_models.ensure_models(_Task("hub"), models, tmp_path, built)  # a hub-only model has nothing to build
    assert built == {"llama": tmp_path / "llama"}
    # A folder named but missing here (a Ray node given the head's paths) is built again.
    node_built = {"llama": tmp_path / "elsewhere"}
    (tmp_path / "llama").rmdir()
    run_models.ensure_models(_Task("llama"), models, tmp_path, node_built)
    assert calls == ["llama", "llama"] and node_built == {"llama": tmp_path / "llama"}


def test_a_failed_build_is_tried_once_and_its_cells_go_on(tmp_path, monkeypatch, capsys):
    calls: list[str] = []

    def broken_build(name: str, cache_dir: Path) -> Path:
        calls.append(name)
        raise OSError("disk full")

    monkeypatch.setattr(tiny, "build", broken_build)
    models = {"llama": ModelEntry(tiny="llama")}
    built: dict[str, Path] = {}
    for _ in range(3):
        run_models.ensure_models(_Task("llama"), models, tmp_path, built)
    assert calls == ["llama"] and built == {}
    assert "building llama (llama) failed: OSError('disk full')" in capsys.readouterr().err
