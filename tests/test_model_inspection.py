"""A one-rank cell inspects model classes in its own process (harness/vllm_compat/registry.py): with the real vLLM
installed here, the answer is the one vLLM's child process gives, vLLM caches it as it would, and no process is
started for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from kvmatrix.harness.record.paths import PACKAGE_ROOT

pytest.importorskip("vllm")

# A dense model and a hybrid one (its inspection answers differ: inner state, hybrid, attention-free layers).
ARCHITECTURES = ["LlamaForCausalLM", "NemotronHForCausalLM"]

SCRIPT = textwrap.dedent("""
    import dataclasses, json, os, shutil, subprocess, sys
    from vllm.model_executor.models.registry import ModelRegistry
    from kvmatrix.harness import vllm_compat

    cache = os.path.join(os.environ["VLLM_CACHE_ROOT"], "modelinfos")
    out = {}
    for arch in sys.argv[1:]:
        model = ModelRegistry.models[arch]
        shutil.rmtree(cache, ignore_errors=True)
        child = dataclasses.asdict(model.inspect_model_cls())  # vLLM's way: a child process

        shutil.rmtree(cache, ignore_errors=True)
        started = []
        real_run = subprocess.run
        subprocess.run = lambda *a, **k: started.append(a) or real_run(*a, **k)
        with vllm_compat.model_info_in_process(None) as in_process:
            here = dataclasses.asdict(model.inspect_model_cls())
        subprocess.run = real_run
        out[arch] = {"child": child, "here": here, "in_process": in_process, "processes": len(started),
                     "cached": sorted(os.listdir(cache)) if os.path.isdir(cache) else []}
    print("RESULT " + json.dumps(out))
""")


def test_in_process_inspection_equals_vllms_child_process(tmp_path):
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path), "PYTHONPATH": str(PACKAGE_ROOT)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *ARCHITECTURES], env=env, cwd=PACKAGE_ROOT,
                          capture_output=True, text=True, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
    results = json.loads(line[len("RESULT "):])
    for arch in ARCHITECTURES:
        got = results[arch]
        assert got["in_process"] is True
        assert got["here"] == got["child"], arch
        assert got["processes"] == 0, f"{arch}: a process was started for the inspection"
        assert len(got["cached"]) == 1 and got["cached"][0].endswith(f"-{arch}.json"), got["cached"]
    # The hybrid really answers differently: the comparison is not between two empty answers.
    assert results["NemotronHForCausalLM"]["here"] != results["LlamaForCausalLM"]["here"]


def test_a_vllm_without_the_child_process_function_inspects_as_it_always_did(monkeypatch):
    from kvmatrix.harness.vllm_compat import registry

    missing = ("kvmatrix.harness.record.paths", "no_such_function")
    monkeypatch.setattr(registry, "MODEL_INFO_CHILD_PROCESS", [("", missing)])
    with registry.model_info_in_process(None) as in_process:
        assert in_process is False
