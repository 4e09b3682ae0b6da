"""`kvmatrix qualify` on real records, without vLLM: the H200 runs of vLLM 0.26.0 and 0.33.0 (tests/fixtures/records/,
each with the README saying how it was made) in as stored runs, the report and the exit status out; a change
bisected over a release in between whose step answers with the record the real 0.30.0 wrote on the H200; and the
waivers' advice, version bounds included."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kvmatrix.harness.judge.waivers import Waiver, parse_waivers
from kvmatrix.harness.qualify.compare import advise, bounded, widened
from kvmatrix.harness.qualify.sides import SideError, resolve_sides, stored_run
from tests.conftest import FIXTURES, shipped_matrix

REPO = Path(__file__).resolve().parents[1]
OLD, NEW = FIXTURES / "records" / "h200-vllm-0.26.0", FIXTURES / "records" / "h200-vllm-0.33.0"
GRAPHS = FIXTURES / "runs" / "h200-graphs-vllm-0.33.0-2026-12-02.tar.xz"
MLA_SKIP = "deepseek-mla[kv=fp8,skip=0,spec=-]"


def qualify(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvmatrix", "qualify", *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)


def digest(folder: Path) -> str:
    return hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sorted(folder.iterdir()))).hexdigest()


def test_two_stored_h200_runs_in_a_report_and_an_exit_status_out(tmp_path):
    """0.26.0 -> 0.33.0 on the H200: the MLA skip-layer crash is fixed, the block-size fix shows as pages and
    backends, 0.33.0's staged install without `cutlass` could not run the sparse-MLA cells (new errors, apart from
    vLLM's failures: CI must see them), and the stored folders are left as they were."""
    before = digest(OLD), digest(NEW)
    done = qualify("--old-run", str(OLD), "--new-run", str(NEW), "--out", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert (digest(OLD), digest(NEW)) == before
    data = json.loads((tmp_path / "qualification.json").read_text())
    assert (data["old"]["ref"], data["new"]["ref"], data["classes"]) == ("0.26.0", "0.33.0", ["H200"])
    sections = {s["name"]: {c["cell"]: c for c in s["changes"]} for s in data["sections"]}
    fixed = sections["fixed"][MLA_SKIP]
    assert fixed["move"] == "xfail → pass"
    assert "sig no_common_block_size → -" in fixed["detail"] and "page - → 73728/36864" in fixed["detail"]
    new_errors = sections["new_errors"]
    assert len(new_errors) == 19 and all("No module named 'cutlass'" in c["detail"] for c in new_errors.values())
    assert sections["new_failures"] == {} and data["fails"] == ["19 new error(s)"]
    text = (tmp_path / "qualification.md").read_text()
    assert text.startswith("# vLLM 0.33.0 against 0.26.0\n\n**FAIL: 19 new error(s)**")
    assert "no release between them given" in text and f"| `{MLA_SKIP}` | H200 | xfail → pass |" in text
    html = (tmp_path / "qualification.html").read_text()
    assert "vLLM 0.33.0 against 0.26.0" in html and "FAIL: 19 new error(s)" in html


def test_a_selection_and_fail_on_never(tmp_path):
    """-k narrows both runs to the same cells; --fail-on never reports without failing CI."""
    done = qualify("--old-run", str(OLD), "--new-run", str(NEW), "-k", "deepseek-mla", "--fail-on", "never",
                   "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "qualification.json").read_text())
    cells = {c["cell"] for s in data["sections"] for c in s["changes"]}
    assert cells and all(c.startswith("deepseek-mla[") for c in cells)
    assert all(f.endswith(("new failure(s)", "new error(s)")) for f in data["fails"])


def test_bad_input_is_a_usage_error_naming_it(tmp_path):
    done = qualify("--old-run", str(tmp_path / "nowhere"), "--new-run", str(NEW), "--out", str(tmp_path / "q"))
    assert done.returncode == 2 and "nowhere: no records there" in done.stderr
    done = qualify("--new-run", str(NEW), "--out", str(tmp_path / "q"))
    assert done.returncode == 2 and "the old release: give --old-run DIR" in done.stderr


def fake_release(version: str, records: Path) -> str:
    return f"{version}={sys.executable} {REPO / 'tests' / 'fake_release.py'} {version} {records}"


def test_a_fix_is_bisected_over_the_release_between_with_the_ends_from_the_runs(tmp_path):
    """deepseek-mla with layer 0 skipped crashed on 0.26.0 and runs on 0.33.0: the release given between (0.30.0,
    answering with the record the real 0.30.0 wrote on the H200 in the bisection of 2026-12-02) is the only step
    run; the ends come from the two runs."""
    with tarfile.open(GRAPHS) as archive:
        archive.extractall(tmp_path / "graphs", filter="data")
    records = tmp_path / "graphs" / "bisect" / "0.30.0"
    done = qualify("--old-run", str(OLD), "--new-run", str(NEW), "--env", fake_release("0.30.0", records),
                   "-k", MLA_SKIP, "--out", str(tmp_path / "q"))
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "q" / "qualification.json").read_text())
    assert data["between"] == ["0.30.0"]
    (fixed,) = next(s["changes"] for s in data["sections"] if s["name"] == "fixed")
    assert fixed["where"] == "first good 0.33.0 (last bad 0.30.0), bisected"
    steps = [json.loads(line) for line in (tmp_path / "q" / "bisect-H200" / "steps.jsonl").read_text().splitlines()]
    assert [(s["ref"], s["outcome"], s["label"]) for s in steps] == [
        ("0.26.0", "bad", "oldest (its run)"), ("0.33.0", "good", "newest (its run)"), ("0.30.0", "bad", "bisect")]
    assert "| where |" in (tmp_path / "q" / "qualification.md").read_text()


