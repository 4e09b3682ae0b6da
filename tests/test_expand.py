"""Axes → cells: cross product, exclude, extra points, stable ids, GPU classes; conditions as terms/ranges/globs."""

from __future__ import annotations

import shutil
import tarfile

import pytest
import yaml

from kvmatrix.matrix.conditions import gpu_matches, matches, when_matches
from kvmatrix.matrix.expand import expand_all, expand_case
from kvmatrix.matrix.load import case_files, load_case, load_cases, load_models, load_pool
from kvmatrix.matrix.spelling import OldSpelling
from tests.conftest import FIXTURES, write_case


def cells_of(cases_dir, data):
    # Without the differential rule: its eager oracles for GPU classes are tests/test_differential.py's.
    path = write_case(cases_dir, "c", {"differential": False, **data})
    return expand_case(load_case(path), load_models(cases_dir), load_pool(cases_dir), str(path))


MATRIX_WITH_EXTRA = {
    "model": "llama",
    "matrix": {
        "kv_cache_dtype": ["auto", "fp8"],
        "kv_cache_dtype_skip_layers": [[], ["0", "3"]],
        "exclude": [{"kv_cache_dtype": "auto", "kv_cache_dtype_skip_layers": ["0", "3"]}],
        "extra": [{"kv_cache_dtype": "bfloat16", "speculative": "llama-dflash"}],
    },
}
CELL_IDS_WITH_EXTRA = [
    "c[kv=auto,skip=-,spec=-]",
    "c[kv=fp8,skip=-,spec=-]",
    "c[kv=fp8,skip=0+3,spec=-]",
    "c[kv=bfloat16,skip=-,spec=llama-dflash]",
    "c[kv=bfloat16,skip=-,spec=-]",  # the draft cell's no-draft twin (greedy equality), added
]


def test_cross_product_exclude_extra_and_ids(cases_dir):
    cells = cells_of(cases_dir, MATRIX_WITH_EXTRA)
    assert [c.cell_id for c in cells] == CELL_IDS_WITH_EXTRA
    assert cells[2].axes["kv_cache_dtype_skip_layers"] == ["0", "3"]
    assert cells[3].axes["kv_cache_dtype_skip_layers"] == []


def test_the_old_spelling_of_extra_points_expands_to_the_same_cells(cases_dir):
    matrix = dict(MATRIX_WITH_EXTRA["matrix"])
    old = {**MATRIX_WITH_EXTRA, "matrix": {**{k: v for k, v in matrix.items() if k != "extra"},
                                           "include": matrix["extra"]}}
    with pytest.warns(OldSpelling, match="field 'matrix.include': renamed matrix.extra"):
        cells = cells_of(cases_dir, old)
    assert [c.cell_id for c in cells] == CELL_IDS_WITH_EXTRA


def test_backend_shown_in_ids_only_when_the_case_sets_one(cases_dir):
    cells = cells_of(cases_dir, {"model": "llama", "matrix": {"attention_backend": [None, "FLASHINFER"]}})
    assert [c.cell_id for c in cells] == ["c[kv=auto,skip=-,spec=-,attn=-]", "c[kv=auto,skip=-,spec=-,attn=FLASHINFER]"]


def test_ids_are_stable_across_loads(cases_dir):
    data = {"model": "llama", "matrix": {"kv_cache_dtype": ["fp8", "auto"]}}
    assert [c.cell_id for c in cells_of(cases_dir, data)] == [c.cell_id for c in cells_of(cases_dir, data)]


def test_gpu_filters(cases_dir):
    by_range = cells_of(cases_dir, {"model": "llama", "gpus": [{"compute_capability": "<9.0"}]})[0]
    assert set(by_range.gpu_classes) == {"L4", "A100", "A10"}
    by_glob = cells_of(cases_dir, {"model": "llama", "gpus": ["RTX*", "cpu*"]})[0]
    assert set(by_glob.gpu_classes) == {"RTX-PRO-6000", "RTX-5090", "cpu-amx", "cpu-avx512", "cpu-avx2", "cpu-arm64"}
    by_memory = cells_of(cases_dir, {"model": "llama", "gpus": [{"device": "cuda", "memory_gb": ">=96"}]})[0]
    assert set(by_memory.gpu_classes) == {"H200", "B200", "RTX-PRO-6000"}


