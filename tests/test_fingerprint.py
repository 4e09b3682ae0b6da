"""Crash fingerprints on records captured from real runs: every folder of tests/fixtures/records/ (one per machine
and vLLM version), so a folder added for another version is checked too. The same crash in other cells, classes
and versions has one fingerprint, different crashes have different ones; timeouts and kills go by phase. Only
fingerprints of records are compared with each other: no hash is written down here."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import traceback
from pathlib import Path

import pytest

from kvmatrix.harness.judge.fingerprint import fingerprint, normalize
from kvmatrix.harness.judge.outcome import classify_outcome, reclassified
from kvmatrix.harness.record.files import RunDir
from tests.conftest import FIXTURES

FOLDERS = sorted(p for p in (FIXTURES / "records").iterdir() if p.is_dir())
FIXTURE_FILES = sorted(path for folder in FOLDERS for path in folder.glob("*.json"))


def runner_record(result: dict) -> dict:
    """A captured result (or a whole captured record) as the runner completes it from the cell's exit."""
    return classify_outcome(1 if result["status"] == "crash" else 0, False, 600, result, result.get("log_tail") or "")


def label(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


CAPTURED = {label(path): runner_record(json.loads(path.read_text())) for path in FIXTURE_FILES}
FAILED = {name: rec for name, rec in CAPTURED.items() if rec["status"] != "ok"}

# The same crash, whichever cell, class or vLLM version it happened in: (its signature, fixtures it may be in).
SAME_CRASH = [
    # CPU MLA with an fp8 cache: the decode kernel reads the cache as bf16 (skip list or not).
    ("dtype_mismatch_at_decode", "cpu-*/deepseek_v2-fp8*"),
    # Every emulated B200 cell of vLLM 0.26.0 that needs the CUTLASS DSL, whatever its model and draft (0.33.0 asks
    # for it from two other frames, each its own crash).
    ("cutlass_missing", "h200-vllm-0.26.0/B200--*"),
    # FlashInfer's planned fp8 query dtype against fp8_e5m2 queries, on the real H200 and the emulated B200.
    ("flashinfer_q_dtype_mismatch", "h200-*/*--fp8-every-backend[[]kv=fp8_e5m2*"),
]


def test_fixtures_are_there():
    assert {"cpu-vllm-0.32.0", "h200-vllm-0.26.0"} <= {folder.name for folder in FOLDERS}
    assert len(FAILED) >= 10


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_failures_and_only_failures_are_fingerprinted_at_a_vllm_frame(name):
    record = CAPTURED[name]
    if record["status"] == "ok":
        assert "fingerprint" not in record and "crash" not in record
        return
    assert re.fullmatch(r"[0-9a-f]{8}", record["fingerprint"])
    exception, crash = record.get("exception") or {}, record["crash"]
    if "root cause" not in (exception.get("message") or ""):  # else the cause printed above it counts
        assert crash["type"] == exception.get("type", crash["type"])
    if "/vllm/" in (exception.get("traceback_tail") or ""):
        assert crash["site"].startswith("vllm.") and ":" in crash["site"], crash


@pytest.mark.parametrize(("signature", "pattern"), SAME_CRASH)
def test_the_same_crash_in_other_cells_and_versions_has_one_fingerprint(signature, pattern):
    same = {name: rec["fingerprint"] for name, rec in FAILED.items()
            if fnmatch.fnmatchcase(name, pattern) and rec["signature"] == signature}
    assert len(same) >= 2, same
    assert len(set(same.values())) == 1, same


def test_different_crashes_have_different_fingerprints():
    names_of: dict[str, set] = {}
    for rec in FAILED.values():
        names_of.setdefault(rec["fingerprint"], set()).add(rec["signature"])
    assert all(len(names) == 1 for names in names_of.values()), names_of
    assert len(names_of) >= len({rec["signature"] for rec in FAILED.values()}) >= 8


def moved(record: dict) -> dict:
    """The same crash on another machine, in another cell: other install path, line numbers, shapes, device."""
    def move(text: str) -> str:
        text = text.replace("/tmp/vllm-0.26.0/", "/home/ci/.venv/lib/python3.12/site-packages/")
        text = re.sub(r"line \d+", lambda m: f"line {int(m.group(0)[5:]) + 7}", text)
        return text.replace("16384x256", "8192x320").replace("384x128", "512x96")

    exception = record["exception"]
    return {**record, "exception": {"type": exception["type"], "message": move(exception["message"]),
                                    "traceback_tail": move(exception["traceback_tail"])}}


def test_placeholders_make_numbers_paths_and_sizes_irrelevant():
    assert normalize("Tried to allocate 2.00 GiB at 0x7f3a2c001000 in /tmp/tmpab12cd34/cache.bin (16384x256), "
                     "cuda:0 has 126.57/139.8 GiB free, see https://errors.pydantic.dev/2.12/v/x") == normalize(
        "Tried to allocate 512 MiB at 0x55d0aa in /home/u/.cache/vllm/x.bin (8x32), "
        "cuda:3 has 1.5/80 GiB free, see https://errors.pydantic.dev/2.11/v/x")
    # Dtype names are words, not numbers.
    assert normalize("found Float8_e4m3fn, bfloat16") != normalize("found Float8_e5m2, bfloat16")
    eagle = FAILED["h200-vllm-0.26.0/H200--llama-eagle3[kv=fp8,skip=4,spec=llama-eagle3]"]
    again = runner_record(moved(eagle))
    assert again["exception"]["message"] != eagle["exception"]["message"]
    assert again["fingerprint"] == eagle["fingerprint"]


def test_another_dtype_is_another_crash():
    assert runner_record(captured_with("Float8_e4m3fn", "Float8_e5m2"))["fingerprint"] != (
        FAILED["cpu-vllm-0.32.0/deepseek_v2-fp8"]["fingerprint"])


def engine_process_log(record: dict) -> tuple[dict, str]:
    """The same crash with vLLM's engine in its own process: the cell sees vLLM's wrapper, the root cause is in
    the log, printed by the engine process with its prefix."""
    engine = "\n".join(f"(EngineCore_DP0 pid=4242) {line}"
                       for line in ("Traceback (most recent call last):\n" + record["exception"]["traceback_tail"])
                       .splitlines())
    wrapper = ('Traceback (most recent call last):\n'
               '  File "/work/main/harness/cell.py", line 60, in run\n    return True, step()\n'
               '  File "/usr/lib/python3.12/site-packages/vllm/v1/engine/utils.py", line 1431, in '
               'wait_for_engine_startup\n    raise RuntimeError(\n'
               "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    result = {**record, "exception": {"type": "RuntimeError", "traceback_tail": wrapper,
                                      "message": "Engine core initialization failed. See root cause above. "
                                                 "Failed core proc(s): {}"}}
    return result, f"{engine}\nERROR 11-29 12:00:00 [core.py:9] EngineCore failed to start.\n{wrapper}"


