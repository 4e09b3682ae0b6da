"""JUnit XML for CI systems: a test suite per GPU class, a test case per cell. Expected failures are reported
as skipped with their reason (the pytest convention), so CI dashboards count them without turning red."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict

from kvmatrix.harness.judge.fingerprint import failure_name
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.reports.summary import fresh_rerun


def render(records: list[JudgedRecord]) -> str:
    by_class: dict[str, list[JudgedRecord]] = defaultdict(list)
    for r in records:
        by_class[r.get("gpu_class", "?")].append(r)
    root = ET.Element("testsuites", name="kvmatrix")
    for gpu, recs in by_class.items():
        suite = ET.SubElement(root, "testsuite", name=f"kvmatrix.{gpu}", tests=str(len(recs)),
                              failures=str(sum(r["verdict"] == "fail" for r in recs)),
                              errors=str(sum(r["verdict"] == "error" for r in recs)),
                              skipped=str(sum(r["verdict"] in ("skip", "xfail") for r in recs)))
        for r in recs:
            _testcase(suite, gpu, r)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _testcase(suite: ET.Element, gpu: str, r: JudgedRecord) -> None:
    case = ET.SubElement(suite, "testcase", classname=f"kvmatrix.{gpu}.{r.get('case')}",
                         name=r["cell_id"], time=str((r.get("timings") or {}).get("total_s", 0)))
    reason = r.get("reason", "")
    if r["verdict"] == "fail":
        ET.SubElement(case, "failure", message=reason, type=failure_name(r) or "expectation")
    elif r["verdict"] == "error":
        ET.SubElement(case, "error", message=reason)
    elif r["verdict"] == "skip":
        ET.SubElement(case, "skipped", message=reason)
    elif r["verdict"] == "xfail":
        ET.SubElement(case, "skipped", type="pytest.xfail", message=reason)
    out = [f"log: {r['log']}"] if r.get("log") else []
    if r.get("leak"):  # not a failure (the cell's results stand), but shown where CI shows a case
        properties = ET.SubElement(case, "properties")
        ET.SubElement(properties, "property", name="gpu_leak", value=r["leak"])
        out.append(f"LEAK: {r['leak']}")
    if r.get("warm_attempt"):
        out.append(f"run again in a fresh process: {fresh_rerun(r)}")
    if out:
        ET.SubElement(case, "system-out").text = "\n".join(out)
