"""Hostile and broken input: generated case and pool files are either accepted or rejected with a CaseError
naming the file (and the case and field where there is one); nothing raises a raw exception, nothing in a case
file is executed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import CASES_DIR, load_case, load_models, load_pool
from kvmatrix.matrix.schema import CaseError, Vocabulary

MODELS, POOL = load_models(), load_pool()
VLLM = Vocabulary(frozenset({"auto", "bfloat16", "fp8"}), frozenset({"max_model_len", "seed", "dtype"}))
KEYS = ["model", "description", "gpus", "matrix", "engine_args", "generate", "timeout_s", "retries", "skip",
        "expect", "include", "name", "kv_cache_dtype", "when", "layers", "crash", "refuse", "select", "signature",
        "page_size_ratio", "of", "to", "equals", "builders", "groups", "exclude", "speculative", "../x", "!!"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=True),
                    st.sampled_from(["llama", "fp8", "auto", "*", ">=9.0", "<nine", "cpu", "skipped", "[", "../..",
                                     "llama-dflash", "FLASHINFER", ""]),
                    st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)), max_leaves=25)
cases = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)
valid_base = {"model": "llama", "matrix": {"kv_cache_dtype": ["auto", "fp8"]},
              "expect": [{"when": {"kv_cache_dtype": "fp8"}, "layers": {"kv_cache_dtype": "fp8"}}]}


def accepted_or_named(path: Path, load) -> None:
    try:
        load()
    except CaseError as err:
        assert err.file.endswith(path.name) and str(path.name) in str(err)
        assert err.case in (None, path.stem)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(cases, values, st.builds(lambda extra: {**valid_base, **extra}, cases)))
def test_generated_case_files(tmp_path, data):
    path = tmp_path / "gen.yaml"
    path.write_text(yaml.safe_dump(data))
    accepted_or_named(path, lambda: expand_case(load_case(path, VLLM), MODELS, POOL, str(path)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_arbitrary_text_as_a_case_file(tmp_path, text):
    path = tmp_path / "text.yaml"
    path.write_text(text)
    accepted_or_named(path, lambda: expand_case(load_case(path, VLLM), MODELS, POOL, str(path)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(values, st.dictionaries(st.sampled_from(["cpu", "L4", "X"]), values, max_size=3)))
def test_generated_pool_files(tmp_path, data):
    folder = tmp_path / "cases"
    folder.mkdir(exist_ok=True)
    (folder / "_pool.yaml").write_text(yaml.safe_dump(data))
    try:
        load_pool(folder)
    except CaseError as err:
        assert err.file.endswith("_pool.yaml")


def test_an_include_with_a_nul_byte_is_named(tmp_path):
    """Found by the generated case files above: a NUL byte in an include name made Path.resolve raise ValueError."""
    path = tmp_path / "nul.yaml"
    path.write_text(yaml.safe_dump({"include": "a\x00b", "model": "llama"}))
    with pytest.raises(CaseError, match=r"nul\.yaml.*include"):
        load_case(path, VLLM)


def test_case_files_cannot_run_code(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(f"model: !!python/object/apply:os.system ['touch {marker}']\n")
    try:
        load_case(path)
    except CaseError as err:
        assert "not valid YAML" in err.message
    assert not marker.exists()


def test_the_shipped_cases_survive_the_same_checks(tmp_path):
    for source in CASES_DIR.glob("[!_]*.yaml"):
        shutil.copy(source, tmp_path / source.name)
    for shared in CASES_DIR.glob("_*.yaml"):  # the registry, the pool and the blocks cases include
        shutil.copy(shared, tmp_path / shared.name)
    for path in tmp_path.glob("[!_]*.yaml"):
        expand_case(load_case(path), MODELS, POOL, str(path))


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.one_of(
    st.text(max_size=40),
    st.builds(lambda p, g, link, until: " ".join(filter(None, [p, g, link, until])),
              st.sampled_from(["ct-llama[*", "*", "x[kv=fp8,skip=-,spec=-]", "", "[", "gpu=L4"]),
              st.sampled_from(["", "gpu=L4", "gpu=TPU", "gpu=", "gpu=cpu,L4"]),
              st.sampled_from(["", "https://github.com/vllm-project/vllm/issues/1", "not-a-link", "#frag"]),
              st.sampled_from(["", "until=2027-01-31", "until=2027-02-30", "until=tomorrow"]))), max_size=6))
def test_generated_waiver_files(lines):
    from kvmatrix.harness.judge.waivers import WaiverError, parse_waivers

    text = "\n".join(lines)
    try:
        parse_waivers(text, "gen_waivers.txt", gpu_classes=list(POOL))
    except WaiverError as err:  # a generated line may itself hold line breaks: count the file's lines
        assert err.file == "gen_waivers.txt" and 1 <= err.line <= len(text.replace("\r\n", "\n").split("\n"))
        assert str(err).startswith(f"gen_waivers.txt:{err.line}: ")
