"""`kvmatrix check` lints a folder of case files without running anything: what does not load (every file named
with case and field, did-you-mean included) and rules that can never apply; the built-in cases are clean.
`kvmatrix models` lists the registry and `kvmatrix --version` the versions."""

from __future__ import annotations

import pytest

from kvmatrix.harness import cli
from tests.conftest import write_case

DEAD = {"model": "llama",
        "matrix": {"kv_cache_dtype": ["auto", "fp8"], "exclude": [{"kv_cache_dtype": "bf16"}]},
        "skip": [{"when": {"speculative": "eagle3"}, "reason": "no draft"}],
        "expect": [{"crash": False},
                   {"when": {"kv_cache_dtype": "bf16"}, "layers": {"spec_dtype": "bfloat16"}},
                   {"when": {"kv_cache_dtype": "auto", "gpu": {"device": "cuda"}, "vllm_version": "<0.1"},
                    "layers": {"spec_dtype": "bfloat16"}},
                   {"when": {"kv_cache_dtype": "fp8", "gpu": "cpu-*"}, "layers": {"kv_cache_dtype": "fp8"}}]}


def test_rules_that_match_no_cell_are_reported(cases_dir, capsys):
    write_case(cases_dir, "dead", DEAD)
    assert cli.main(["check", "--cases-dir", str(cases_dir)]) == 1
    out = capsys.readouterr().out.splitlines()
    path = cases_dir / "dead.yaml"
    assert out[:-1] == [
        f"{path}: case 'dead': field 'matrix.exclude.0.kv_cache_dtype': 'bf16' is no value of this case's "
        f"kv_cache_dtype (auto, fp8) (did you mean 'bfloat16'?): it excludes nothing",
        f"{path}: case 'dead': field 'skip.0.when.speculative': 'eagle3' matches no cell (did you mean "
        f"'llama-eagle3'?): this case's cells have speculative null",
        f"{path}: case 'dead': field 'expect.1.when.kv_cache_dtype': 'bf16' matches no cell (did you mean "
        f"'bfloat16'?): this case's cells have kv_cache_dtype auto, fp8",
    ]  # a rule scoped by vLLM release is judged on its other keys; a rule of some classes only is alive
    assert out[-1] == f"{cases_dir}: 1 case files, 4 cells, 3 problems"


def test_a_shared_blocks_rule_is_dead_only_where_every_case_including_it_misses(cases_dir, capsys):
    write_case(cases_dir, "_block", {"matrix": {"kv_cache_dtype": ["auto"]},
                                     "expect": [{"when": {"model": "deepseek-mla"}, "crash": False},
                                                {"when": {"model": "gemma3"}, "crash": False}]})
    write_case(cases_dir, "a", {"include": ["_block.yaml"], "model": "llama"})
    write_case(cases_dir, "b", {"include": ["_block.yaml"], "model": "deepseek-mla"})
    assert cli.main(["check", "--cases-dir", str(cases_dir)]) == 1
    (line,) = capsys.readouterr().out.splitlines()[:-1]
    assert line.startswith(f"{cases_dir / '_block.yaml'}: field 'expect.1.when.model' (every case that includes "
                           f"it: a, b): 'gemma3' matches no cell")


def test_check_lists_every_broken_file_and_a_waiver_of_no_cell(cases_dir, capsys):
    write_case(cases_dir, "typo", {"model": "lama"})
    write_case(cases_dir, "field", {"model": "llama", "expct": []})
    write_case(cases_dir, "number", {"model": "llama", "expect": [{"layers": {"spec_dtype": 16}}]})
    write_case(cases_dir, "fine", {"model": "llama"})
    (cases_dir / "_waivers.txt").write_text("fnie[*] https://example.org/x\n")
    assert cli.main(["check", "--cases-dir", str(cases_dir)]) == 1
    out = capsys.readouterr().out
    assert "field 'model': 'lama' is not in the model registry (did you mean 'llama'?)" in out
    assert "field 'expct': unknown field 'expct' (did you mean 'expect'?)" in out
    assert "field 'expect.0.layers': spec_dtype is a name as records spell it" in out
    assert "waiver for fnie[*] matches no cell" in out
    assert out.splitlines()[-1].endswith("4 case files, 2 cells, 4 problems")  # fine, and its eager twin


def test_the_built_in_cases_are_clean(capsys):
    assert cli.main(["check"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("no problems")


def test_models_lists_the_registry(cases_dir, capsys):
    assert cli.main(["models", "--cases-dir", str(cases_dir)]) == 0
    out = capsys.readouterr().out
    assert "| deepseek-mla " in out and "| llama-eagle3 " in out and "eagle3 (" in out
    assert out.splitlines()[-1] == f"{out.count(chr(10)) - 3} models in {cases_dir / '_models.yaml'}"


def test_a_reader_that_stops_reading_is_no_error():
    """`kvmatrix models | head -1`: the listing ends quietly when its reader goes, as a shell tool's does (once said
    "kvmatrix: Broken pipe")."""
    import subprocess
    import sys

    with subprocess.Popen([sys.executable, "-m", "kvmatrix", "models"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # gone before the table is written
        assert (proc.wait(timeout=120), proc.stderr.read()) == (cli.BROKEN_PIPE, b"")


def test_version_names_kvmatrix_and_the_installed_vllm(capsys):
    from kvmatrix.harness.vllm_compat import installed_vllm_version

    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("kvmatrix 0.") and f" {installed_vllm_version()}" in out