def test_condition_values():
    assert matches("fp8*", "fp8_e5m2") and not matches("fp8*", "auto")
    assert matches(["auto", "bfloat16"], "auto")
    assert matches(["0"], ["0"]) and not matches(["0"], ["0", "3"])
    assert matches([[], ["0"]], []) and matches([[], ["0"]], ["0"])
    assert matches(">=8.0,<9.0", "8.9") and not matches(">=8.0,<9.0", "9.0")
    assert matches("<0.27", "0.26.0") and not matches("<0.27", None)
    assert matches(4096, "4096")


def test_when_with_gpu_and_version():
    context = {"kv_cache_dtype": "fp8", "gpu": {"name": "L4", "compute_capability": "8.9", "device": "cuda"},
               "vllm_version": "0.26.0"}
    assert when_matches({"kv_cache_dtype": "fp8", "gpu": {"compute_capability": "<9.0"}}, context)
    assert when_matches({"gpu": "L*", "vllm_version": ">=0.25"}, context)
    assert not when_matches({"gpu": "cpu"}, context)
    assert gpu_matches([{"device": "cpu"}, "L4"], context["gpu"])


def test_expansion_grows_linearly_with_the_cells(cases_dir, monkeypatch):
    """Before, each cell looked for its differential oracle among all cells: with a workload axis, expanding grew
    with the square of the cells (8,000 cells took 56 s to list). Counted in the comparisons of cells' axes, not
    timed: four times the cells, about four times the work."""
    from kvmatrix.matrix import compared

    calls = 0
    others = compared._others

    def counted(combo):
        nonlocal calls
        calls += 1
        return others(combo)

    monkeypatch.setattr(compared, "_others", counted)
    work = {}
    for backends in (10, 40):
        path = write_case(cases_dir, "wide", {"model": "llama", "matrix": {
            "attention_backend": [f"B{i}" for i in range(backends)],
            "workload": ["plain", "shared_prefix", "chunked_prefill", "preemption"]}})
        calls = 0
        cells = expand_case(load_case(path), load_models(cases_dir), load_pool(cases_dir), str(path))
        work[len(cells)] = calls
    (few, few_calls), (many, many_calls) = sorted(work.items())
    assert many >= 3.8 * few  # four times the backends; the model reference and its eager twin added once each
    assert many_calls <= 4.5 * few_calls, work


def test_frozen_cases_in_the_old_spelling_expand_as_when_rewritten(tmp_path):
    """tests/fixtures/judged-cpu/cases.tar.gz was frozen with `matrix.include`: it loads (warned of) and expands to
    exactly the cells of the same files with `matrix.extra`."""
    with tarfile.open(FIXTURES / "judged-cpu" / "cases.tar.gz") as tar:
        tar.extractall(tmp_path / "old", filter="data")
    old = tmp_path / "old" / "cases"
    new = tmp_path / "new"
    shutil.copytree(old, new)
    rewritten = []
    for path in new.glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and "include" in (data.get("matrix") or {}):
            data["matrix"]["extra"] = data["matrix"].pop("include")
            path.write_text(yaml.safe_dump(data, sort_keys=False))
            rewritten.append(path.stem)
    assert rewritten, "the frozen cases still hold the old spelling"

    def cell_ids(folder):
        models, pool = load_models(folder), load_pool(folder)
        return [c.cell_id for c in expand_all(load_cases(case_files(folder)), models, pool)]

    with pytest.warns(OldSpelling, match="field 'matrix.include'"):
        before = cell_ids(old)
    assert before == cell_ids(new) and len(before) > 100