@pytest.mark.parametrize("name", ["h200-vllm-0.26.0/H200--deepseek-mla[kv=fp8,skip=0,spec=-]",
                                  "cpu-vllm-0.32.0/deepseek_v2-fp8"])
def test_an_engine_wrapper_is_fingerprinted_by_the_root_cause_above_it(name):
    record = FAILED[name]
    wrapped, log = engine_process_log(record)
    again = classify_outcome(1, False, 600, wrapped, log)
    assert again["crash"] == record["crash"]
    assert again["fingerprint"] == record["fingerprint"]


def raise_in_vllm(tmp_path: Path) -> BaseException:
    """A real chained exception raised from files under a `vllm/` folder: `raise ... from` a KeyError."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "blocks.py").write_text(
        "def lookup(sizes, name):\n    return sizes[name]\n\n"
        "def select(sizes):\n    try:\n        return lookup(sizes, 'block_size')\n"
        "    except KeyError as err:\n        raise ValueError('cannot select a block size for 3 groups') from err\n")
    spec = importlib.util.spec_from_file_location("blocks_under_test", tmp_path / "vllm" / "blocks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.select({})
    except ValueError as err:
        return err
    raise AssertionError("select did not raise")


def test_a_chained_exception_is_fingerprinted_by_its_innermost_cause(tmp_path):
    err = raise_in_vllm(tmp_path)
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    crash = fingerprint({"status": "crash", "phase": "init", "exception": {
        "type": type(err).__name__, "message": str(err), "traceback_tail": text}})
    assert (crash.type, crash.message, crash.site) == ("KeyError", "'block_size'", "vllm.blocks:lookup")
    unchained = fingerprint({"status": "crash", "phase": "init", "exception": {
        "type": "ValueError", "message": str(err), "traceback_tail": text.split("The above exception")[-1]}})
    assert (unchained.type, unchained.site) == ("ValueError", "vllm.blocks:select")


def partial(name: str, phase: str) -> dict:
    """A cell's result file as it stands while the cell is still in `phase` (its status stays `ok` until then)."""
    result = json.loads((FIXTURES / "records" / "cpu-vllm-0.32.0" / f"{name}.json").read_text())
    return {**result, "status": "ok", "phase": phase, "exception": None}


