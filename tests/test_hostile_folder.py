"""A stranger's case folder is data, all of it (case files, the blocks they include, `_models.yaml`, `_pool.yaml`,
`_waivers.txt`): nothing in it names code to import, a path or remote code unless the user trusts the folder
(`--trust-case-code`); no file outside it is read; what a message quotes of it is a short escaped excerpt; what it
asks of a run is bounded; its patterns match in linear time. Each test here failed before its fix."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from kvmatrix.harness import cli
from kvmatrix.harness.cli.exit_codes import FAILED, OK, USAGE
from kvmatrix.harness.judge.waivers import WaiverError, load_waivers, parse_waivers
from kvmatrix.harness.run.cases import cell_selected
from kvmatrix.matrix.load import CASES_DIR, load_case, load_models, load_pool
from kvmatrix.matrix.schema import CaseError
from kvmatrix.matrix.trust import TRUST_CASE_CODE_ENV
from tests.conftest import CPU_CLASS, write_case

DRAFTED = {"model": "llama", "gpus": [CPU_CLASS], "matrix": {"speculative": ["llama-ngram"]}}


# --- 1. a case's speculative_config names no method, model or code ---------------------------------------------

@pytest.mark.parametrize(("name", "value"), [
    ("method", "custom_class"), ("model", "kvcases.helpers.Proposer"), ("model", "/tmp/draft"),
    ("revision", "main"), ("code_revision", "main"), ("draft_load_config", {"load_format": "dummy"}),
    ("custom_method", "x"), ("speculator_options", {"a": 1}), ("kv_cache_dtype", "os.system"),
    ("attention_backend", "/tmp/x"),
])
def test_a_case_speculative_config_names_no_method_model_or_code(cases_dir, name, value):
    """Before: `speculative_config: {method: custom_class, model: kvcases.helpers.Proposer}` passed `check` and the
    cell imported the module beside the case file and instantiated its class."""
    path = write_case(cases_dir, "evil", {**DRAFTED, "speculative_config": {name: value}})
    with pytest.raises(CaseError) as caught:
        load_case(path)
    assert (caught.value.file, caught.value.case, caught.value.field) == (str(path), "evil",
                                                                          f"speculative_config.{name}")


def test_check_names_a_speculative_config_that_imports_code(cases_dir, tmp_path, monkeypatch, capsys):
    """The steps of the report: a helper module beside the case, `check` run from the parent folder."""
    (cases_dir / "helpers.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\nclass Proposer: ...\n")
    write_case(cases_dir, "c", {**DRAFTED, "speculative_config": {"method": "custom_class",
                                                                  "model": "cases.helpers.Proposer"}})
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check", "--cases-dir", str(cases_dir)]) == FAILED
    out = capsys.readouterr().out
    assert "case 'c': field 'speculative_config.method'" in out and "custom_class imports the model" in out
    assert not (tmp_path / "imported").exists()


def test_the_shipped_speculative_fields_are_data():
    from kvmatrix.harness.vllm_compat.speculative import SPECULATIVE_CONFIG_FIELDS
    from kvmatrix.matrix.trust import DATA_SPECULATIVE_FIELDS

    known = frozenset().union(*(fields for _, fields in SPECULATIVE_CONFIG_FIELDS))
    assert DATA_SPECULATIVE_FIELDS <= known  # every name a real field of some release
    assert not DATA_SPECULATIVE_FIELDS & {"method", "model", "revision", "code_revision", "draft_load_config",
                                          "custom_method", "speculator_options", "suffix_decoding_corpus_tokens"}


# --- 2. a folder's own registry and pool import no code unless trusted -------------------------------------------

REGISTRY_CODE = [
    ("engine_args", {"worker_extension_cls": "kvreg.helpers.Ext"}, "llama.engine_args.worker_extension_cls"),
    ("engine_args", {"trust_remote_code": True}, "llama.engine_args.trust_remote_code"),
    ("engine_args", {"tokenizer": "/some/path"}, "llama.engine_args.tokenizer"),
    ("hub_engine_args", {"trust_remote_code": True}, "llama.hub_engine_args.trust_remote_code"),
    ("engine_args", {"hf_overrides": {"auto_map": {"AutoModel": "x.Y"}}}, "llama.engine_args.hf_overrides"),
    ("engine_args", {"load_format": "/tmp/loader"}, "llama.engine_args.load_format"),
    ("hub_id", "/etc", "llama.hub_id"),
    ("hub_id", "../../x/y", "llama.hub_id"),
    ("draft", {"method": "custom_class"}, "llama.draft.method"),
    ("draft", {"method": "ngram", "config": {"revision": "main"}}, "llama.draft.config.revision"),
]


def registry_with(folder: Path, field: str, value) -> None:
    models = yaml.safe_load((CASES_DIR / "_models.yaml").read_text())
    models["llama"] = {**models["llama"], field: value}
    (folder / "_models.yaml").write_text(yaml.safe_dump(models))


@pytest.mark.parametrize(("field", "value", "named"), REGISTRY_CODE, ids=lambda x: str(x)[:40])
def test_a_folders_own_registry_names_no_code_or_path_unless_trusted(cases_dir, monkeypatch, field, value, named):
    """Before: `engine_args: {worker_extension_cls: kvreg.helpers.Ext}` in a folder's `_models.yaml` got the module
    imported and the cell passed; trust_remote_code and a tokenizer path the same."""
    registry_with(cases_dir, field, value)
    with pytest.raises(CaseError) as caught:
        load_models(cases_dir)
    assert (caught.value.file, caught.value.field) == (str(cases_dir / "_models.yaml"), named)
    assert "--trust-case-code" in str(caught.value)
    monkeypatch.setenv(TRUST_CASE_CODE_ENV, "1")
    assert load_models(cases_dir)["llama"]  # the user's own folder, trusted like code


def test_a_folders_own_pool_names_no_code(cases_dir):
    pool = yaml.safe_load((cases_dir / "_pool.yaml").read_text())
    pool[CPU_CLASS]["engine_defaults"] = {"worker_cls": "evil.Worker"}
    (cases_dir / "_pool.yaml").write_text(yaml.safe_dump(pool))
    with pytest.raises(CaseError, match=rf"field '{CPU_CLASS}.engine_defaults.worker_cls'"):
        load_pool(cases_dir)


def test_the_builtin_registry_keeps_what_it_needs_and_only_its_own_entries_do(cases_dir, capsys):
    """DeepSeek-V2-Lite's trust_remote_code: the built-in registry is trusted, and so are its entries copied word for
    word into a folder (the tests' folders, a user's copy); the same setting on another entry, or the entry changed,
    needs --trust-case-code, which every command takes."""
    assert load_models()["deepseek-v2-lite-chat-full"].hub_engine_args["trust_remote_code"] is True
    assert load_models(cases_dir)["deepseek-v2-lite-chat-full"].hub_engine_args["trust_remote_code"] is True
    models = yaml.safe_load((cases_dir / "_models.yaml").read_text())
    models["deepseek-v2-lite-chat-full"]["hub_id"] = "someone/Else"
    (cases_dir / "_models.yaml").write_text(yaml.safe_dump(models))
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    assert cli.main(["check", "--cases-dir", str(cases_dir)]) == USAGE
    assert "field 'deepseek-v2-lite-chat-full.hub_engine_args.trust_remote_code'" in capsys.readouterr().err
    assert cli.main(["check", "--cases-dir", str(cases_dir), "--trust-case-code"]) == OK
    assert TRUST_CASE_CODE_ENV not in os.environ  # the trust ends with the command


# --- 3. no file outside the folder is read; quotes are short and escaped ----------------------------------------

SECRET = "root:$6$secret-hash-that-must-not-leak:19000:0:99999:7:::"


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "shadow"
    path.write_text("\n".join([SECRET] * 50) + "\n")
    return path


@pytest.mark.parametrize("name", ["x.yaml", "_models.yaml", "_pool.yaml", "_waivers.txt", "_block.yaml"])
def test_a_link_out_of_the_folder_is_refused_and_nothing_of_it_published(cases_dir, secret, capsys, name):
    """Before: `ln -s /etc/shadow DIR/x.yaml; kvmatrix check --cases-dir DIR` printed every line as `unknown field
    'root:*:...'`; a link named _waivers.txt or _models.yaml leaked its first line."""
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS], "include": ["_block.yaml"]})
    (cases_dir / "_block.yaml").write_text("description: shared\n")
    (cases_dir / name).unlink(missing_ok=True)
    (cases_dir / name).symlink_to(secret)
    code = cli.main(["check", "--cases-dir", str(cases_dir)])
    said = capsys.readouterr()
    refusals = ("a link to a file outside its folder", "'_block.yaml' is not a file in")  # include: its own check
    assert code in (FAILED, USAGE) and any(refusal in said.out + said.err for refusal in refusals)
    assert "secret-hash" not in said.out + said.err


def test_a_link_to_a_case_elsewhere_does_not_load(cases_dir, tmp_path):
    elsewhere = write_case(tmp_path, "elsewhere", {"model": "llama"})
    (cases_dir / "linked.yaml").symlink_to(elsewhere)
    with pytest.raises(CaseError, match="a link to a file outside its folder"):
        load_case(cases_dir / "linked.yaml")


def test_a_message_quotes_a_short_escaped_excerpt(cases_dir):
    path = write_case(cases_dir, "long", f'model: llama\n"{SECRET * 10}\\e[31m": 1\n')  # YAML's \e: ESC
    with pytest.raises(CaseError) as caught:
        load_case(path)
    said = str(caught.value)
    assert "unknown field" in said and SECRET * 3 not in said and "\x1b" not in said


# --- 6, 10. bounded timeouts and retries ---------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [("timeout_s", 1.0e300), ("timeout_s", 10 ** 7), ("retries", 1000000)])
def test_a_case_asks_for_a_bounded_timeout_and_retries(cases_dir, field, value):
    """Before: `timeout_s: 1.0e+300` raised OverflowError out of the run (nothing recorded, no report);
    `retries: 1000000` retried a failing cell for as long as the run was left alone."""
    path = write_case(cases_dir, "big", {"model": "llama", field: value})
    with pytest.raises(CaseError) as caught:
        load_case(path)
    assert caught.value.field == field and "less than or equal" in caught.value.message


@pytest.mark.parametrize("scale", ["1e9", "1e300", "101"])
def test_a_timeout_scale_past_the_bound_is_refused(cases_dir, tmp_path, capsys, scale):
    """Before: `--timeout-scale 1e9` raised an OverflowError traceback, nothing recorded, no report."""
    with pytest.raises(SystemExit) as caught:
        cli.main(["run", "--cases-dir", str(cases_dir), "--runs-dir", str(tmp_path / "runs"), "--timeout-scale", scale])
    assert caught.value.code == USAGE and "is over 100" in capsys.readouterr().err


# --- 8. patterns match in linear time -----------------------------------------------------------------------------

def test_patterns_match_in_linear_time(cases_dir):
    """Before: a waiver line `*a*a*a*a*a*a*a*a*a*a*Z*` beside a case named with 60 `a`s had not finished after
    120 s; `*?*?*?*?*?*?*?*?Z*` took 10.9 s for one built-in cell."""
    cell_id = "a" * 60 + "[kv=auto,skip=-,spec=-]"
    (waiver,) = parse_waivers("*a*a*a*a*a*a*a*a*a*a*Z* https://example.org/1\n", "w.txt")
    started = time.process_time()
    assert not waiver.matches(cell_id, CPU_CLASS)
    assert not cell_selected(cell_id, "*?*?*?*?*?*?*?*?Z*")
    assert not cell_selected("a" * 5000, "*a" * 200 + "*Z*")
    assert time.process_time() - started < 5  # a bound only against exponential time; it takes milliseconds


@pytest.mark.parametrize(("pattern", "text", "expected"), [
    ("*", "", True), ("", "", True), ("", "a", False), ("a*", "abc", True), ("*c", "abc", True),
    ("a*c", "ac", True), ("a*c", "ab", False), ("?b?", "abc", True), ("?b?", "abcd", False),
    ("x[kv=*]", "x[kv=fp8]", True), ("x[kv=*]", "y[kv=fp8]", False), ("*a*a", "aa", True), ("*a*a", "a", False),
    ("ab*ba", "aba", False), ("a*?*b", "ab", False), ("a*?*b", "axb", True), ("[*]", "[x]", True),
])
def test_the_pattern_matcher_agrees_with_the_regular_expression(pattern, text, expected):
    import re

    from kvmatrix.matrix.patterns import glob_fullmatch

    regex = re.compile(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), re.S)
    assert glob_fullmatch(pattern, text) is expected is (regex.fullmatch(text) is not None)


# --- 11. nothing in a cell id breaks a line, escapes the terminal or opens markup -------------------------------

@pytest.mark.parametrize("value", ["X\n[ 9/9 1.0 s] PASS  fake[kv=auto] @cpu-amx", "\x1b[2J", "<script>x</script>",
                                   "A,kv=fp8", "A]", "A B", ""])
def test_an_axis_value_is_a_word_in_a_cell_id(cases_dir, value):
    """Before: an attention_backend value with a line break passed `check` and forged a PASS progress line and a
    row of matrix.md; escape sequences reached the terminal raw."""
    path = write_case(cases_dir, "forge", {"model": "llama", "matrix": {"attention_backend": [value]}})
    with pytest.raises(CaseError) as caught:
        load_case(path)
    assert caught.value.field == "matrix.attention_backend.0" and "\n" not in str(caught.value)
    assert "\x1b" not in str(caught.value)


def test_a_waivers_file_that_is_no_regular_file_is_named(cases_dir):
    os.mkfifo(cases_dir / "_waivers.txt")
    with pytest.raises(WaiverError, match="not a regular file"):
        load_waivers(cases_dir / "_waivers.txt")
    shutil.rmtree(cases_dir)


def test_matrix_md_shows_a_case_s_markup_as_text(cases_dir):
    """Before: matrix.md kept raw HTML from case strings (a tag, a reason quoting them); matrix.html escaped it."""
    from kvmatrix.reports import markdown
    from tests.test_reports import RECORDS

    hostile = "<img src=x onerror=alert(1)>|x"
    text = markdown.render([{**RECORDS[1], "reason": hostile, "tags": [hostile]}])
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt;\\|x" in text
