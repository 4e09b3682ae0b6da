"""Hostile and broken input: generated case and pool files are either accepted or rejected with a CaseError
naming the file (and the case and field where there is one); nothing raises a raw exception, nothing in a case
file is executed."""

from __future__ import annotations

import argparse
import os
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
        "page_size_ratio", "of", "to", "equals", "builders", "groups", "exclude", "extra", "speculative", "../x",
        "!!"]
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


# Byte-level damage: what an editor in another encoding, a torn copy or a hostile hand puts into YAML.
DAMAGE = st.one_of(st.binary(max_size=6), st.sampled_from(
    [b"\xff", b"\xc3\x28", b"\xe9", b"\x00", b"&a ", b"*a", b"\n<<: *a\n", b" &x [1] ", b"[*x, *x]", b"\t", b"\r"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(cases, st.builds(lambda extra: {**valid_base, **extra}, cases)),
       damage=st.lists(st.tuples(st.integers(0, 400), DAMAGE), max_size=4))
def test_generated_case_files_with_bad_bytes_and_aliases(tmp_path, data, damage):
    """Non-UTF-8 bytes, NULs, anchors and aliases dropped anywhere into a generated case file: it loads, or a
    CaseError names the file; never another exception."""
    text = yaml.safe_dump(data).encode()
    for at, piece in damage:
        text = text[:at] + piece + text[at:]
    path = tmp_path / "gen.yaml"
    path.write_bytes(text)
    accepted_or_named(path, lambda: expand_case(load_case(path, VLLM), MODELS, POOL, str(path)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shared=values.filter(lambda v: isinstance(v, list | dict)), data=cases)
def test_a_value_written_twice_by_reference_is_refused(tmp_path, shared, data):
    """YAML writers share a repeated object by anchor and alias (PyYAML's own dump does); a case file refuses any
    alias, wherever it is, naming the file."""
    path = tmp_path / "gen.yaml"
    path.write_text(yaml.safe_dump({**valid_base, **data, "description": "x", "x-first": shared, "x-again": shared}))
    if b"*id" not in path.read_bytes():
        return  # an empty list or mapping is written out twice, not shared
    with pytest.raises(CaseError, match=r"gen\.yaml: not valid YAML: an alias"):
        load_case(path, VLLM)


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


# --- a case file is data: it loads no code and no file --------------------------------------------------------
# Before, `env:` took every variable vLLM reads (LD_LIBRARY_PATH, a logging config that names a handler class) and
# `engine_args` could replace the registry's model and set trust_remote_code: the remote code ran, the cell passed.

def installed_vocabulary():
    from kvmatrix.harness.run.session import vllm_vocabulary

    return vllm_vocabulary(MODELS)


CODE_OR_FILES_IN_ENV = [
    ("LD_LIBRARY_PATH", "/tmp/evil"), ("VLLM_LOGGING_CONFIG_PATH", "/tmp/log.json"), ("VLLM_PLUGINS", "evil"),
    ("VLLM_NCCL_SO_PATH", "/tmp/x.so"), ("VLLM_CUDART_SO_PATH", "/tmp/x.so"), ("VLLM_CACHE_ROOT", "/tmp"),
    ("VLLM_TUNED_CONFIG_FOLDER", "/tmp"), ("VLLM_RPC_BASE_PATH", "/tmp"), ("VLLM_TRACE_FUNCTION", "1"),
    ("VLLM_ALLOW_INSECURE_SERIALIZATION", "1"), ("VLLM_USE_MODELSCOPE", "1"), ("LD_PRELOAD", "x.so"),
    ("PYTHONPATH", "/tmp"), ("PATH", "/tmp"), ("HF_HOME", "/tmp"),
    ("VLLM_USE_DEEP_GEMM", "/tmp/x"), ("VLLM_USE_DEEP_GEMM", "os.system"), ("VLLM_USE_DEEP_GEMM", "0; rm -rf ~"),
]


CODE_OR_FILES_IN_ENGINE_ARGS = [
    ("model", "/tmp/other"), ("tokenizer", "/tmp/other"), ("trust_remote_code", True), ("download_dir", "/tmp"),
    ("hf_config_path", "/tmp"), ("revision", "main"), ("code_revision", "main"), ("tokenizer_mode", "custom"),
    ("served_model_name", "llama"), ("model_impl", "transformers"), ("model_loader_extra_config", {"a": 1}),
    ("load_format", "dummy"), ("hf_overrides", {"architectures": ["X"]}), ("hf_token", "secret"),
    ("worker_cls", "evil.Worker"), ("worker_extension_cls", "os.system"), ("scheduler_cls", "evil.S"),
    ("distributed_executor_backend", "evil.Executor"), ("logits_processors", ["evil.mod.Proc"]),
    ("compilation_config", {"backend": "evil.mod.fn"}), ("kv_transfer_config", {"kv_connector_module_path": "x"}),
    ("speculative_config", {"model": "/tmp/draft"}), ("generation_config", "/tmp"), ("log_config_file", "/tmp/l"),
    ("allowed_local_media_path", "/"), ("io_processor_plugin", "evil"), ("reasoning_parser_plugin", "/tmp/x.py"),
    ("pt_load_map_location", "cpu"), ("additional_config", {"a": 1}),
    ("dtype", "../../x"), ("dtype", "torch.bfloat16"), ("seed", float("inf")), ("max_model_len", [1, {"a": 1}]),
]


CODE_OR_FILES = ([("env", name, value) for name, value in CODE_OR_FILES_IN_ENV]
                 + [("engine_args", name, value) for name, value in CODE_OR_FILES_IN_ENGINE_ARGS])


@pytest.mark.parametrize(("field", "name", "value"), CODE_OR_FILES, ids=lambda x: str(x)[:30])
@pytest.mark.parametrize("with_vllm", [True, False], ids=["installed-vllm", "no-vllm"])
def test_a_case_names_no_model_remote_code_path_or_code_loading_switch(tmp_path, field, name, value, with_vllm):
    """`env:` loads no code or file, `engine_args` names no model, remote code or path."""
    path = tmp_path / "evil.yaml"
    path.write_text(yaml.safe_dump({"model": "llama", field: {name: value}}))
    with pytest.raises(CaseError) as caught:
        load_case(path, installed_vocabulary() if with_vllm else None)
    assert (caught.value.file, caught.value.case, caught.value.field) == (str(path), "evil", f"{field}.{name}")


def test_what_a_case_may_set_names_no_path_library_plugin_or_config():
    """The lists a case's `env:` and `engine_args` are held to (matrix/schema.py) name no file, folder, library,
    plugin, module, class, configuration, model or tokenizer, and the installed vLLM reads the shipped cases' own."""
    from kvmatrix.matrix.schema import CASE_ENGINE_ARGS, CASE_ENV_VARS

    loads = {"PATH", "DIR", "FILE", "FOLDER", "ROOT", "HOME", "SO", "LIB", "PLUGIN", "PLUGINS", "MODULE", "CLS",
             "CLASS", "CONFIG", "MODEL", "TOKENIZER", "CODE", "REVISION", "FORMAT", "OVERRIDES", "PROCESSORS",
             "EXECUTOR", "EXTENSION", "URL", "MODELSCOPE", "SERIALIZATION", "TRACE"}
    assert [n for n in CASE_ENV_VARS if set(n.split("_")) & (loads - {"MODEL"})] == []  # MAX_MODEL_LEN: a size
    assert [n for n in CASE_ENGINE_ARGS if set(n.upper().split("_")) & (loads - {"MODEL"})] == []
    assert [n for n in CASE_ENGINE_ARGS if n.startswith("model") or n.endswith("_model")] == []
    vocabulary = installed_vocabulary()
    assert {"VLLM_USE_DEEP_GEMM", "VLLM_USE_FLASHINFER_SAMPLER"} <= vocabulary.env_vars & CASE_ENV_VARS
    assert {"max_model_len", "seed", "dtype", "block_size"} <= vocabulary.engine_args & CASE_ENGINE_ARGS


@pytest.mark.parametrize("folder", [CASES_DIR, CASES_DIR / "surface"], ids=["cases", "surface"])
def test_every_shipped_case_loads_against_the_installed_vllm(folder):
    from kvmatrix.matrix.load import case_files

    vocabulary = installed_vocabulary()
    for path in case_files(folder):
        load_case(path, vocabulary)


# --- bounded, and never a traceback ----------------------------------------------------------------------------

def alias_bomb(levels: int, width: int = 9) -> str:
    anchors = [f"a0: &a0 [{', '.join(['xxxxxxxxxx'] * width)}]"]
    anchors += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "model: llama\nengine_args:\n  max_model_len:\n" + "".join(f"    {a}\n" for a in anchors)


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    """Before: 7 levels (600 bytes) passed loading as a 112 MB engine argument; the full bomb ran out of memory."""
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(7))
    with pytest.raises(CaseError, match=r"bomb\.yaml: not valid YAML: an alias \(\*name\)"):
        load_case(path, VLLM)


@pytest.mark.parametrize(("text", "words"), [
    (b"model: llama\ndescription: caf\xe9\n", "not UTF-8 text: byte 0xe9 on line 2"),
    (b"model: llama\n" + b"description: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
    (b"model: llama\nexpect:\n  - crash: false\nexpect:\n  - crash: true\n", "key 'expect' appears twice"),
    (b"model: llama\ndescription: " + b"x" * (2 << 20) + b"\n", "over 1024 KiB"),
    (b"model: llama\ntimeout_s: .inf\n", "timeout_s"),
    (b"model: llama\ngenerate: {max_tokens: 8, prompts: [a]}\naccuracy: {task: t, max_drop: .nan}\n", "max_drop"),
])
def test_bad_bytes_are_one_line_errors_naming_the_file(tmp_path, text, words):
    """Before: non-UTF-8 bytes and deep nesting raised tracebacks; a key given twice and an 8 MiB file passed."""
    path = tmp_path / "bad.yaml"
    path.write_bytes(text)
    with pytest.raises(CaseError) as caught:
        load_case(path, VLLM)
    assert words in str(caught.value) and str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


@pytest.mark.parametrize("name", [b"two\nlines", b"caf\xe9", b"tab\there", b"a|b", b"x[kv=y]", b"sp ace", b"a*b"])
def test_a_case_file_name_that_is_no_case_name_is_named_and_the_others_load(tmp_path, name):
    """Before: a newline in a file name split the report's rows; bytes that are not UTF-8 raised a traceback."""
    from kvmatrix.harness.cli.selection import load_cells

    folder = tmp_path / "cases"
    folder.mkdir()
    for shared in ("_models.yaml", "_pool.yaml"):
        shutil.copy(CASES_DIR / shared, folder / shared)
    (folder / "good.yaml").write_text(yaml.safe_dump({"model": "llama"}))
    with open(os.path.join(os.fsencode(folder), name + b".yaml"), "w") as f:
        f.write(yaml.safe_dump({"model": "llama"}))
    args = argparse.Namespace(cases_dir=str(folder), case=None, k=None, cell=None)
    cells, errors, _ = load_cells(args, tolerant=True, of_installed_vllm=False)
    assert {c.case.name for c in cells} == {"good"}  # `café` or `évaluation` would be fine: UTF-8 is
    (err,) = errors
    assert err.case is None and err.file.endswith(".yaml") and str(err).isprintable()
    assert "a case name is printable UTF-8 text" in str(err)


def test_a_matrix_past_the_cap_is_refused_before_it_expands(tmp_path):
    """Before: a 10^6-cell matrix planned for 114 s at 2.3 GB; now its size is counted, not built."""
    path = tmp_path / "huge.yaml"
    backends = [f"B{i}" for i in range(1000)]
    path.write_text(yaml.safe_dump({"model": "llama", "matrix": {
        "attention_backend": backends, "kv_cache_dtype": [f"d{i}" for i in range(1000)]}}))
    with pytest.raises(CaseError, match=r"field 'matrix': expands to up to 1,000,000 cells, over the 20,000"):
        load_case(path)
    assert len(load_case(path, max_cells=None).matrix.attention_backend) == 1000  # the cap lifted: it loads


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.binary(max_size=30), min_size=1, max_size=4))
def test_waiver_files_with_bytes_that_are_not_utf8_name_file_and_line(tmp_path, lines):
    """Before: a waivers file with bytes that are not UTF-8 raised UnicodeDecodeError out of `kvmatrix run`."""
    from kvmatrix.harness.judge.waivers import WaiverError, load_waivers

    path = tmp_path / "_waivers.txt"
    path.write_bytes(b"\n".join(lines))
    try:
        load_waivers(path, gpu_classes=list(POOL))
    except WaiverError as err:
        assert err.file == str(path) and str(err).startswith(f"{path}:") and "\n" not in err.message
