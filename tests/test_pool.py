"""The pool at run time: class detection, refusal to run as another class, emulation, GPU slots."""

from __future__ import annotations

import pytest

from harness.records import RunDir
from harness.runner import RunSettings
from harness.session import Session
from matrix.load import load_pool
from matrix.pool import LocalDevice, PoolError, class_of, resolve

POOL = load_pool()
H200 = LocalDevice("NVIDIA H200", "9.0", 1)
CPU = LocalDevice("cpu", None, 0)


def test_detects_classes_by_driver_name():
    assert class_of(H200, POOL) == "H200"
    assert class_of(LocalDevice("NVIDIA A100-SXM4-80GB", "8.0", 8), POOL) == "A100"
    assert class_of(CPU, POOL) == "cpu"
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


def session(gpu: str, emulated_from: str | None, devices: int) -> Session:
    settings = RunSettings(run_dir=RunDir("/nonexistent"), models={}, built={}, vllm_version=None, cache_dir=None)
    return Session(settings, gpu, POOL[gpu], emulated_from, POOL, devices)


def test_slots_pin_one_gpu_each_and_pack_by_the_real_class():
    two_h200 = session("H200", None, 2)
    assert two_h200.slots == 2 * POOL["H200"].slots_per_device
    devices = [two_h200.slot_env(s)["CUDA_VISIBLE_DEVICES"] for s in range(two_h200.slots)]
    assert devices == ["0"] * POOL["H200"].slots_per_device + ["1"] * POOL["H200"].slots_per_device
    as_l4 = session("L4", "H200", 1)  # emulated: packed as the H200 it runs on, not as a 24 GB L4
    assert as_l4.slots == POOL["H200"].slots_per_device and as_l4.slot_env(3)["CUDA_VISIBLE_DEVICES"] == "0"
    assert session("cpu", None, 0).slot_env(0) == {}
