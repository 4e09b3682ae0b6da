"""The HTML report in a real headless Chromium: loaded from disk, the diff sits above the grids and the list, each
cell links to its log, the filters (pre-set from the URL, as a shared link would) really hide rows and fade
squares, and a square shows its cell's last runs (history strip, and a table in its details); on the recorded
H200 run (several classes; pass, fail, error, skip) each record is a square of its case's grid, a click on a
square (`?open=`, which clicks it) opens its details with the per-layer table, and the skip toggle hides skipped
squares. Screenshots are kept under reports/out/ as the test's artefacts."""

from __future__ import annotations

import json
import re
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvmatrix.harness.cli import main
from kvmatrix.harness.record.files import RunDir
from kvmatrix.reports import html
from tests.conftest import FIXTURES, unpacked_archive
from tests.test_diff import BF16, SKIP_AUTO, SKIP_FP8, night_1, night_2
from tests.test_history import CPU, write_run

CHROMIUM = Path("/usr/bin/chromium")
ARTEFACTS = Path(__file__).resolve().parent.parent / "reports" / "out"
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs Chromium at /usr/bin/chromium (apt-get install chromium)")


class MatrixRows(HTMLParser):
    """(cell id, hidden) of each row of the matrix table, and the log links, as the browser left them."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[str, bool]] = []
        self.links: list[str] = []
        self.sections: list[str] = []
        self.squares: list[tuple[str, str, bool]] = []  # (cell id, verdict, faded by a filter)
        self.body_class = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if tag == "body":
            self.body_class = attrs.get("class") or ""
        elif tag == "td" and "sq" in classes:
            self.squares.append((attrs["data-cell"], classes[1], "off" in classes))  # class="sq <verdict> ..."
        elif tag == "tr" and "data-cell" in attrs:
            self.rows.append((attrs["data-cell"], "hidden" in attrs))
        elif tag == "a" and attrs.get("href", "").endswith(".log"):
            self.links.append(attrs["href"])
        elif tag in ("section", "table") and attrs.get("id") and attrs["id"] != "details":
            self.sections.append(attrs["id"])


def chromium(profile: Path, *args: str) -> str:
    done = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def dom(profile: Path, url: str) -> MatrixRows:
    rows = MatrixRows()
    rows.text = chromium(profile, "--dump-dom", url)
    rows.feed(rows.text)
    return rows


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """Night 2's report as the nightly merge job writes it: history import, then `kvmatrix diff --html`."""
    root = tmp_path_factory.mktemp("html")
    runs, db = root / "runs", root / "history.sqlite"
    write_run(runs / "night-1", night_1())
    run_dir = write_run(runs / "night-2", night_2())
    for rec in run_dir.records():
        log = run_dir.root / rec["log"]
        log.parent.mkdir(exist_ok=True)
        log.write_text(rec.get("log_tail", ""))
    page = run_dir.root / "matrix.html"
    assert main(["history", "import", "--db", str(db), str(runs / "night-1"), str(runs / "night-2")]) == 0
    assert main(["diff", "night-2", "--db", str(db), "--html", str(page), "--runs-dir", str(runs)]) == 1
    return page


def test_page_renders_diff_first_and_links_each_cell_to_its_log(report, tmp_path):
    rows = dom(tmp_path / "profile", report.as_uri())
    records = RunDir(report.parent).records()
    assert rows.sections == ["diff", "grids", "matrix"]
    assert sorted(cell for cell, _ in rows.rows) == sorted(r["cell_id"] for r in records)
    assert not any(hidden for _, hidden in rows.rows)
    assert len(rows.links) == len(records)
    for href in rows.links:
        assert (report.parent / href).is_file(), href


def test_verdict_filter_from_the_url_hides_other_rows(report, tmp_path):
    rows = dom(tmp_path / "profile", f"{report.as_uri()}?verdict=fail")
    assert [cell for cell, hidden in rows.rows if not hidden] == [BF16]
    assert len(rows.rows) == 5
    assert [cell for cell, _, faded in rows.squares if not faded] == [BF16]


def test_cell_filter_from_the_fragment_hides_other_rows(report, tmp_path):
    rows = dom(tmp_path / "profile", f"{report.as_uri()}#cell=llama-skip")
    assert sorted(cell for cell, hidden in rows.rows if not hidden) == [SKIP_AUTO, SKIP_FP8]


def test_a_square_shows_its_cells_last_runs(report, tmp_path):
    """The history strip (from the history database `kvmatrix diff` reads): the bf16 cell passed, then failed with
    an fp8 cache; the night it changed is marked, in the strip and in the panel's runs table."""
    text = dom(tmp_path / "profile", f"{report.as_uri()}?open={BF16}@{CPU}").text
    square = re.search(r'<td class="sq fail[^"]*"[^>]*data-cell="' + re.escape(BF16) + r'"[^>]*>(.*?)</td>', text)
    assert square and re.search(r'<span class="hist"><i class="pass" title="night-1: pass [^"]*kv bfloat16[^"]*">'
                                r'</i><i class="fail changed" title="night-2: fail [^"]*kv fp8', square.group(1))
    runs = re.search(r'<table class="history">(.*?)</table>', details_panel(text), re.S).group(1)
    assert re.search(r"<td>night-1</td><td>pass</td><td>[^<]*kv bfloat16[^<]*</td><td></td></tr>"
                     r"<tr><td>night-2</td><td>fail</td><td>[^<]*kv fp8[^<]*</td><td>changed</td>", runs)


