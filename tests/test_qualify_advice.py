"""`kvmatrix qualify`'s waiver advice and findings' verdicts on what the real qualification of vLLM 0.34.0 against
0.33.0 on the H200 read (tests/fixtures/runs/h200-qualify-waivers-vllm-0.34.0.tar.xz, tests/fixtures/logs/
h200-vllm-0.34.0/; their READMEs say how they were made): a waiver is widened only over the failures it waived on
the old release and never where its finding's script shows it fixed; cells skipped on the machine free no waiver;
a script's AssertionError behind vLLM's `[rank0]: ` prefixes is the finding still there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kvmatrix.harness.judge.waivers import parse_waivers
from kvmatrix.harness.qualify.compare import advise, judged_again
from kvmatrix.harness.qualify.recheck import last_words, outcome_of
from kvmatrix.harness.qualify.registry import read_status
from tests.conftest import FIXTURES, shipped_matrix

REPO = Path(__file__).resolve().parents[1]
RUNS = FIXTURES / "runs" / "h200-qualify-waivers-vllm-0.34.0.tar.xz"
LOG = FIXTURES / "logs" / "h200-vllm-0.34.0" / "full-cudagraph-decode-diverges--H200.log"
LOAD_CRASH = "reports/findings/README.md#glm-fp8-kv-scales-crash-load-weights"
IGNORED_SCHEME = "reports/findings/README.md#mla-ignores-checkpoint-kv-cache-scheme"
TP2 = "tp2-deepseek-mla[kv=fp8,skip=0,spec=-,tp=2*]"


@pytest.fixture(scope="module")
def qualified(tmp_path_factory):
    """(the fixture's folder, its waivers, both runs judged again without waivers under the shipped cases)."""
    root = tmp_path_factory.mktemp("qualify")
    with tarfile.open(RUNS) as archive:
        archive.extractall(root, filter="data")
    folder = root / "h200-qualify-waivers-vllm-0.34.0"
    pool, cells, _ = shipped_matrix()
    waivers = parse_waivers((folder / "waivers.txt").read_text(), "waivers.txt", pool)
    return folder, waivers, judged_again(folder / "old", cells, pool), judged_again(folder / "new", cells, pool)


def advice(qualified, checks=()) -> dict[int, tuple[str, str, str]]:
    """Each waiver's (action, why, line), by its line in waivers.txt."""
    _, waivers, old, new = qualified
    return {w.line: (a.action, a.why, a.line) for w in waivers
            for a in [advise(w, old, new, "0.33.0", "0.34.0", waivers, checks)]}


def test_the_old_release_s_waiver_is_widened_not_an_older_one_naming_the_same_cells(qualified):
    """0.34.0 fails glm-fp8 / glm-ct-kv as 0.33.0 did, for the ignored KV scheme: the 0.33.* waivers of that finding
    widen, the 0.26.* ones of the long-fixed load crash (lines 2, 3) keep their bound even with no script run."""
    got = advice(qualified)
    assert {line: action for line, (action, _, _) in got.items()} == {
        1: "not run", 2: "keep", 3: "keep", 4: "widen", 5: "widen", 6: "widen", 7: "widen"}
    assert "another waiver's" in got[2][1] and "another waiver's" in got[3][1]
    assert got[4][2] == ("glm-ct-kv[kv=auto,*]  gpu=L4,A100,A10,H100,H200,B200,RTX*  vllm=>=0.33,<0.35  "
                         + IGNORED_SCHEME)
    assert got[2][2].endswith("vllm=0.26.*  " + LOAD_CRASH)


def test_a_finding_its_script_shows_fixed_on_the_new_release_widens_no_waiver(qualified):
    """What the scripts said on 0.34.0: the load crash's exit 0 keeps its waivers bounded, the ignored scheme's
    exit 1 lets its own widen."""
    folder = qualified[0]
    checks = read_status(folder / "status.json")
    assert {(c.finding, c.outcome) for c in checks} >= {("glm-fp8-kv-scales-crash-load-weights", "good"),
                                                         ("mla-ignores-checkpoint-kv-cache-scheme", "bad")}
    got = advice(qualified, checks)
    assert got[2][0] == got[3][0] == "keep"
    assert "its finding's script shows it fixed there" in got[2][1]
    assert [got[line][0] for line in (4, 5, 6, 7)] == ["widen"] * 4


def test_cells_skipped_on_the_machine_free_no_waiver(qualified):
    """The TP=2 cells need two GPUs; on one H200 they were skipped on both releases: not run, not removable."""
    action, why, line = advice(qualified)[1]
    assert action == "not run" and line.startswith(TP2)
    assert why.startswith("its 2 cells were skipped on 0.34.0: needs 2 GPUs of class H200")


def test_the_script_s_assertion_behind_rank_prefixes_is_the_finding_still_there():
    said = last_words(LOG.read_text())
    assert said.startswith("AssertionError: expected the greedy tokens equal the eager oracle's")
    assert outcome_of(1, said) == "bad"
    assert outcome_of(None, said) == "no verdict"  # the time limit ended it: no verdict, whatever it printed
    assert last_words("[rank0]: AssertionError: expected layers [0, 1]: resolve fp8\n") == (
        "AssertionError: expected layers [0, 1]: resolve fp8")  # a message's own `]: ` is kept


def test_qualify_advises_from_the_status_file_when_no_script_runs(qualified, tmp_path):
    """The command on the stored runs, the status file standing for the scripts: the shipped waivers file's load
    crash waivers are not widened and the TP=2 waiver is not removed."""
    folder = qualified[0]
    done = subprocess.run(
        [sys.executable, "-m", "kvmatrix", "qualify", "--old-run", str(folder / "old"), "--new-run",
         str(folder / "new"), "--findings-status", str(folder / "status.json"), "--no-bisect", "--fail-on", "never",
         "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    waivers = json.loads((tmp_path / "qualification.json").read_text())["waivers"]
    load_crash = [w for w in waivers if w["line"].endswith(LOAD_CRASH) and w["action"] != "not in these runs"]
    assert load_crash and all(w["action"] == "keep" for w in load_crash)
    assert [w["action"] for w in waivers if w["pattern"] == TP2] == ["not run"]
