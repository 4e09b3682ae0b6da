"""PR mode: which cells a vLLM change selects (and why) from stored records, on a small vLLM-like git history;
compiled changes refused; both sides run through bisection's steps (faked here: no vLLM) and diffed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvmatrix.harness.bisect.step import Step
from kvmatrix.harness.cli import main
from kvmatrix.harness.pr import base_head
from kvmatrix.harness.pr.select import file_module, load_records, select
from kvmatrix.harness.vllm_compat import traceback_modules
from tests.bisect_history import _commit, _git, build_history
from tests.conftest import needs_fp8_kv
from tests.test_bisect import CELL

FIXTURES = Path(__file__).parent / "fixtures" / "records"
CPU, H200 = FIXTURES / "cpu-vllm-0.32.0", FIXTURES / "h200-vllm-0.26.0"
BACKENDS = "vllm/v1/attention/backends"
FILES = {f"{BACKENDS}/cpu_attn.py": "x = 1\n", f"{BACKENDS}/flashinfer.py": "x = 1\n",
         f"{BACKENDS}/mla/__init__.py": "", f"{BACKENDS}/mla/cpu_mla.py": "x = 1\n",
         "vllm/config/cache.py": "x = 1\n", "csrc/cpu/attention.cpp": "int x;\n", "docs/README.md": "vLLM\n"}


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A vLLM-like checkout: base, then one commit per kind of change."""
    repo = tmp_path_factory.mktemp("vllm-repo")
    for rel, text in FILES.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "init", "-q")
    commits = {"base": _commit(repo, "base")}
    for name, paths in {"cpu_attn": [f"{BACKENDS}/cpu_attn.py", "docs/README.md"],
                        "flashinfer": [f"{BACKENDS}/flashinfer.py"], "config": ["vllm/config/cache.py"],
                        "kernel": ["csrc/cpu/attention.cpp", f"{BACKENDS}/cpu_attn.py"]}.items():
        _git(repo, "checkout", "-q", "--detach", commits["base"])
        for rel in paths:
            (repo / rel).write_text((repo / rel).read_text() + f"# {name}\n")
        commits[name] = _commit(repo, f"change {name}")
    return repo, commits


def _names(records: list[dict], backend: str, source: str) -> set[str]:
    """Cells whose records name a backend, or whose crash traceback runs through its file (read raw)."""
    out = set()
    for r in records:
        backends = {la.get("backend") for la in r.get("layers") or []} | {
            g.get("backend") for g in r.get("attn_groups") or []}
        trace = ((r.get("exception") or {}).get("traceback_tail") or "") + (r.get("log_tail") or "")
        if backend in backends or f"/{source}\"" in trace:
            out.add(r["cell_id"])
    return out


def test_a_backend_change_selects_only_the_cells_whose_records_name_it(history):
    repo, commits = history
    files, selection = base_head.selection_for(repo, commits["base"], commits["cpu_attn"], CPU)
    assert files == ["docs/README.md", f"{BACKENDS}/cpu_attn.py"]
    records = load_records(CPU)
    expected = _names(records, "CPU_ATTN", f"{BACKENDS}/cpu_attn.py")
    assert set(selection.cells) == expected and 0 < len(expected) < len(records)
    assert not any(c.startswith("deepseek_v2") for c in selection.cells)  # CPU_MLA only
    why = selection.cells["llama-auto"][0]
    assert why.path == f"{BACKENDS}/cpu_attn.py" and why.because.startswith("= vllm.v1.attention.backends.cpu_attn")
    assert "backend CPU_ATTN x4" in why.because and "builder CPUAttentionMetadataBuilder" in why.because
    text = "\n".join(selection.lines())
    assert "docs/README.md" in text.splitlines()[-1]  # named by no record


