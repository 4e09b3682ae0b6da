"""Every CPU record the fixtures hold from real vLLM runs of the default matrix, judged again as `kvmatrix rejudge`
judges it, is written byte for byte as the judged record in tests/fixtures/judged-cpu/ (the output of an earlier
commit, its README says which), written in the record files' format (`json_text`: the golden copy holds the bytes
of the format then): a change to the record's types, its phases or the judge that moves any verdict, reason or
other field of any record shows here, field by field. The records are judged under that commit's case
files, frozen next to the golden copy, so that editing cases/ (a new rule, a waiver) does not move this test: it
guards the code.

`python -m tests.test_judged_equality` writes the golden copy again: only for a change meant to change judged
records, said so in its commit and in the folder's README.
"""

from __future__ import annotations

import datetime
import gzip
import json
import sys
import tarfile
from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir, json_text
from kvmatrix.harness.run.rejudge import rejudge_run
from kvmatrix.harness.run.session import session_waivers
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import case_files, load_cases, load_models, load_pool
from tests.conftest import FIXTURES

GOLDEN = FIXTURES / "judged-cpu" / "judged.json.gz"
FROZEN_CASES = FIXTURES / "judged-cpu" / "cases.tar.gz"
# Waivers expire: the golden copy was judged on this day, and every judgement now is made as of the same day.
JUDGED_ON = datetime.date(2026, 12, 2)
# (fixture folder of stored judged records, the class to judge them as: None keeps the class they carry). The AMX
# records carry `cpu-avx512` (captured before the harness had the class) and are judged as both.
SOURCES = [
    ("cpu-vllm-0.30.0", None),
    ("cpu-vllm-0.31.0", None),
    ("cpu-amx-vllm-0.32.0", None),
    ("cpu-amx-vllm-0.32.0", "cpu-amx"),
    ("execution-cpu-amx-vllm-0.32.0", None),
    ("glm-ct-kv-cpu-avx2-vllm-0.32.0", None),
    ("glm-fp8-cpu-vllm-0.32.0", None),
    ("tp2-cpu-vllm-0.32.0", None),
]


def source_name(folder: str, gpu_class: str | None) -> str:
    return folder if gpu_class is None else f"{folder}-as-{gpu_class}"


def stage(folder: str, gpu_class: str | None, root: Path) -> RunDir:
    """The fixture folder's records as a run folder holds them: under their record file names, with the log tail
    some of them carry written where their `log` field points (so reclassifying reads it as from a real run)."""
    run_dir = RunDir(root / source_name(folder, gpu_class))
    run_dir.root.mkdir(parents=True)
    for path in sorted((FIXTURES / "records" / folder).glob("*.json")):
        text = path.read_text()
        record = json.loads(text)
        if gpu_class is not None:
            record["gpu_class"] = gpu_class
            text = json.dumps(record, indent=1)
        run_dir.record_path(record["cell_id"], record["gpu_class"]).write_text(text)
        if record.get("log") and record.get("log_tail"):
            (run_dir.root / record["log"]).parent.mkdir(parents=True, exist_ok=True)
            (run_dir.root / record["log"]).write_text(record["log_tail"])
    return run_dir


def frozen_cases(root: Path) -> Path:
    with tarfile.open(FROZEN_CASES) as tar:
        tar.extractall(root, filter="data")
    return root / "cases"


def judged_files(folder: str, gpu_class: str | None, root: Path) -> dict[str, str]:
    """{record file name: its text} after `kvmatrix rejudge` of the staged folder under the frozen cases, whose
    place on this machine (a waiver names its file) is written `cases/`."""
    cases_dir = frozen_cases(root / "frozen")
    pool = load_pool(cases_dir)
    cells = {c.cell_id: c for c in expand_all(load_cases(case_files(cases_dir)), load_models(cases_dir), pool)}
    run_dir = stage(folder, gpu_class, root)
    rejudge_run(run_dir, cells, pool, session_waivers(cases_dir, pool), today=JUDGED_ON)
    return {path.name: path.read_text().replace(f"{cases_dir}/", "cases/")
            for path in sorted(run_dir.root.glob("*.json"))}


def field_differences(golden: dict, now: dict) -> list[str]:
    """Each field the two records disagree on, and a key order that differs (the bytes on disk would)."""
    lines = [f"  {key}: golden {golden.get(key, '<absent>')!r}\n  {' ' * len(key)}  now    {now.get(key, '<absent>')!r}"
             for key in dict.fromkeys([*golden, *now]) if golden.get(key, KeyError) != now.get(key, KeyError)]
    if not lines and list(golden) != list(now):
        lines.append(f"  key order: golden {list(golden)}\n             now    {list(now)}")
    return lines


def golden_copy() -> dict[str, dict[str, str]]:
    with gzip.open(GOLDEN, "rt") as f:
        return json.load(f)


@pytest.mark.parametrize(("folder", "gpu_class"), SOURCES, ids=[source_name(*s) for s in SOURCES])
def test_every_judged_record_equals_its_golden_copy(folder, gpu_class, tmp_path):
    golden = golden_copy()[source_name(folder, gpu_class)]
    now = judged_files(folder, gpu_class, tmp_path)
    assert sorted(now) == sorted(golden), "the same record files"
    problems = [f"{name}:\n" + "\n".join(field_differences(json.loads(golden[name]), json.loads(now[name])) or
                                         ["  (same fields, other bytes)"])
                for name in golden if now[name] != json_text(json.loads(golden[name]))]
    assert not problems, f"{len(problems)} of {len(golden)} judged records differ:\n" + "\n".join(problems)


def test_the_golden_copy_covers_every_verdict_and_both_amx_classes():
    """The comparison means something only over records that the judge treats differently."""
    records = [json.loads(text) for files in golden_copy().values() for text in files.values()]
    assert {r["verdict"] for r in records} >= {"pass", "fail", "xfail"}
    assert {r["gpu_class"] for r in records} >= {"cpu-avx2", "cpu-avx512", "cpu-amx"}
    assert len(records) > 150 and any(r.get("waived") for r in records)


def test_a_changed_field_is_named():
    golden = {"cell_id": "c", "verdict": "pass", "reason": "ok"}
    assert field_differences(golden, {**golden, "reason": "other"}) == [
        "  reason: golden 'ok'\n          now    'other'"]
    assert field_differences(golden, {"reason": "ok", "cell_id": "c", "verdict": "pass"})[0].startswith("  key order")
    assert field_differences(golden, {"cell_id": "c", "verdict": "pass"})[0].startswith("  reason")


def write_golden(root: Path) -> None:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    out = {source_name(*s): judged_files(*s, root / source_name(*s)) for s in SOURCES}
    with gzip.GzipFile(GOLDEN, "wb", mtime=0) as f:  # mtime 0: the same records give the same bytes
        f.write(json.dumps(out, indent=0, sort_keys=True).encode())


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        write_golden(Path(scratch))
    print(f"wrote {GOLDEN}", file=sys.stderr)
