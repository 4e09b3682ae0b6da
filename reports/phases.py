"""Where a run's time went: every cell's wall time broken into the phases of harness/record/phases.py and summed
per GPU class (cell-seconds: with several slots they overlap, so they add up to more than the run's wall time)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from kvmatrix.harness.record.phases import DETAILS, PART_TITLES, PARTS, summed
from kvmatrix.harness.record.types import JudgedRecord

DETAIL_TITLES = {
    "flashinfer_jit_s": "FlashInfer JIT builds (nvcc)",
    "inductor_s": "Inductor compiling graphs (not from the cache)",
    "dynamo_s": "Dynamo tracing",
    "jit_warmup_s": "vLLM's kernel warm-up (Triton JIT)",
    "weights_s": "reading weights",
    "cpu_s": "CPU time of the cells' processes and their compilers",
}


def phase_table(timings: Iterable[Mapping[str, float] | None]) -> list[str]:
    """A Markdown table of the summed phases of these cells' timings, with the parts some cells have."""
    parts, details, ran = summed(timings)
    total = sum(parts.values())
    if not ran or total <= 0:
        return []
    lines = [f"{ran} cells, {total:.0f} cell-seconds ({total / ran:.1f} s a cell)", "",
             "| phase | cell-seconds | share | per cell |", "|:--|--:|--:|--:|"]
    lines += [f"| {PART_TITLES[part]} | {parts[part]:.0f} | {100 * parts[part] / total:.0f}% | "
              f"{parts[part] / ran:.1f} |" for part in PARTS]
    lines += [f"| of which: {DETAIL_TITLES[detail]} | {details[detail]:.0f} | | |"
              for detail in DETAILS if details[detail] > 0]
    return lines


def phase_lines(records: list[JudgedRecord]) -> list[str]:
    """The phase table of each GPU class's records (empty where no record ran)."""
    by_class: dict[str, list] = defaultdict(list)
    for record in records:
        by_class[record.get("gpu_class") or "?"].append(record.get("timings"))
    lines: list[str] = []
    for gpu_class, timings in by_class.items():
        table = phase_table(timings)
        if table:
            lines += [f"{gpu_class}: " + table[0], *table[1:], ""]
    return lines[:-1]
