"""Models are built as their cells start (harness/run/model_builds.py: ensure_models): each once, however many cells of
it start together, and a build that failed is not tried again for every cell; what a build sets in the harness's
environment reaches no cell."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from kvmatrix.harness.models import tiny, trained
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.paths import PACKAGE_ROOT
from kvmatrix.harness.run import model_builds
from kvmatrix.harness.run.process.env import cell_env
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.matrix.schema import ModelEntry


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
    threads = [threading.Thread(target=model_builds.ensure_models, args=(_Task("llama"), models, tmp_path, built))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["llama"] and built == {"llama": tmp_path / "llama"}
    model_builds.ensure_models(_Task("hub"), models, tmp_path, built)  # a hub-only model has nothing to build
    assert built == {"llama": tmp_path / "llama"}
    # A folder named but missing here (a Ray node given the head's paths) is built again.
    node_built = {"llama": tmp_path / "elsewhere"}
    (tmp_path / "llama").rmdir()
    model_builds.ensure_models(_Task("llama"), models, tmp_path, node_built)
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
        model_builds.ensure_models(_Task("llama"), models, tmp_path, built)
    assert calls == ["llama"] and built == {}
    assert "building llama (llama) failed: OSError('disk full')" in capsys.readouterr().err


def test_cells_start_from_the_environment_the_run_began_with(tmp_path, monkeypatch):
    # As sklearn does when a build imports transformers, while the other slot starts its cells: measured on a
    # default CPU matrix (2026-12-03), those cells needed a second template and warm workers of their own.
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models={}, built={}, vllm_version="fake",
                           cache_dir=tmp_path / "cache")
    before = cell_env(settings)
    monkeypatch.setenv("KMP_INIT_AT_FORK", "FALSE")
    monkeypatch.setenv("KMP_DUPLICATE_LIB_OK", "True")
    assert cell_env(settings) == before


def test_the_trained_family_builds_one_model_at_a_time(tmp_path, monkeypatch):
    """Every trained builder needs the one training, which draws from torch's global generator: two slots'
    threads must not train side by side (the FP8-KV builders build the trained model inside their own build)."""
    inside: set[int] = set()
    most = [0]
    lock = threading.Lock()

    def family_build(name: str, cache_dir: Path, **options) -> Path:
        with lock:
            inside.add(threading.get_ident())
            most[0] = max(most[0], len(inside))
        time.sleep(0.1)
        if name != "trained_llama":
            trained.build("trained_llama", cache_dir)  # nested, in the same thread
        with lock:
            inside.discard(threading.get_ident())
        return Path(cache_dir) / name

    monkeypatch.setattr(trained._FAMILY, "build", family_build)
    threads = [threading.Thread(target=trained.build, args=(name, tmp_path))
               for name in ("trained_llama", "trained_llama_ct_clipping", "trained_llama_ct")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert most[0] == 1


CONCURRENT_BUILDS = textwrap.dedent("""
    import sys, threading
    from pathlib import Path
    from kvmatrix.harness.run import model_builds
    from kvmatrix.matrix.load import CASES_DIR, load_models

    class Task:
        def __init__(self, model):
            self.cell = type("Cell", (), {"model": model, "axes": {"speculative": None}})()

    models, cache, together = load_models(CASES_DIR), Path(sys.argv[1]), sys.argv[2] == "together"
    names = sys.argv[3:]
    built = {}
    if together:  # the first builds of a fresh process, side by side: the libraries are imported then
        threads = [threading.Thread(target=model_builds.ensure_models, args=(Task(n), models, cache, built))
                   for n in names]
        [t.start() for t in threads]
        [t.join() for t in threads]
    else:
        for n in names:
            model_builds.ensure_models(Task(n), models, cache, built)
    print("BUILT", sorted(built))
    print("IMPORTED transformers:", "transformers" in sys.modules)
""")


def test_models_built_side_by_side_in_a_fresh_process_equal_those_built_one_by_one(tmp_path):
    """Four tiny models, as four slots' first cells build them on a cold machine: each builds, and each file is
    byte for byte the one a lone build writes. A process finding them built again imports no transformers (nor
    the torch it brings) to learn it: ~1.5 s of each `kvmatrix run`'s start on 2 cores."""
    names = ["llama", "deepseek-mla", "gemma3", "nemotron-h"]

    def build(folder: str, mode: str) -> str:
        proc = subprocess.run([sys.executable, "-c", CONCURRENT_BUILDS, str(tmp_path / folder), mode, *names],
                              env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)}, capture_output=True, text=True,
                              timeout=600)
        assert f"BUILT {sorted(names)}" in proc.stdout, proc.stderr[-3000:]
        return proc.stdout

    for mode in ("together", "alone"):
        assert "IMPORTED transformers: True" in build(mode, mode)
    assert "IMPORTED transformers: False" in build("alone", "alone")

    def contents(root: Path) -> dict[str, str]:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}

    together, alone = contents(tmp_path / "together"), contents(tmp_path / "alone")
    assert len({name.split("/")[0] for name in alone}) == len(names)
    assert together == alone


# A builder that records its build and finishes only once both processes are on their way to build_once.
SHARED_CACHE_BUILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kvmatrix.harness.models.cache import build_once

    cache, log = Path(sys.argv[1]), Path(sys.argv[2])

    def builder(out):
        with log.open("a") as f:
            f.write("built\\n")
        deadline = time.monotonic() + 60
        while log.read_text().count("arrived") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the other process, arrived, is past its look for the folder: waiting, or building too
        (out / "weights").write_text("w")

    with log.open("a") as f:
        f.write("arrived\\n")
    print(build_once(cache, "model", builder))
""")


def test_two_processes_sharing_a_cache_train_a_model_once(tmp_path):
    """Two runs (or two test workers) needing the same model at once: one builds it, the other waits for that
    build and takes it, not a second training of the same weights (a fresh clone's test workers trained each
    model twice)."""
    cache, log = tmp_path / "cache", tmp_path / "log"
    log.touch()
    builders = [subprocess.Popen([sys.executable, "-c", SHARED_CACHE_BUILD, str(cache), str(log)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    said = [builder.communicate(timeout=120) for builder in builders]
    assert [builder.returncode for builder in builders] == [0, 0], said
    assert [out.strip() for out, _ in said] == [str(cache / "model")] * 2
    assert log.read_text().count("built") == 1, log.read_text()
    assert (cache / "model" / "weights").read_text() == "w"