def test_timeouts_and_kills_are_fingerprinted_by_phase():
    def fp(name: str, phase: str, returncode: int = 0, timed_out: bool = False, log: str = "") -> str:
        return classify_outcome(returncode, timed_out, 600, partial(name, phase), log)["fingerprint"]

    assert fp("llama-auto", "generate", timed_out=True) == fp("deepseek_v2-auto", "generate", timed_out=True)
    assert fp("llama-auto", "generate", timed_out=True) != fp("llama-auto", "init", timed_out=True)
    assert fp("llama-auto", "generate", -9, log="a") == fp("deepseek_v2-auto", "generate", -9, log="b")
    assert fp("llama-auto", "generate", -9) != fp("llama-auto", "init", -9)
    assert fp("llama-auto", "generate", -9) != fp("llama-auto", "generate", -15)
    assert fp("llama-auto", "generate", -9) != fp("llama-auto", "generate", timed_out=True)


def faulthandler_dump(address: str, prefix: str) -> str:
    return (f"Fatal Python error: Segmentation fault\n\nThread 0x00007f00000000aa (most recent call first):\n"
            f'  File "/usr/lib/python3.12/threading.py", line 331 in wait\n\n'
            f"Current thread {address} (most recent call first):\n"
            f'  File "{prefix}/torch/_ops.py", line 1279 in __call__\n'
            f'  File "{prefix}/vllm/_custom_ops.py", line 158 in mla_decode_kvcache_cpu\n'
            f'  File "{prefix}/vllm/v1/attention/backends/mla/cpu_mla.py", line 180 in forward_mqa\n\n'
            "Extension modules: numpy, torch (total: 2)\n")


def test_a_segfault_is_fingerprinted_by_signal_and_the_vllm_frame_it_died_in():
    one = classify_outcome(-11, False, 600, partial("deepseek_v2-auto", "generate"),
                   faulthandler_dump("0x00007f3a2c001000", "/work/main/.venv/lib/python3.11/site-packages"))
    two = classify_outcome(-11, False, 600, partial("deepseek_v2-fp8", "init"),
                   faulthandler_dump("0x00007fbb00c0ffee", "/opt/venv/lib/python3.12/site-packages"))
    assert (one["signature"], one["crash"]["site"]) == ("signal_SIGSEGV", "vllm._custom_ops:mla_decode_kvcache_cpu")
    assert one["fingerprint"] == two["fingerprint"]
    bare = classify_outcome(-11, False, 600, partial("deepseek_v2-auto", "generate"), "")
    assert bare["crash"]["phase"] == "generate" and bare["fingerprint"] != one["fingerprint"]
    aborted = classify_outcome(-6, False, 600, partial("deepseek_v2-auto", "generate"), "")
    assert aborted["fingerprint"] != bare["fingerprint"]


def captured_with(old: str, new: str) -> dict:
    """The captured CPU MLA crash (result, traceback and log) with `old` replaced by `new`."""
    path = FIXTURES / "records" / "cpu-vllm-0.32.0" / "deepseek_v2-fp8.json"
    return json.loads(path.read_text().replace(old, new))


def unnamed_crash() -> dict:
    """The captured CPU MLA crash with a message no signature names (a real one, of a broken checkpoint)."""
    return captured_with("expected scalar type BFloat16 but found Float8_e4m3fn",
                         "No Glm4MoE layer found in model.layers.")


def test_a_crash_no_signature_names_has_no_signature_but_a_fingerprint():
    record = runner_record(unnamed_crash())
    assert record["signature"] is None
    assert record["crash"]["type"] == "RuntimeError"
    assert record["fingerprint"] != FAILED["cpu-vllm-0.32.0/deepseek_v2-fp8"]["fingerprint"]


def test_rejudging_fingerprints_a_record_of_an_earlier_harness(tmp_path):
    """A record written before fingerprints (then named `unclassified`): rejudge names it None and fingerprints it
    as the runner does now, from its exception and the log in its run folder."""
    result = unnamed_crash()
    now = runner_record(result)
    run_dir = RunDir(tmp_path)
    run_dir.logs.mkdir()
    (run_dir.logs / "cell.log").write_text(result["log_tail"])
    old = {key: value for key, value in now.items() if key not in ("fingerprint", "crash", "log_tail")}
    old.update(signature="unclassified", log="logs/cell.log")
    old = reclassified(old, run_dir.log_tail(old))
    assert old["signature"] is None
    assert (old["fingerprint"], old["crash"]) == (now["fingerprint"], now["crash"])
    ran = CAPTURED["cpu-vllm-0.32.0/llama-auto"]
    assert reclassified(ran, run_dir.log_tail(ran)) == ran  # a cell that ran is left as it was
