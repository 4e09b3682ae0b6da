"""The HTML report in a real headless Chromium: loaded from disk, the diff sits above the matrix, each cell links
to its log, the filters (pre-set from the URL, as a shared link would) really hide rows, and a screenshot is kept
under reports/out/ as the test's artefact."""

from __future__ import annotations

import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.cli import main
from harness.records import RunDir
from tests.test_diff import BF16, SKIP_AUTO, SKIP_FP8, night_1, night_2
from tests.test_history import write_run

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

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "data-cell" in attrs:
            self.rows.append((attrs["data-cell"], "hidden" in attrs))
        elif tag == "a" and attrs.get("href", "").endswith(".log"):
            self.links.append(attrs["href"])
        elif tag in ("section", "table") and attrs.get("id"):
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
    rows.feed(chromium(profile, "--dump-dom", url))
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
    assert rows.sections == ["diff", "matrix"]
    assert sorted(cell for cell, _ in rows.rows) == sorted(r["cell_id"] for r in records)
    assert not any(hidden for _, hidden in rows.rows)
    assert len(rows.links) == len(records)
    for href in rows.links:
        assert (report.parent / href).is_file(), href


def test_verdict_filter_from_the_url_hides_other_rows(report, tmp_path):
    rows = dom(tmp_path / "profile", f"{report.as_uri()}?verdict=fail")
    assert [cell for cell, hidden in rows.rows if not hidden] == [BF16]
    assert len(rows.rows) == 5


def test_cell_filter_from_the_fragment_hides_other_rows(report, tmp_path):
    rows = dom(tmp_path / "profile", f"{report.as_uri()}#cell=llama-skip")
    assert sorted(cell for cell, hidden in rows.rows if not hidden) == [SKIP_AUTO, SKIP_FP8]


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
