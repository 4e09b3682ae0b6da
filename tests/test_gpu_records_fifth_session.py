"""vLLM 0.33.0 (torch 2.14.0+cu130) on the lent H200, 2026-12-03, fifth device session, judged again under the
shipped case files (and 0.33.0's generated surface cases, `logs/surf33-cases/`):
- `kvruns/h200-as-L4-vllm0.33.0-graphs`: the emulated L4's whole matrix (the third session's folder with the
  fourth's tail merged in, resumed: its last 67 cells in 777 s, 4 slots);
- `kvruns/h200-as-B200-vllm0.33.0-graphs`: the emulated B200, resumed as far as the device time went (143 of 214);
- `kvruns/h200-{cold,warm}-subset-vllm0.33.0`: 22 real H200 cells run twice on one cache folder, first empty
  (`logs/times.log`: 564 s, then 163 s, 2 slots, beside the emulated runs);
- `kvruns/h200-as-A100-surface-vllm0.33.0`: the surface's promises on the emulated A100 (28 of 38);
- `kvruns/h200-surface-refusals-vllm0.33.0`: the refusals of FLASH_ATTN and FLASHINFER on the H200 (18 of 33).
"""

from __future__ import annotations

from collections import Counter

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.rejudge import rejudge_run
from kvmatrix.harness.surface.promises import promise_table
from kvmatrix.harness.vllm_compat import boundary_keeps_every_layer
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import case_files, load_cases, load_models
from tests.conftest import FIXTURES, judged_archive_fixtures, shipped_matrix

ARCHIVE = FIXTURES / "runs" / "h200-graphs-vllm-0.33.0-2026-12-03-fifth.tar.xz"
RUNS = {"L4": "kvruns/h200-as-L4-vllm0.33.0-graphs", "B200": "kvruns/h200-as-B200-vllm0.33.0-graphs"}

unpacked, judged = judged_archive_fixtures(ARCHIVE, RUNS, "0.33.0")


def test_the_emulated_l4s_whole_matrix_has_no_unexplained_failure(judged):
    """All 210 L4 cells: the xfails are waived findings and expected failures, the skips the hub models, the
    two-GPU cells and the cells the emulation cannot run."""
    assert Counter(r["verdict"] for r in judged["L4"].values()) == {"pass": 156, "xfail": 34, "skip": 20}


def test_fa4s_fp8_query_assert_on_the_emulated_b200_is_the_emulation(judged):
    """vLLM's FLASH_ATTN backend quantizes the query by the emulated capability (SM100), while vllm_flash_attn
    takes its SM90 fp8-KV dequant path, which wants a 16-bit query, by the real card: not emulable, never a FAIL
    (the fp8 target, the DFlash draft of the fp8 checkpoint, FLASH_ATTN forced with fp8)."""
    records = judged["B200"]
    assert Counter(r["verdict"] for r in records.values()) == {"pass": 70, "xfail": 12, "skip": 61}
    fa4 = [r for r in records.values() if "fp8_kv_dequant requires fp16 or bf16 Q" in (r.get("error_tail") or "")]
    assert len(fa4) == 6
    assert all(r["verdict"] == "skip" and r["not_emulable"] and r["signature"] == "kernel_checks_real_arch"
               for r in fa4)
    assert "ct-draft[kv=auto,skip=-,spec=llama-dflash]" in {r["cell_id"] for r in fa4}


def test_warm_caches_resolve_the_same_state_as_cold_ones(unpacked):
    """The same 22 H200 cells on an empty cache folder, then again on the caches the first run filled: every cell
    passes both times with the same backends, KV dtypes, page sizes and tokens."""
    pool, cells, waivers = shipped_matrix()
    cold, warm = ({r["cell_id"]: r for r in rejudge_run(RunDir(unpacked / "kvruns" / f"h200-{run}-subset-vllm0.33.0"),
                                                        cells, pool, waivers)} for run in ("cold", "warm"))
    assert cold.keys() == warm.keys() and len(cold) == 22
    for cell_id, record in cold.items():
        again = warm[cell_id]
        assert record["verdict"] == again["verdict"] == "pass", cell_id
        assert [(x["backend"], x["kv_cache_dtype"], x["page_size_bytes"]) for x in record["layers"]] == \
            [(x["backend"], x["kv_cache_dtype"], x["page_size_bytes"]) for x in again["layers"]], cell_id
        assert record["tokens"] == again["tokens"], cell_id


@pytest.fixture(scope="module")
def surface_cells(unpacked):
    cases = unpacked / "logs" / "surf33-cases"
    pool, _, _ = shipped_matrix()
    return {c.cell_id: c for c in expand_all(load_cases(case_files(cases)), load_models(cases), pool)}


def test_surface_promises_on_the_emulated_a100(unpacked, surface_cells):
    """28 of the A100's 38 declared points: 16 kept; float16 refused by VllmConfig on the bf16 models although
    declared (4), Triton's fp8 refused on SM80 (6) and TurboQuant's and UltraQuant's own dtypes (2)."""
    pool, _, waivers = shipped_matrix()
    records = rejudge_run(RunDir(unpacked / "kvruns" / "h200-as-A100-surface-vllm0.33.0"), surface_cells, pool,
                          waivers)
    (row,) = promise_table(records, surface_cells, pool)
    assert row[:5] == ["A100", 28, 16, 4, 8]
    refused = Counter(r["signature"] for r in records if r["verdict"] == "fail")
    assert refused == {"kv_dtype_incompatible_with_model_dtype": 4, "fp8_unsupported_arch": 6,
                       "unsupported_kv_cache_dtype": 2}


def test_surface_refusals_on_the_h200_and_the_points_no_layer_exercised(unpacked, surface_cells):
    """18 refused points of FLASH_ATTN and FLASHINFER: 16 refused as declared; TurboQuant's 3- and 4-bit `_nc`
    dtypes on FLASH_ATTN ran because vLLM keeps a dense model's first and last 2 attention layers at the model's
    dtype under them, and the tiny llama has 4: no layer used them, so the refusal was never put to the test
    (skip, not a FAIL and not a kept promise)."""
    pool, _, waivers = shipped_matrix()
    records = rejudge_run(RunDir(unpacked / "kvruns" / "h200-surface-refusals-vllm0.33.0"), surface_cells, pool,
                          waivers)
    assert Counter(r["verdict"] for r in records) == {"pass": 16, "skip": 2}
    (row,) = promise_table(records, surface_cells, pool)
    assert row[:3] == ["H200", 16, 16]
    for record in (r for r in records if r["verdict"] == "skip"):
        assert record["axes"]["kv_cache_dtype"] in ("turboquant_3bit_nc", "turboquant_4bit_nc")
        assert {x["kv_cache_dtype"] for x in record["layers"]} == {"auto"} and len(record["layers"]) == 4
        assert "first and last 2 attention layers" in record["reason"]


def test_boundary_kept_dtypes_cover_a_model_only_up_to_twice_the_boundary():
    assert boundary_keeps_every_layer("turboquant_3bit_nc", 4, "0.33.0") == 2
    assert boundary_keeps_every_layer("ultraquant_4bit", 3, "0.32.0") == 2
    assert boundary_keeps_every_layer("turboquant_3bit_nc", 5, "0.33.0") is None
    assert boundary_keeps_every_layer("fp8", 4, "0.33.0") is None
    assert boundary_keeps_every_layer("turboquant_3bit_nc", 4, "0.26.0") is None