def test_sides_from_environments_and_stored_runs(tmp_path):
    from kvmatrix.harness.bisect.given import parse_env_args

    envs = parse_env_args([f"0.34.0={tmp_path}", f"0.30.0={tmp_path}", f"0.33.0={tmp_path}"])
    old, new, between = resolve_sides(envs, None, None)
    assert (old.ref, new.ref, [e.ref for e in between]) == ("0.30.0", "0.34.0", ["0.33.0"])
    old, new, between = resolve_sides(envs, OLD, None)  # a stored 0.26.0 run and three releases after it
    assert (old.ref, old.run, new.ref, [e.ref for e in between]) == ("0.26.0", OLD, "0.34.0", ["0.30.0", "0.33.0"])
    with pytest.raises(SideError, match="no --env 0.35.0=PATH"):
        resolve_sides(envs, None, None, new="0.35.0")
    with pytest.raises(SideError, match="not older"):
        resolve_sides(envs, NEW, None, new="0.30.0")


def test_an_environment_of_several_folders_is_a_pythonpath(tmp_path):
    """A staged release whose package reaches sys.path through a .pth file (cutlass): both folders go first on the
    step's PYTHONPATH, in order."""
    from kvmatrix.harness.bisect.given import given_env

    staged, extra = tmp_path / "vllm-0.34.0", tmp_path / "vllm-0.34.0" / "dsl_packages"
    extra.mkdir(parents=True)
    env = given_env("0.34.0", f"{staged}{os.pathsep}{extra}")
    assert env.command == (sys.executable,) and env.path_first == (str(staged), str(extra))
    assert given_env("0.34.0", f"{staged}{os.pathsep}{tmp_path / 'missing'}").command == ()  # not all folders


def test_a_run_folder_inside_an_archive_is_unpacked_once(tmp_path):
    folder = stored_run(f"{GRAPHS}:h200-vllm0.33.0-graphs-warm", tmp_path)
    assert folder.is_dir() and len(list(folder.glob("H200--*.json"))) == 75
    assert stored_run(f"{GRAPHS}:h200-vllm0.33.0-graphs-warm", tmp_path) == folder


@pytest.mark.parametrize(("scope", "new", "bound", "wide"), [
    (None, "0.34.0", "<0.34", None),
    (">=0.26", "0.34.0", ">=0.26,<0.34", ">=0.26,<0.35"),
    (">=0.26,<0.33", "0.34.0", ">=0.26,<0.34", ">=0.26,<0.35"),
    ("0.33.*", "0.34.0", "0.33.*", ">=0.33,<0.35"),
    ("<0.31", "0.34.0", "<0.34", "<0.35"),
])
def test_version_bounds(scope, new, bound, wide):
    assert bounded(scope, new) == bound
    assert widened(scope, new) == wide


def _record(cell: str, verdict: str, version: str, signature: str | None = None) -> dict:
    return {"cell_id": cell, "gpu_class": "H200", "verdict": verdict, "vllm_version": version,
            "signature": signature, "reason": ""}


