"""`kvmatrix check` as a newcomer meets it: every problem of a case file in one pass (schema, the installed vLLM's
names, the registry), a "did you mean" that never names the word itself, a wrong type said in the file's words,
and `exclude:` taking the "any of" lists `when:` takes."""

from __future__ import annotations

from kvmatrix.harness import cli
from tests.conftest import CPU_CLASS, write_case

THREE_MISTAKES = """\
model: lama
gpus: ["*"]
matrix:
  kv_cache_dtype: fp8
expect:
  - crash: flase
"""


def problems(cases_dir, capsys) -> list[str]:
    assert cli.main(["check", "--cases-dir", str(cases_dir)]) == 1
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith(str(cases_dir))
            and "case files" not in line]


def test_check_says_every_problem_of_a_file_in_one_pass(cases_dir, capsys):
    """Before: one line, the first two problems, and `model: lama` only after they were fixed (a third round)."""
    write_case(cases_dir, "three", THREE_MISTAKES)
    found = problems(cases_dir, capsys)
    fields = [line.split("field '")[1].split("'")[0] for line in found]
    assert fields == ["matrix.kv_cache_dtype", "expect.0.crash", "model"], found
    assert "'lama' is not in the model registry (did you mean 'llama'?)" in found[2]


def test_the_installed_vllms_names_and_the_registry_in_one_pass(cases_dir, capsys):
    """Before: the unknown dtype alone; the model only in the next round."""
    write_case(cases_dir, "two", {"model": "lama", "gpus": ["*"], "matrix": {"kv_cache_dtype": ["fp9", "fp7"]}})
    found = problems(cases_dir, capsys)
    assert [line.split("field '")[1].split("'")[0] for line in found] == [
        "matrix.kv_cache_dtype.0", "matrix.kv_cache_dtype.1", "model"], found


def test_a_wrong_type_is_said_in_the_files_words(cases_dir, capsys):
    """Before: pydantic's "Input should be a valid list"."""
    write_case(cases_dir, "one", {"model": "llama", "gpus": ["*"], "matrix": {"kv_cache_dtype": "fp8"}})
    (line,) = problems(cases_dir, capsys)
    assert line.endswith("field 'matrix.kv_cache_dtype': expected a list, not 'fp8' (one value is a list of one: "
                         "[fp8])"), line
    assert "Input should" not in line


def test_did_you_mean_never_names_the_word_itself(cases_dir, capsys):
    """Before: "'llama-eagle3' is no value of this case's speculative (null) (did you mean 'llama-eagle3'?)"."""
    write_case(cases_dir, "ex", {"model": "llama", "gpus": [CPU_CLASS],
                                 "matrix": {"exclude": [{"speculative": "llama-eagle3"}]}})
    (line,) = problems(cases_dir, capsys)
    assert "'llama-eagle3' is no value of this case's speculative (null): it excludes nothing" in line, line
    assert "did you mean" not in line


def test_exclude_takes_the_any_of_lists_when_takes(cases_dir, capsys):
    """Before: `exclude: [{kv_cache_dtype: [fp8, fp8_e5m2]}]` did not load ("Input should be a valid string")."""
    write_case(cases_dir, "anyof", {"model": "llama", "gpus": [CPU_CLASS],
                                    "matrix": {"kv_cache_dtype": ["auto", "fp8", "fp8_e5m2"],
                                               "kv_cache_dtype_skip_layers": [[], ["0"], ["0", "1"]],
                                               "exclude": [{"kv_cache_dtype": ["fp8", "fp8_e5m2"],
                                                            "kv_cache_dtype_skip_layers": [["0"], ["0", "1"]]}]}})
    assert cli.main(["check", "--cases-dir", str(cases_dir)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    assert cli.main(["list", "--cases-dir", str(cases_dir)]) == 0
    ids = [line.split("  ")[0] for line in capsys.readouterr().out.splitlines()]
    assert ids == ["anyof[kv=auto,skip=-,spec=-]", "anyof[kv=auto,skip=0,spec=-]", "anyof[kv=auto,skip=0+1,spec=-]",
                   "anyof[kv=fp8,skip=-,spec=-]", "anyof[kv=fp8_e5m2,skip=-,spec=-]"], ids
