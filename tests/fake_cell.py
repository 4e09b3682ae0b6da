"""A stand-in for `python -m kvmatrix.harness.cell` that misbehaves on purpose, chosen by the cell's case name (after an
optional ordering prefix, `3-segv`):
ok, hang, segv, killed, crash, cudaerror, orphan (leaves a grandchild behind), escaped (a grandchild that leaves
the cell's process group), noisy (megabytes of log), slow, envdump (records the GPUs and rank settings it was
given), awaits (passes once a "flags" cell has run beside it: FAKE_CELL_FLAG names their file; crashes otherwise).
It speaks the real cell protocol (SPEC.json in, RESULT.json out after each phase), so the harness under test
is exactly the production one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path


def write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def misbehave(behaviour: str, out: Path) -> None:
    """What a cell of this behaviour does before it ends as a crash or a run (some never get there)."""
    if behaviour == "hang":
        time.sleep(3600)
    if behaviour == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if behaviour == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if behaviour == "orphan":
        # A grandchild in the cell's process group, as vLLM's helpers would be; the harness must reap it.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        Path(out.with_suffix(".pid")).write_text(str(child.pid))
    if behaviour == "escaped":
        # A grandchild in a session of its own (a daemonised helper): killing the cell's group misses it.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
        Path(out.with_suffix(".pid")).write_text(str(child.pid))
    if behaviour == "noisy":
        line = "x" * 1023 + "\n"
        sys.stdout.write(line * 5 * 1024)
        sys.stdout.flush()
    if behaviour == "slow":
        time.sleep(float(os.environ.get("FAKE_CELL_SLEEP", "2")))


def flagged(flag: Path, within_s: float = 30.0) -> bool:
    """Whether `flag` exists now or appears within `within_s`."""
    deadline = time.monotonic() + within_s
    while not flag.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def broken_environment() -> None:
    """With FAKE_TEMPLATE=broken, "importing vLLM" fails, as in an environment that lacks one of its modules."""
    if os.environ.get("FAKE_TEMPLATE") == "broken":
        raise ModuleNotFoundError("No module named 'vllm._C'")


def run(spec_path: str, result_path: str) -> int:
    """One cell (in its own process, one of a fake warm worker's cells: tests/fake_worker.py, or forked from a fake
    template: tests/fake_template.py)."""
    spec = json.loads(Path(spec_path).read_text())
    out = Path(result_path)
    behaviour = re.sub(r"^\d+-", "", spec["cell_id"].split("[")[0])  # "3-segv": a case name that sorts 3rd
    result = {"vllm_version": "fake", "status": "ok", "phase": "import", "exception": None, "timings": {},
              "layers": [], "kv_groups": [], "attn_groups": [], "probe_error": None}
    try:
        broken_environment()
    except ModuleNotFoundError as exc:
        result.update(status="crash", exception={"type": type(exc).__name__, "message": str(exc),
                                                 "traceback_tail": f"ModuleNotFoundError: {exc}"})
        write(out, result)
        return 1
    result["phase"] = "init"
    write(out, result)
    print(f"fake cell {spec['cell_id']}: {behaviour}", flush=True)
    if behaviour == "awaits":  # passes only once a "flags" cell beside it has run: a test of cells side by side
        behaviour = "ok" if flagged(Path(os.environ["FAKE_CELL_FLAG"])) else "crash"
    if behaviour == "flags":
        Path(os.environ["FAKE_CELL_FLAG"]).touch()
    misbehave(behaviour, out)
    if behaviour == "cudaerror":  # a CUDA error poisons its process: a warm worker must retire after it
        result.update(status="crash", exception={"type": "AcceleratorError", "message": "CUDA error: an illegal "
                                                 "memory access was encountered", "traceback_tail": ""})
        write(out, result)
        return 1
    if behaviour == "crash":
        result.update(status="crash", exception={"type": "ValueError", "message": "No common block size for 32.",
                                                 "traceback_tail": "ValueError: No common block size for 32."})
        write(out, result)
        return 1
    layers = [{"name": f"model.layers.{i}.self_attn.attn", "index": i, "role": "target",
               "kv_cache_dtype": "auto", "backend": "FAKE", "spec_dtype": "bfloat16",
               "page_size_bytes": 32768, "group": 0} for i in range(4)]
    result.update(phase="done", layers=layers, tokens=[[1, 2, 3]], texts=["abc"], pid=os.getpid())
    if behaviour == "envdump":
        names = ("CUDA_VISIBLE_DEVICES", "VLLM_ALLOW_INSECURE_SERIALIZATION")
        result["env_seen"] = {name: os.environ.get(name) for name in names}
        result["engine_args_seen"] = spec["engine_args"]
    write(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], sys.argv[2]))
