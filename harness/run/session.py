"""A run's setting, shared by the `kvmatrix` command and the pytest front end: which GPU class, which results
folder, which vLLM, which caches, and the models the cells need."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvmatrix.harness.judge.waivers import WAIVERS_FILE, Waiver, load_waivers
from kvmatrix.harness.models.tiny import layers_of
from kvmatrix.harness.record.files import RUNS_DIR, RunDir
from kvmatrix.harness.record.paths import DEFAULT_CACHE
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.host.gpu_memory import open_gpu_memory
from kvmatrix.harness.run.host.slots import Slots, slot_count, usable_cores
from kvmatrix.harness.run.model_builds import build_models
from kvmatrix.harness.run.run_ids import new_run_id
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.skips import not_run_reason
from kvmatrix.harness.vllm_compat import (
    SIGNATURE_FAMILIES,
    SIGNATURES,
    detect_cpu_isa,
    installed_vllm_version,
    known_engine_args,
    known_env_vars,
    known_kv_cache_dtypes,
    skip_layer_words,
)
from kvmatrix.harness.vllm_compat.speculative import SPECULATIVE_CONFIG_FIELDS
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.load import CASES_DIR, load_models, load_pool, shared_file
from kvmatrix.matrix.machine import LocalDevice, PoolError, detect_device, resolve
from kvmatrix.matrix.schema import GpuClass, ModelEntry, Vocabulary


def vllm_vocabulary(models: dict[str, ModelEntry] | None = None) -> Vocabulary:
    """Case files are checked against the installed vLLM's own dtype names, engine arguments and skip-list words,
    the failure names the classifier knows, and the layers of the registry's local models."""
    layers = {name: count for name, entry in (models or {}).items() if entry.tiny
              if (count := layers_of(entry.tiny, entry.draft.method if entry.draft else None)) is not None}
    signatures = frozenset(name for name, _, _ in SIGNATURES) | frozenset(SIGNATURE_FAMILIES)
    return Vocabulary(known_kv_cache_dtypes(), known_engine_args(), known_env_vars(), signatures,
                      skip_layer_words(), model_layers=layers,
                      speculative_fields=frozenset().union(*(f for _, f in SPECULATIVE_CONFIG_FIELDS)))


@dataclass
class Session:
    settings: RunSettings
    gpu_name: str
    gpu: GpuClass
    emulated_from: str | None
    pool: dict[str, GpuClass]
    device_count: int = 0
    cores: tuple[int, ...] = field(default_factory=usable_cores)
    device_memory_gib: float | None = None

    @property
    def run_dir(self) -> RunDir:
        return self.settings.run_dir

    def tasks(self, cells: list[Cell]) -> list[Task]:
        return [Task(c, self.gpu_name, self.gpu, self.emulated_from) for c in cells if self.gpu_name in c.gpu_classes]

    @property
    def host(self) -> GpuClass:
        """The class of the card cells really run on (the emulated class only steers vLLM's decisions)."""
        return self.pool.get(self.emulated_from, self.gpu) if self.emulated_from else self.gpu

    def slots(self, jobs: int = 0) -> Slots:
        """`jobs` cells at once if asked, else every GPU packed with its class's `slots_per_device` cells, within
        its memory and the host's cores (harness/run/host/slots.py)."""
        count = jobs or slot_count(self.host, self.device_count, len(self.cores), self.device_memory_gib)
        return Slots(count, self.host, self.device_count, self.cores)

    def build_models(self, tasks: list[Task]) -> None:
        """The tiny models of the tasks that will run: a cell skipped here (its class, this vLLM, no lm-eval for
        an accuracy cell) costs no build (training one takes a minute)."""
        if self.settings.use_hub:
            return
        settings = self.settings
        running = [t for t in tasks if not_run_reason(t, settings) is None]
        settings.built.update(build_models(running, settings.models, settings.cache_dir / "models"))


def waivers_lent(cases_dir: Path) -> bool:
    """Whether a cases folder judges with the default case set's waivers file (it has none of its own): its lines
    name cells of cases/ and classes of the default pool."""
    return shared_file(cases_dir, WAIVERS_FILE.name) != Path(cases_dir) / WAIVERS_FILE.name


def session_waivers(cases_dir: Path, pool: dict[str, GpuClass]) -> list[Waiver]:
    """The known failures of a cases folder: its own waivers file, checked against its pool, or the default case
    set's, checked against the default pool they name classes of; a bad file raises WaiverError."""
    lent = waivers_lent(cases_dir)
    return load_waivers(shared_file(cases_dir, WAIVERS_FILE.name), load_pool(CASES_DIR) if lent else pool)


def this_device() -> LocalDevice:
    """This machine's GPUs, or its CPU's architecture and level as vLLM sees them."""
    return detect_device(lambda machine: detect_cpu_isa(machine, installed_vllm_version()))


def open_session(
    *,
    gpu: str | None = None,
    emulate: bool = False,
    run_id: str | None = None,
    runs_dir: Path = RUNS_DIR,
    cache_dir: Path = DEFAULT_CACHE,
    cases_dir: Path = CASES_DIR,
    use_hub: bool = False,
    timeout_scale: float = 1.0,
    probe_only: bool = False,
    on_ray: bool = False,
    with_waivers: bool = True,
) -> Session:
    """`on_ray`: the cells run on a Ray cluster's nodes of class `gpu`, whatever this machine is. Records are
    judged with the known failures of `cases_dir` (its _waivers.txt) unless `with_waivers` is False (bisection
    looks for the raw verdict)."""
    pool = load_pool(cases_dir)
    if on_ray and gpu is not None:
        if gpu not in pool:
            raise PoolError(f"GPU class {gpu!r} is not in the pool; known: {', '.join(pool)}")
        gpu_name, emulated_from, device_count, memory = gpu, None, 0, None
    else:
        device = this_device()
        (gpu_name, emulated_from), device_count = resolve(gpu, pool, device, emulate), device.count
        memory = device.memory_gib
    version = installed_vllm_version()
    run_id = run_id or new_run_id(gpu_name, version, runs_dir)  # a new folder unless an earlier run is named
    settings = RunSettings(
        run_dir=RunDir(Path(runs_dir) / run_id), models=load_models(cases_dir), built={},
        vllm_version=version, cache_dir=Path(cache_dir), use_hub=use_hub, timeout_scale=timeout_scale,
        probe_only=probe_only,
        gpu_memory=None if on_ray else open_gpu_memory(),  # the GPUs cells run on here (Ray nodes: not checked)
        waivers=session_waivers(Path(cases_dir), pool) if with_waivers else [],
        gpus_here=None if on_ray else (device_count if pool[emulated_from or gpu_name].device == "cuda" else 0),
    )
    return Session(settings, gpu_name, pool[gpu_name], emulated_from, pool, device_count,
                   device_memory_gib=memory)
