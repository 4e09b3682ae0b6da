"""The issue draft beside a minimal reproducer: its title and first paragraph say what vLLM did (the exception, its
signature and the vLLM function that raised it; or the value it resolved wrong), before the environment and the
script. Records and script output captured on the H200 with vLLM 0.34.0 (tests/fixtures/runs/)."""

from __future__ import annotations

import json
import tarfile

from kvmatrix.harness.repro import issue
from tests.conftest import FIXTURES

DRAFT_FP8 = "H200--spec-draft-backends[kv=auto,skip=-,spec=llama-eagle3-flat,dkv=fp8,dattn=-,exec=eager].json"
SPEC = {"cell": "spec-draft-backends[kv=auto,skip=-,spec=llama-eagle3-flat,dkv=fp8,dattn=-,exec=eager]",
        "gpu_class": "H200", "engine_args": {"dtype": "bfloat16", "enforce_eager": True, "kv_cache_dtype": "auto",
                                             "speculative_config": {"method": "eagle3", "model": "@DRAFT@",
                                                                    "kv_cache_dtype": "fp8"}}}
SCRIPT = "import vllm\n"
EXPECTED = "the engine starts and generates"


def record() -> dict:
    with tarfile.open(FIXTURES / "runs" / "h200-vllm-0.34.0-2026-12-04.tar.xz") as archive:
        return json.load(archive.extractfile(f"cold/{DRAFT_FP8}"))


def head(draft: str) -> tuple[str, str]:
    """(the title, the first paragraph), which come before the environment."""
    lines = draft.splitlines()
    assert lines[2] == "" and lines[3] == "### Your current environment", lines[:4]
    return lines[0], lines[1]


def test_a_crash_record_names_the_exception_its_site_and_its_signature():
    title, first = head(issue.render(SPEC, SCRIPT, EXPECTED, record()))
    for text in (title, first):
        assert "vLLM 0.34.0 raises `RuntimeError: mha_fwd_get_scheduler_metadata" in text, text
        assert "vllm.vllm_flash_attn.flash_attn_interface:get_scheduler_metadata" in text, text
        assert "kv_cache_dtype='auto', speculative_config={'method': 'eagle3', 'kv_cache_dtype': 'fp8'}" in text
    # the record predates the signature's name: the draft names it by today's table
    assert "(init phase), signature `fa3_scheduler_metadata_dtype`" in first and "flash_api.cpp:610" in first
    assert "expected" not in title


def test_what_a_script_said_is_what_the_draft_says():
    """The script's last words: an exception with where vLLM raised it (named by its signature where one matches),
    or the state it resolved wrong."""
    said = ("AssertionError: expected the engine starts and generates; observed: ValueError: No common block size "
            "for 32. (raised at v1/core/kv_cache_utils.py:1042 unify_kv_cache_spec_page_size)")
    title, first = head(issue.render(SPEC, SCRIPT, EXPECTED, said=said, version="0.30.0"))
    assert ("raises `ValueError: No common block size for 32.` in `v1/core/kv_cache_utils.py:1042 "
            "unify_kv_cache_spec_page_size`, signature `no_common_block_size`") in first
    expected = "draft layers resolve kv_cache_dtype in ['fp8']"
    wrong = (f"AssertionError: expected {expected}; observed: "
             "[\"layers of ['model.layers.4.self_attn.attn']: kv_cache_dtype 'auto'\"]")
    title, first = head(issue.render(SPEC, SCRIPT, expected, said=wrong, version="0.32.0"))
    assert "vLLM 0.32.0 resolves layers of ['model.layers.4.self_attn.attn']: kv_cache_dtype 'auto'" in title
    tokens = "the greedy tokens equal the eager oracle's, or part at a near tie"
    diverged = f"AssertionError: expected {tokens}; sequences [0, 1] diverge with no near tie (tie gap > 0.1)"
    title, first = head(issue.render(SPEC, SCRIPT, tokens, said=diverged, version="0.34.0"))
    assert "vLLM 0.34.0 fails: sequences [0, 1] diverge with no near tie (tie gap > 0.1)" in title