def test_on_h200_records_a_flashinfer_change_selects_flashinfer_cells(history):
    repo, commits = history
    _, selection = base_head.selection_for(repo, commits["base"], commits["flashinfer"], H200)
    assert set(selection.cells) == _names(load_records(H200), "FLASHINFER", f"{BACKENDS}/flashinfer.py")
    assert "flashinfer-qdtype[kv=fp8,skip=-,spec=-,attn=FLASHINFER]" in selection.cells
    assert "deepseek-mla[kv=fp8,skip=0,spec=-]" not in selection.cells
    crashed = selection.cells["fp8-every-backend[kv=fp8_e5m2,skip=-,spec=-,attn=FLASHINFER]"]
    assert any("its crash's traceback" in w.because for w in crashed)


def test_a_config_change_selects_every_cell_with_the_reason(history):
    repo, commits = history
    _, selection = base_head.selection_for(repo, commits["base"], commits["config"], CPU)
    assert set(selection.cells) == {r["cell_id"] for r in load_records(CPU)}
    (why,) = selection.cells["deepseek_v2-auto"]
    assert why.path == "vllm/config/cache.py" and "every cell depends on" in why.because
    assert "configuration" in why.because


def test_a_compiled_change_is_refused(history, tmp_path, capsys):
    repo, commits = history
    code = main(["pr", "--repo", str(repo), "--base", commits["base"], "--head", commits["kernel"],
                 "--records", str(CPU), "--folder", str(tmp_path / "pr")])
    err = capsys.readouterr().err
    assert code == 2 and "compiled code (csrc/cpu/attention.cpp)" in err and "only Python changes" in err


def test_recorded_module_fields_win_over_the_name_table(tmp_path):
    records = load_records(CPU)
    moved = copy.deepcopy(next(r for r in records if r["cell_id"] == "llama-auto"))
    new_home = "vllm.v1.attention.backends.cpu.attn"  # as if this vLLM had moved the classes
    for layer in moved["layers"]:
        layer["backend_module"] = new_home
    for group in moved["attn_groups"]:
        group["backend_module"], group["builder"]["module"] = new_home, new_home
    for group in moved["kv_groups"]:
        group["spec_module"] = "vllm.v1.kv_cache_interface"
    assert select([f"{BACKENDS}/cpu_attn.py"], [moved]).cells == {}
    assert list(select([f"{BACKENDS}/cpu/attn.py"], [moved]).cells) == ["llama-auto"]
    assert list(select([f"{BACKENDS}/cpu/__init__.py"], [moved]).cells) == ["llama-auto"]  # its package


def test_file_modules_and_traceback_modules():
    assert file_module("vllm/v1/core/block_pool.py") == ("vllm.v1.core.block_pool", False)
    assert file_module("vllm/v1/attention/__init__.py") == ("vllm.v1.attention", True)
    assert file_module("tests/test_x.py") is None and file_module("vllm/configs/x.json") is None
    trace = ('  File "/venv/lib/python3.11/site-packages/vllm/v1/core/kv_cache_utils.py", line 3, in f\n'
             '  File "/src/vllm/vllm/config/__init__.py", line 9\n  File "/venv/torch/nn/x.py", line 1\n')
    assert traceback_modules(trace) == ["vllm.v1.core.kv_cache_utils", "vllm.config"]


def _record(tmp_path: Path, side: str, verdict: str, kv: str) -> str:
    record = json.loads((CPU / "llama-auto.json").read_text())
    record.update(verdict=verdict, gpu_class="cpu-avx512", reason="" if verdict == "pass" else "layer 0: kv")
    for layer in record["layers"]:
        layer["kv_cache_dtype"] = kv
    path = tmp_path / f"{side}.json"
    path.write_text(json.dumps(record))
    return str(path)


