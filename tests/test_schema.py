"""Case files are validated strictly, and every error names the file, the case and the field."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvmatrix.matrix import spelling
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import load_case, load_cases, load_models, load_pool
from kvmatrix.matrix.schema import CaseError, Vocabulary
from kvmatrix.matrix.spelling import OldSpelling
from tests.conftest import write_case

VLLM = Vocabulary(frozenset({"auto", "bfloat16", "fp8", "fp8_e5m2"}), frozenset({"max_model_len", "seed"}))


def error_of(path, **kw) -> CaseError:
    with pytest.raises(CaseError) as info:
        load_case(path, **kw)
    return info.value


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"model": "llama", "colour": "red"}, "colour", "unknown field 'colour'; fields here: name, description"),
        ({"model": "llama", "timeout_s": "fast"}, "timeout_s", "expected a number, not 'fast'"),
        ({"model": "llama", "matrix": {"kv_cache_dtype": "fp8"}}, "matrix.kv_cache_dtype",
         "expected a list, not 'fp8'"),
        ({"model": "llama", "matrix": {"kv_cache_dtype_skip_layers": [[0]]}},
         "matrix.kv_cache_dtype_skip_layers.0.0", "expected a string, not 0"),
        ({"model": "llama", "expect": [{"when": {"kv_cache_dtype": "auto"}}]}, "expect.0", "at least one of"),
        ({"model": "llama", "expect": [{"when": {"colour": "red"}, "crash": False}]}, "expect.0.when",
         "unknown key 'colour'"),
        ({"model": "llama", "expect": [{"layers": {"select": "middle", "kv_cache_dtype": "fp8"}}]},
         "expect.0.layers.select", "unknown selector 'middle'"),
        ({"model": "llama", "expect": [{"layers": {"kv_dtype": "fp8"}}]}, "expect.0", "unknown field(s) ['kv_dtype']"),
        ({"model": "llama", "expect": [{"when": {"gpu": {"compute_capability": ">=nine"}}, "crash": False}]},
         "expect.0.when", "invalid range"),
        ({"model": "llama", "matrix": {"extra": [{"kv_cache_dtype": "fp8", "speed": 1}]}},
         "matrix.extra.0.speed", "unknown field 'speed'"),
    ],
)
def test_bad_fields_are_named(cases_dir, data, field, words):
    path = write_case(cases_dir, "bad", data)
    err = error_of(path)
    assert err.file == str(path) and err.case == "bad" and err.field == field
    assert words in err.message
    assert str(path) in str(err) and "case 'bad'" in str(err) and f"field '{field}'" in str(err)


def test_unknown_dtype_is_checked_against_vllms_list(cases_dir):
    path = write_case(cases_dir, "typo", {"model": "llama", "matrix": {"kv_cache_dtype": ["auto", "fp9"]}})
    err = error_of(path, vocabulary=VLLM)
    assert (err.case, err.field) == ("typo", "matrix.kv_cache_dtype.1")
    assert "unknown kv_cache_dtype 'fp9'" in err.message


def test_engine_args_are_checked_against_vllms_engine_args(cases_dir):
    path = write_case(cases_dir, "args", {"model": "llama", "engine_args": {"max_model_len": 128, "max_modle_len": 1}})
    err = error_of(path, vocabulary=VLLM)
    assert (err.case, err.field) == ("args", "engine_args.max_modle_len") and "not an engine argument" in err.message


def test_not_yaml_and_not_a_mapping(cases_dir):
    assert "not valid YAML" in error_of(write_case(cases_dir, "broken", "model: [llama\n")).message
    assert "mapping of fields" in error_of(write_case(cases_dir, "list", "- a\n- b\n")).message


def test_name_must_match_the_file(cases_dir):
    err = error_of(write_case(cases_dir, "one", {"name": "two", "model": "llama"}))
    assert err.field == "name" and "named by its file" in err.message


def test_include_merges_shared_blocks_and_own_keys_win(cases_dir):
    write_case(cases_dir, "_shared", {"model": "deepseek-mla", "timeout_s": 30,
                                      "matrix": {"kv_cache_dtype": ["auto", "fp8"]}})
    case = load_case(write_case(cases_dir, "user", {"include": ["_shared.yaml"], "model": "llama"}))
    assert case.model == "llama" and case.timeout_s == 30 and case.matrix.kv_cache_dtype == ["auto", "fp8"]


def test_include_cannot_leave_the_folder(cases_dir):
    err = error_of(write_case(cases_dir, "escape", {"include": ["../secret.yaml"], "model": "llama"}))
    assert err.field == "include"


# `matrix.include` (extra matrix points) is `matrix.extra` now: `include:` means only the shared blocks.
OLD_EXTRA = {"model": "llama", "matrix": {"kv_cache_dtype": ["auto"], "include": [{"kv_cache_dtype": "fp8"}]}}


def test_the_old_spelling_of_extra_points_loads_with_a_warning_naming_where(cases_dir):
    path = write_case(cases_dir, "old", OLD_EXTRA)
    with pytest.warns(OldSpelling) as said:
        case = load_case(path)
    assert [c.kv_cache_dtype for c in case.matrix.extra] == ["fp8"]
    assert [str(w.message) for w in said] == [
        f"{path}: case 'old': field 'matrix.include': renamed matrix.extra (the extra matrix points, beside "
        "matrix.exclude; a top-level include: pulls in shared blocks); write matrix.extra. The old spelling is "
        f"accepted up to kvmatrix {spelling.EXTRA_POINTS.last_release} and refused after it"]


def test_the_old_spelling_in_a_shared_block_names_the_block(cases_dir):
    block = write_case(cases_dir, "_points", {"matrix": OLD_EXTRA["matrix"]})
    with pytest.warns(OldSpelling, match=rf"^{block}: case 'user': field 'matrix.include': renamed matrix.extra"):
        load_case(write_case(cases_dir, "user", {"include": ["_points.yaml"], "model": "llama"}))


def test_the_old_spelling_is_refused_once_its_last_release_is_out(cases_dir, monkeypatch):
    monkeypatch.setattr(spelling, "RENAMED", (replace(spelling.EXTRA_POINTS, accepted=False),))
    path = write_case(cases_dir, "old", OLD_EXTRA)
    err = error_of(path)
    assert (err.file, err.case, err.field) == (str(path), "old", "matrix.include")
    assert str(err) == (
        f"{path}: case 'old': field 'matrix.include': renamed matrix.extra (the extra matrix points, beside "
        "matrix.exclude; a top-level include: pulls in shared blocks); write matrix.extra. The old spelling was "
        f"refused after kvmatrix {spelling.EXTRA_POINTS.last_release}")


def test_both_spellings_at_once_are_refused(cases_dir):
    both = {**OLD_EXTRA, "matrix": {**OLD_EXTRA["matrix"], "extra": [{"kv_cache_dtype": "bfloat16"}]}}
    err = error_of(write_case(cases_dir, "both", both))
    assert err.field == "matrix.include" and "given beside matrix.extra, its new spelling" in err.message


def test_the_command_says_the_old_spelling_as_its_own_warning(cases_dir, capsys):
    from kvmatrix.harness.cli import main

    path = write_case(cases_dir, "old", {**OLD_EXTRA, "gpus": ["*"]})
    assert main(["list", "--cases-dir", str(cases_dir), "--case", "old"]) == 0
    captured = capsys.readouterr()
    assert f"kvmatrix: warning: {path}: case 'old': field 'matrix.include': renamed matrix.extra" in captured.err
    assert "old[kv=fp8,skip=-,spec=-]" in captured.out


def test_cross_references_are_checked_at_expansion(cases_dir):
    models, pool = load_models(cases_dir), load_pool(cases_dir)
    for data, field in (
        ({"model": "gpt-7"}, "model"),
        ({"model": "llama", "matrix": {"speculative": ["llama"]}}, "matrix.speculative"),
        ({"model": "llama", "gpus": ["TPU*"]}, "gpus"),
    ):
        path = write_case(cases_dir, "xref", data)
        with pytest.raises(CaseError) as info:
            expand_case(load_case(path), models, pool, str(path))
        assert info.value.field == field and info.value.case == "xref"


def test_the_shipped_cases_load_and_expand():
    cases = load_cases()
    assert {c.name for c in cases} >= {"ct-llama", "llama-skip", "deepseek-mla", "glm-mla", "flashinfer-qdtype"}


def test_case_env_is_limited_to_variables_vllm_reads(cases_dir):
    vllm = Vocabulary(env_vars=frozenset({"VLLM_USE_FLASHINFER_SAMPLER"}))
    ok = write_case(cases_dir, "envok", {"model": "llama", "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"}})
    assert load_case(ok, vllm).env == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    for name in ("LD_PRELOAD", "PATH", "VLLM_ENABLE_V1_MULTIPROCESSING"):  # not a switch a case may set
        err = error_of(write_case(cases_dir, "envbad", {"model": "llama", "env": {name: "x"}}))
        assert (err.case, err.field) == ("envbad", f"env.{name}") and "a case may set" in err.message
    err = error_of(write_case(cases_dir, "envold", {"model": "llama", "env": {"VLLM_USE_DEEP_GEMM": "0"}}),
                   vocabulary=vllm)  # a case may set it, where the installed vLLM reads it
    assert err.field == "env.VLLM_USE_DEEP_GEMM" and "may set only those" in err.message


def test_vllms_own_variables_are_the_allow_list():
    from kvmatrix.harness.vllm_compat import known_env_vars

    names = known_env_vars()
    assert "VLLM_USE_FLASHINFER_SAMPLER" in names and "VLLM_ENABLE_V1_MULTIPROCESSING" not in names
    assert not {"PATH", "LD_PRELOAD", "PYTHONPATH"} & names


def test_a_registry_entry_naming_its_layer_count_is_refused_naming_the_field(cases_dir):
    """`num_layers` was never read (a tiny model's layers are its builder's, harness/models/tiny.py num_layers)
    and is no longer a registry field: a registry that still sets it is told which field to drop."""
    (cases_dir / "_models.yaml").write_text("llama: {tiny: llama, num_layers: 4}\n")
    with pytest.raises(CaseError) as info:
        load_models(cases_dir)
    assert info.value.field == "llama.num_layers" and "unknown field 'num_layers'" in str(info.value)


def test_what_vllm_would_silently_ignore_is_a_case_error(cases_dir):
    """A skip list naming no layer of the model (vLLM ignores it: the cell would skip nothing), a word vLLM does not
    read there, and a failure signature no classifier knows (the rule would fail every cell for the wrong reason)
    are load errors naming file, case and field, checked against the installed vLLM and the model registry."""
    from kvmatrix.harness.run.session import vllm_vocabulary

    vocabulary = vllm_vocabulary(load_models(cases_dir))
    bad = {
        "layer7": ({"model": "llama", "matrix": {"kv_cache_dtype": ["fp8"], "kv_cache_dtype_skip_layers": [["7"]]}},
                   "matrix.kv_cache_dtype_skip_layers", "layer 7 is not a layer of 'llama': its engine has layers 0-3"),
        "word": ({"model": "llama", "matrix": {"kv_cache_dtype_skip_layers": [["sliding"]]}},
                 "matrix.kv_cache_dtype_skip_layers", "'sliding' is neither a layer index nor a word vLLM reads"),
        "madeup": ({"model": "llama", "expect": [{"crash": {"signature": "made_up_name"}}]},
                   "expect.0.crash.signature", "unknown failure signature 'made_up_name'"),
        "refusal": ({"model": "llama", "expect": [{"refuse": {"signature": ["no_valid_backend", "nope"]}}]},
                    "expect.0.refuse.signature", "unknown failure signature 'nope'"),
    }
    for name, (data, field, words) in bad.items():
        err = error_of(write_case(cases_dir, name, data), vocabulary=vocabulary)
        assert (err.case, err.field) == (name, field) and words in err.message, err
    # A draft's layers are numbered after its target's: layer 4 is the DFlash draft's, a family name is known.
    fine = {"model": "llama", "matrix": {"kv_cache_dtype": ["fp8"], "kv_cache_dtype_skip_layers": [["4"]],
                                         "speculative": ["llama-dflash"]},
            "expect": [{"crash": {"signature": "backend_lacks_kv_dtype"}}]}
    load_case(write_case(cases_dir, "draft", fine), vocabulary=vocabulary)
    with_no_draft = {**fine, "matrix": {**fine["matrix"], "speculative": [None, "llama-dflash"]}}
    err = error_of(write_case(cases_dir, "nodraft", with_no_draft), vocabulary=vocabulary)
    assert "layer 4 is not a layer of 'llama'" in err.message


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        # A typo of a field: the field as written, the one meant, the valid ones.
        ({"model": "llama", "expct": [{"crash": False}]}, "expct",
         "unknown field 'expct' (did you mean 'expect'?); fields here: name, description, tags, model"),
        # A union's member names (literal[False], CrashExpected) never reach the message, and of its alternatives
        # only the one the input was meant as (a mapping: the crash rule) is reported.
        ({"model": "llama", "expect": [{"crash": {"signatur": "x"}}]}, "expect.0.crash.signature",
         "required, but missing; also: field 'expect.0.crash.signatur': unknown field 'signatur' (did you mean "
         "'signature'?); fields here: signature, link, reason"),
        ({"model": "llama", "expect": [{"crash": True}]}, "expect.0.crash",
         "expected false or a mapping of signature, link, reason, not true"),
        ({"model": "llama", "differential": {"orcle": {}}}, "differential.orcle", "did you mean 'oracle'?"),
        ({"model": "llama", "matrix": {"execution": ["eagr"]}}, "matrix.execution.0",
         "'eagr' is not one of default, eager, compiled"),
        ({"model": "llama", "expect": [{"when": {"kv_dtype": "fp8"}, "crash": False}]}, "expect.0.when",
         "unknown key 'kv_dtype' in when (did you mean 'kv_cache_dtype'?)"),
        ({"model": "llama", "expect": [{"layers": {"kv_dtype": "fp8"}}]}, "expect.0",
         "(did you mean 'kv_cache_dtype'?)"),
        # A number where a record holds a name (a dtype) could never match: refused at load, not after vLLM ran.
        ({"model": "llama", "expect": [{"layers": {"spec_dtype": 16}}]}, "expect.0.layers",
         "spec_dtype is a name as records spell it (e.g. bfloat16, float8_e4m3fn), not 16"),
    ],
)
def test_mistakes_read_as_the_file_spells_them_with_the_names_meant(cases_dir, data, field, words):
    path = write_case(cases_dir, "typo", data)
    err = error_of(path)
    assert (err.file, err.case, err.field) == (str(path), "typo", field)
    assert words in err.message
    assert "Extra inputs" not in str(err) and "literal[" not in str(err) and "CrashExpected" not in str(err)


def test_unknown_names_offer_the_valid_ones(cases_dir):
    err = error_of(write_case(cases_dir, "dtype", {"model": "llama", "matrix": {"kv_cache_dtype": ["fp8e5m2"]}}),
                   vocabulary=VLLM)
    assert "unknown kv_cache_dtype 'fp8e5m2' (did you mean 'fp8_e5m2'?); valid: auto, bfloat16, fp8, fp8_e5m2" \
        in err.message
    models, pool = load_models(cases_dir), load_pool(cases_dir)
    for data, field, words in (
        ({"model": "lama"}, "model", "'lama' is not in the model registry (did you mean 'llama'?); the registry: "),
        ({"model": "llama", "matrix": {"speculative": ["llama-eagle"]}}, "matrix.speculative",
         "(did you mean 'llama-eagle3'?); drafts: "),
    ):
        path = write_case(cases_dir, "xref", data)
        with pytest.raises(CaseError) as info:
            expand_case(load_case(path), models, pool, str(path))
        assert info.value.field == field and words in info.value.message