def test_waiver_advice_from_both_runs():
    """Keep where its cells still fail; bound below the new release where they pass now; widen where they fail on
    the new release as before and nothing else waives them; remove where they fail on neither."""
    pool, _, _ = shipped_matrix()
    (open_ended, old_only, unused) = parse_waivers(
        "deepseek-mla[*]  gpu=H200  reports/findings/README.md#a\n"
        "glm-mla[*]  gpu=H200  vllm=0.33.*  reports/findings/README.md#b\n"
        "llama-skip[*]  gpu=H200  reports/findings/README.md#c\n", "w.txt", pool)
    cell, glm = "deepseek-mla[kv=fp8,skip=0,spec=-]", "glm-mla[kv=fp8,skip=0,spec=-]"
    skip = "llama-skip[kv=fp8,skip=-,spec=-]"
    old = [_record(cell, "fail", "0.33.0", "no_common_block_size"), _record(glm, "fail", "0.33.0", "x"),
           _record(skip, "pass", "0.33.0")]
    waivers = [open_ended, old_only, unused]
    passing = [_record(cell, "pass", "0.34.0"), _record(glm, "pass", "0.34.0"), _record(skip, "pass", "0.34.0")]
    failing = [_record(cell, "fail", "0.34.0", "no_common_block_size"), _record(glm, "fail", "0.34.0", "x"),
               _record(skip, "pass", "0.34.0")]
    assert advise(open_ended, old, failing, "0.33.0", "0.34.0", waivers).action == "keep"
    bound = advise(open_ended, old, passing, "0.33.0", "0.34.0", waivers)
    assert bound.action == "bound"
    assert bound.line == "deepseek-mla[*]  gpu=H200  vllm=<0.34  reports/findings/README.md#a"
    assert advise(old_only, old, passing, "0.33.0", "0.34.0", waivers).action == "keep"
    wide = advise(old_only, old, failing, "0.33.0", "0.34.0", waivers)
    assert wide.action == "widen"
    assert wide.line == "glm-mla[*]  gpu=H200  vllm=>=0.33,<0.35  reports/findings/README.md#b"
    other = [_record(glm, "fail", "0.34.0", "another_crash")]
    assert advise(old_only, old, other, "0.33.0", "0.34.0", waivers).action == "keep"  # a new failure, not this one
    assert advise(unused, old, passing, "0.33.0", "0.34.0", waivers).action == "remove"


def test_waiver_lines_keep_their_expiry():
    waiver = Waiver("x[*]", "https://example.org/1", ("H200",), datetime.date(2027, 1, 31), "w", 1, ">=0.26")
    assert advise(waiver, [_record("x[a]", "fail", "0.33.0")], [_record("x[a]", "pass", "0.34.0")], "0.33.0",
                  "0.34.0").line == "x[*]  gpu=H200  vllm=>=0.26,<0.34  https://example.org/1  until=2027-01-31"


# What benchmarks/qualify_on_gpu.sh brings back from the H200 (qualify.tar.xz), kept as a fixture once it has run.
QUALIFIED = FIXTURES / "runs" / "h200-qualify-vllm-0.34.0.tar.xz"
THIRD = FIXTURES / "runs" / "h200-graphs-vllm-0.33.0-2026-12-03-third.tar.xz"


def test_the_h200_qualification_of_0_34_0_is_what_its_records_say_under_the_widened_waivers(tmp_path):
    """The new run's records (new-run/) against the third session's 0.33.0 run, judged again here: the report made
    on the H200 (qualify/qualification.json, under the waivers of then) listed 23 new failures, each a known
    finding whose waiver stopped at 0.33 or the new draft-fp8 finding; under today's waivers (widened on that
    evidence) none is new, and every other change it listed is listed again."""
    with tarfile.open(QUALIFIED) as archive:
        archive.extractall(tmp_path, filter="data")
    done = qualify("--old-run", f"{THIRD}:kvruns/h200-vllm0.33.0-graphs", "--new-run", str(tmp_path / "new-run"),
                   "--gpu", "H200", "--no-findings", "--out", str(tmp_path / "again"))
    reported = json.loads((tmp_path / "qualify" / "qualification.json").read_text())
    again = json.loads((tmp_path / "again" / "qualification.json").read_text())
    cells = {(r["name"]): {c["cell"]: c["move"] for c in r["changes"]} for r in reported["sections"]}
    cells_again = {(r["name"]): {c["cell"]: c["move"] for c in r["changes"]} for r in again["sections"]}
    assert reported["fails"] == ["23 new failure(s)"] and len(cells["new_failures"]) == 23
    assert again["fails"] == [] and not cells_again["new_failures"] and done.returncode == 0, done.stderr
    for name, moves in cells.items():
        if name != "new_failures":
            assert moves.items() <= cells_again[name].items(), name
            assert set(cells_again[name]) - set(moves) <= set(cells["new_failures"]), name
