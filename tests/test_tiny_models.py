"""Tiny checkpoints: deterministic, cached, atomic, and loadable by real vLLM.

The vLLM test runs this file as a script in one subprocess that starts the engines one after another
(in-process engines, `VLLM_ENABLE_V1_MULTIPROCESSING=0`): one `import vllm` for all models.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # no conftest needed

from kvmatrix.harness.models import tiny as tm  # noqa: E402
from kvmatrix.harness.models.checkpoint import BOS, MASK, VOCAB  # noqa: E402
from tests.conftest import needs_fp8_kv  # noqa: E402

PROMPT = "Hello world, the key"
MAX_TOKENS = 8


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


# ------------------------------------------------------------------------------------------- plain tests
def test_builds_are_deterministic(tmp_path):
    for name in tm.BUILDERS:
        a, b = tm.build(name, tmp_path / "a"), tm.build(name, tmp_path / "b")
        assert a.name == b.name
        assert _digest(a) == _digest(b), name
        weights = set() if name in tm.CONFIG_ONLY else {"model.safetensors"}
        assert {"config.json", "tokenizer.json", "tokenizer_config.json"} | weights <= set(_digest(a))


def test_build_is_cached_and_options_name_the_folder(tmp_path, monkeypatch):
    first = tm.build("llama", tmp_path)
    stamp = first.joinpath("model.safetensors").stat().st_mtime_ns
    assert tm.build("llama", tmp_path, seed=1) != first

    def boom(out, **kw):
        raise AssertionError("rebuilt a finished model")

    monkeypatch.setitem(tm.BUILDERS, "llama", boom)
    assert tm.build("llama", tmp_path) == first
    assert first.joinpath("model.safetensors").stat().st_mtime_ns == stamp

    off = tm.build("ct_llama", tmp_path, k_scale=1e-4)
    assert off != tm.build("ct_llama", tmp_path) and "k_scale=0.0001" in off.name
    with pytest.raises(TypeError):
        tm.build("ct_llama", tmp_path, no_such_option=1)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_concurrent_builds_and_killed_build_leftovers(tmp_path):
    dead = tmp_path / f".tmp-{2**22 + 12345}-llama-x"  # a pid above pid_max: its builder is gone
    dead.mkdir()
    (dead / "half.safetensors").write_bytes(b"x")
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda: paths.append(tm.build("llama", tmp_path))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1 and len(paths) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [paths[0].name]


def test_checkpoint_contents(tmp_path):
    from safetensors import safe_open
    from transformers import AutoTokenizer

    llama, ct = tm.build("llama", tmp_path), tm.build("ct_llama", tmp_path, k_scale=0.5)
    tok = AutoTokenizer.from_pretrained(llama)
    ids = tok(PROMPT)["input_ids"]
    assert ids[0] == tok.bos_token_id == BOS and max(ids) < VOCAB and tok.decode(ids[1:]) == PROMPT
    assert len(tok) <= VOCAB and tok.convert_ids_to_tokens(MASK) == "<mask>"

    cfg = json.loads((ct / "config.json").read_text())
    assert cfg["quantization_config"]["kv_cache_scheme"]["num_bits"] == 8
    with safe_open(llama / "model.safetensors", "pt") as a, safe_open(ct / "model.safetensors", "pt") as b:
        for k in a.keys():  # same weights, plus the scales
            assert a.get_tensor(k).equal(b.get_tensor(k)), k
        extra = set(b.keys()) - set(a.keys())
        assert extra == {f"model.layers.{n}.self_attn.{s}_scale" for n in range(4) for s in "kv"}
        assert b.get_tensor("model.layers.0.self_attn.k_scale").item() == 0.5

    draft = json.loads((tm.build("dflash_llama", tmp_path) / "config.json").read_text())
    ids = draft["dflash_config"]["target_layer_ids"]
    assert draft["num_target_layers"] == tm.num_layers("llama") and max(ids) < tm.num_layers("llama") - 1
    with safe_open(tm.build("dflash_llama", tmp_path) / "model.safetensors", "pt") as d:
        assert list(d.get_slice("fc.weight").get_shape()) == [128, 128 * len(ids)]
    drafts = {"dflash_llama", "eagle3_llama", "eagle3_llama_flat", "eagle3_llama_gqa4", "dflash_llama_mha",
              "llama_draft_small"}
    assert {n: tm.num_layers(n) for n in tm.BUILDERS} == {n: 1 if n in drafts else 4 for n in tm.BUILDERS}


# --------------------------------------------------------------------------------------------- real vLLM
# (label, model, options for build, extra LLM kwargs); "@dflash_llama" becomes the draft's folder.
CASES = [
    ("llama", "llama", {}, {}),
    ("ct_llama auto", "ct_llama", {}, {}),
    ("ct_llama bfloat16", "ct_llama", {}, {"kv_cache_dtype": "bfloat16"}),
    ("ct_llama clipping scales", "ct_llama", {"k_scale": 1e-4, "v_scale": 1e-4}, {}),
    ("deepseek_v2", "deepseek_v2", {}, {}),
    ("glm_mla", "glm_mla", {}, {}),
    (
        "llama + dflash",
        "llama",
        {},
        {"speculative_config": {"method": "dflash", "model": "@dflash_llama", "num_speculative_tokens": 3}},
    ),
]


def _child(cache_dir: Path) -> None:
    """Runs in the subprocess: one engine per case, sequentially; one JSON line per case on stdout."""
    import gc
    import time
    import traceback

    from vllm import LLM, SamplingParams

    for label, name, options, kwargs in CASES:
        spec = kwargs.get("speculative_config")
        if spec:
            kwargs = {**kwargs, "speculative_config": {**spec, "model": str(tm.build(spec["model"][1:], cache_dir))}}
        t0, res = time.monotonic(), {"label": label}
        try:
            llm = LLM(
                model=str(tm.build(name, cache_dir, **options)),
                kv_cache_memory_bytes=32 * 1024 * 1024,
                max_model_len=256,
                enforce_eager=True,
                dtype="bfloat16",
                **kwargs,
            )
            out = llm.generate([PROMPT], SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
            res["tokens"] = list(out[0].outputs[0].token_ids)
            del llm
        except Exception as e:  # report and go on: one broken model must not hide the others
            res["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        res["seconds"] = round(time.monotonic() - t0, 1)
        print("KVRESULT " + json.dumps(res), flush=True)
        gc.collect()


@pytest.mark.vllm
@needs_fp8_kv
def test_models_generate_in_real_vllm(tmp_path):
    pytest.importorskip("vllm")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # an empty value crashes; unset lets kv_cache_memory_bytes rule
    proc = subprocess.run(
        [sys.executable, __file__, str(tmp_path)], env=env, capture_output=True, text=True, timeout=900
    )
    results = {
        r["label"]: r
        for r in (json.loads(line[9:]) for line in proc.stdout.splitlines() if line.startswith("KVRESULT "))
    }
    tail = proc.stderr[-4000:]
    assert proc.returncode == 0 and set(results) == {c[0] for c in CASES}, tail
    errors = {k: r["error"] for k, r in results.items() if "error" in r}
    assert not errors, f"{errors}\n{tail}"
    assert all(len(r["tokens"]) == MAX_TOKENS for r in results.values())
    # Same weights, cache kept in bf16: exactly the plain Llama's tokens.
    assert results["ct_llama bfloat16"]["tokens"] == results["llama"]["tokens"]
    # The scales reach vLLM: scales 1e4x too small saturate fp8 and change what the model says.
    assert results["ct_llama clipping scales"]["tokens"] != results["ct_llama auto"]["tokens"]


if __name__ == "__main__":  # the subprocess of test_models_generate_in_real_vllm (vLLM spawns: keep under main)
    _child(Path(sys.argv[1]))