def test_screenshot_is_saved_as_an_artefact(report, tmp_path):
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTEFACTS / "html-report.png"
    shot.unlink(missing_ok=True)
    chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,900", "--hide-scrollbars",
             report.as_uri())
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1400, 900)  # the IHDR chunk's width and height
    assert len(data) > 20_000  # a rendered page, not a blank one


H200_RUN = FIXTURES / "records" / "h200-vllm-0.26.0"
MLA_SKIP0 = "deepseek-mla[kv=fp8,skip=0,spec=-]"


@pytest.fixture(scope="module")
def h200_report(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The recorded H200 run of vLLM 0.26.0 (real H200 and emulated A10, A100, B200, L4 cells) as one page."""
    records = [json.loads(p.read_text()) for p in sorted(H200_RUN.glob("*.json"))]
    page = tmp_path_factory.mktemp("h200") / "matrix.html"
    page.write_text(html.render(records, "kvmatrix h200-vllm0.26.0"))
    return page, records


def details_panel(text: str) -> str:
    """The details panel's HTML as the browser left it ('' while it is hidden)."""
    match = re.search(r'<aside id="details"( hidden(="")?)?>(.*?)</aside>', text, re.S)
    assert match, "no details panel"
    return "" if match.group(1) else match.group(3)


def test_each_record_is_a_square_of_its_cases_grid(h200_report, tmp_path):
    page, records = h200_report
    rows = dom(tmp_path / "profile", page.as_uri())
    assert sorted((cell, v) for cell, v, _ in rows.squares) == sorted((r["cell_id"], r["verdict"]) for r in records)
    assert {"pass", "fail", "error", "skip"} <= {v for _, v, _ in rows.squares}
    assert rows.text.count('class="grid-case"') == len({r["case"] for r in records})
    assert details_panel(rows.text) == "" and "hide-skip" not in rows.body_class


def test_a_click_on_a_square_opens_its_layers(h200_report, tmp_path):
    page, _ = h200_report
    panel = details_panel(dom(tmp_path / "profile", f"{page.as_uri()}?open={MLA_SKIP0}@L4").text)
    assert f"{MLA_SKIP0} on L4" in panel
    layers = re.search(r'<table class="layers">(.*?)</table>', panel, re.S).group(1)
    assert layers.count("<tr>") == 1 + 4  # the header and the model's four layers
    assert "<td>model.layers.0.self_attn.attn</td><td>target</td><td>TRITON_MLA</td><td>auto</td>" in layers
    assert '<table class="kv-groups">' in panel and '<table class="builders">' in panel
    assert panel.count('<td class="ok-yes">ok</td>') == 4


def test_a_failures_details_link_its_findings_page_and_show_its_error(h200_report, tmp_path):
    page, _ = h200_report
    panel = details_panel(dom(tmp_path / "profile", f"{page.as_uri()}#open={MLA_SKIP0}@H200").text)
    assert 'class="finding" href="findings/H200--deepseek-mla%5Bkv%3Dfp8%2Cskip%3D0%2Cspec%3D-%5D--vllm0.26.0.md"' \
        in panel
    assert "No common block size for 32." in re.search(r'<pre class="error-tail">(.*?)</pre>', panel, re.S).group(1)


def test_the_skip_toggle_hides_skipped_squares(h200_report, tmp_path):
    page, _ = h200_report
    rows = dom(tmp_path / "profile", f"{page.as_uri()}?skip=hide")
    assert "hide-skip" in rows.body_class.split()
    assert "body.hide-skip td.sq.skip { visibility: hidden; }" in rows.text


def test_screenshots_of_the_grid_and_a_squares_details(h200_report, tmp_path):
    page, _ = h200_report
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    shots = {"html-grid.png": page.as_uri(), "html-grid-details.png": f"{page.as_uri()}?open={MLA_SKIP0}@L4"}
    for name, url in shots.items():
        shot = ARTEFACTS / name
        shot.unlink(missing_ok=True)
        chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,900", "--hide-scrollbars", url)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


DRAFT_BACKENDS_0_34 = FIXTURES / "runs" / "h200-vllm-0.34.0-2026-12-04.tar.xz"


def test_the_draft_backends_grid_of_the_0_34_run_shows_each_cell(tmp_path_factory, tmp_path):
    """The H200's vLLM 0.34.0 run filtered to spec-draft-backends (`?cell=`, as a shared link would): its 26
    records are 26 squares, the two FA3 crashes among them; the screenshot is reports/examples'
    html-grid-spec-draft-backends.png."""
    records = RunDir(unpacked_archive(tmp_path_factory, DRAFT_BACKENDS_0_34) / "cold").records()
    page = tmp_path / "matrix.html"
    page.write_text(html.render(records, "kvmatrix h200-vllm0.34.0"))
    url = f"{page.as_uri()}?cell=spec-draft-backends"
    shown = [(cell, v) for cell, v, faded in dom(tmp_path / "profile", url).squares if not faded]
    assert sorted(shown) == sorted((r["cell_id"], r["verdict"]) for r in records if r["case"] == "spec-draft-backends")
    assert len(shown) == 26 and [v for _, v in shown].count("fail") == 2
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTEFACTS / "html-grid-spec-draft-backends.png"
    shot.unlink(missing_ok=True)
    chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1700,560", "--hide-scrollbars", url)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