def test_both_sides_run_as_steps_and_a_new_failure_exits_1(history, tmp_path, monkeypatch, capsys):
    repo, commits = history
    patch = tmp_path / "change.diff"
    patch.write_text(_git(repo, "diff", commits["base"], commits["cpu_attn"], "--", BACKENDS) + "\n")
    records = {"base": _record(tmp_path, "base", "pass", "auto"), "head": _record(tmp_path, "head", "fail", "fp8")}
    ran = []

    def run_steps(plan, ref, cells, label=""):
        checked_out = _git(Path(plan.checkout), "rev-parse", "HEAD")
        ran.append((tuple(cells), label, checked_out == ref, plan.overlay))
        return {cell: Step(ref, {"base": "good", "head": "bad"}[label], record=records[label], label=label, cell=cell)
                if cell == "llama-auto" else Step(ref, "skip", reason="not this one", label=label, cell=cell)
                for cell in cells}

    monkeypatch.setattr(base_head, "run_steps", run_steps)
    code = main(["pr", "--repo", str(repo), "--base", commits["base"], "--patch", str(patch),
                 "--records", str(CPU), "--folder", str(tmp_path / "pr")])
    out = capsys.readouterr().out
    assert code == 1, out
    assert [label for _, label, _, _ in ran] == ["base", "head"] and all(at for _, _, at, _ in ran)
    assert len({overlay for *_, overlay in ran}) == 1  # one overlay shared by every cell
    assert len(ran[0][0]) > 1 and ran[0][0] == ran[1][0], "each side runs every selected cell in one step"
    row = next(line for line in out.splitlines() if line.startswith("| `llama-auto`"))
    assert "| pass " in row and "| fail " in row and "kv auto → fp8" in row
    assert "not run: not this one" in out and "**New failures** (1)" in out
    assert "**New failures** (1)" in (tmp_path / "pr" / "result.md").read_text()
    assert not (tmp_path / "pr" / "checkout").exists()  # the worktree is removed


@pytest.mark.vllm
def test_the_backend_name_table_agrees_with_the_installed_vllm_registry():
    registry = pytest.importorskip("vllm.v1.attention.backends.registry")
    from kvmatrix.harness.vllm_compat import BACKEND_MODULES, for_version, installed_vllm_version

    (table,) = for_version(BACKEND_MODULES, installed_vllm_version())
    members = registry.AttentionBackendEnum.__members__
    checked = {name: members[name].value.rsplit(".", 1)[0] for name in table if name in members}
    assert len(checked) >= 10 and checked == {name: table[name] for name in checked}


def test_records_may_come_from_the_history_database(tmp_path):
    from kvmatrix.harness.results import history

    db_path = tmp_path / "history.sqlite"
    db = history.open_db(db_path)
    history.import_run(db, H200)
    latest = [r for r in load_records(H200) if r.get("run_id") == history.latest_run(db)]
    from_db = base_head.records_from(db_path)  # the latest run's records, every class of it
    assert sorted((r["gpu_class"], r["cell_id"]) for r in from_db) == sorted(
        (r["gpu_class"], r["cell_id"]) for r in latest)
    flashinfer = f"{BACKENDS}/flashinfer.py"
    assert select([flashinfer], from_db).cells.keys() == select([flashinfer], latest).cells.keys()


@pytest.mark.vllm
@needs_fp8_kv
def test_pr_runs_the_selected_cell_at_base_and_head_on_real_vllm(tmp_path, capsys):
    """Regression 1 of vllm-facts.md as a change: attention.py (a path every cell depends on) stops letting an
    explicit --kv-cache-dtype win, so the bfloat16 cell passes at base and fails at head."""
    pytest.importorskip("vllm")
    history = build_history(tmp_path / "vllm-repo", changes=1, regression_at=1)
    records = tmp_path / "records"
    records.mkdir()
    record = json.loads((CPU / "ct_llama-bfloat16.json").read_text())
    (records / "cpu--ct-llama.json").write_text(json.dumps({**record, "cell_id": CELL}))
    code = main(["pr", "--repo", str(history.repo), "--base", history.commits[0], "--head", history.regression,
                 "--records", str(records), "--folder", str(tmp_path / "pr")])
    out = capsys.readouterr().out
    print(out)
    assert code == 1, out
    assert "model_executor/layers/attention/attention.py: a path every cell depends on" in out
    row = next(line for line in out.splitlines() if line.startswith(f"| `{CELL}`"))
    assert "| pass " in row and "| fail " in row and "kv bfloat16 → fp8" in row, out
    assert not (tmp_path / "pr" / "checkout").exists()
