"""The calibration's table (benchmarks/calibration.py): per class of cells (clean, a known fault, a planted decode
fault, a planted fault wrong in every mode) how many kvmatrix's verdict fails beside the rule it replaced, and one
line per cell with its numbers: against its eager twin teacher-forced, and against the model's bf16 reference
(teacher-forced on the reference's tokens, or under the same context where no forced decode was recorded)."""

from __future__ import annotations

from calibration_faults import Fault, reaches

from kvmatrix.harness.record.files import RunDir


def unwaived(record: dict) -> str:
    return (record.get("waived") or {}).get("verdict") or record["verdict"]


def old_rule_fails(record: dict) -> bool:
    """Whether the free-running rule (greedy tokens closely, logprob tolerance, near ties) fails the pair."""
    d = record.get("differential") or {}
    return bool(d.get("crash") and "only" in d["crash"]) or bool(d.get("state")) or \
        (d.get("tokens") or {}).get("ok") is False


def compared(record: dict) -> bool:
    """Whether the record was compared with its oracle or with its model's bf16 reference."""
    d = record.get("differential") or {}
    with_oracle = bool(d) and not d.get("missing") and not (d.get("crash") or "").startswith("both crash")
    reference = record.get("reference") or {}
    return with_oracle or "teacher_forced" in reference or "shared_context" in reference


def twin_fails(record: dict) -> bool:
    """Whether the comparison with the eager twin alone (not the reference) fails the cell."""
    d = record.get("differential") or {}
    return bool(d.get("crash") and "only" in d["crash"]) or bool(d.get("state")) or \
        (d.get("teacher_forced") or {}).get("ok") is False or (d.get("shared_context") or {}).get("ok") is False \
        or bool((d.get("answers") or {}).get("dropped"))


def cell_line(record: dict, kind: str) -> str:
    d = record.get("differential") or {}
    tf, answers = d.get("teacher_forced") or {}, d.get("answers") or {}
    cell, rule, floor = tf.get("cell") or {}, tf.get("rule") or {}, tf.get("floor") or {}
    numbers = (f"typical {cell.get('typical', 0):.4f}/{rule.get('typical_allowed', 0):.4f} worst "
               f"{cell.get('worst', 0):.3f} flips {cell.get('flips', 0)}/{cell.get('positions', 0)} (allowed "
               f"{rule.get('flip_rate_allowed', 0):.1%}) floor {floor.get('typical', 0):.4f}" if tf
               else f"no teacher-forced comparison ({d.get('teacher_forced_missing') or d.get('crash') or '-'})")
    right = f"answers {answers['right']}/{answers['n']} vs {answers['oracle_right']}" if answers else "answers -"
    return (f"  {kind:8} {record['cell_id']:62} {unwaived(record):5} {numbers}; {right}{reference_numbers(record)}; "
            f"old rule {'FAIL' if old_rule_fails(record) else 'pass'}")


def reference_numbers(record: dict) -> str:
    """The comparison with the model's bf16 reference: teacher-forced on its tokens (typical distance / allowed,
    flips), or under the same context (and why not teacher-forced)."""
    compared = record.get("reference") or {}
    forced, shared = compared.get("teacher_forced") or {}, compared.get("shared_context") or {}
    if forced:
        cell, rule = forced["cell"], forced["rule"]
        return (f"; vs bf16 reference teacher-forced {cell['typical']:.4f}/{rule['typical_allowed']:.4f} flips "
                f"{cell['flips']}/{cell['positions']} (allowed {rule['flip_rate_allowed']:.1%})")
    if shared:
        why = compared.get("teacher_forced_missing") or "not recorded"
        return f"; vs bf16 reference same context {shared['typical']:.4f}/{shared['allowed']:.4f} ({why})"
    return ""


def tally(clean: RunDir, planted: dict[str, tuple[Fault, RunDir, list[str]]], known_fault
          ) -> tuple[list[str], bool]:
    """The table's lines and whether the thresholds hold (no false alarm, every fault detected)."""
    # cells, kvmatrix fails, the old rule fails (every-mode faults: the comparison with the eager twin alone)
    rows = {"clean": [0, 0, 0], "known fault": [0, 0, 0], "planted": [0, 0, 0], "planted every mode": [0, 0, 0]}
    lines = []
    for record in clean.records():
        if record.get("noise_floor_summary"):  # an oracle: its own floor judged (a clean configuration's)
            count(rows["clean"], unwaived(record) in ("fail", "error"), False)
            summary = record["noise_floor_summary"]
            lines.append(f"  {'oracle':8} {record['cell_id']:62} {unwaived(record):5} noise floor "
                         f"{summary.get('typical', 0):.4f} typical, {summary.get('flips', 0)} flips")
        elif compared(record):
            kind = "known fault" if known_fault(record) else "clean"
            count(rows[kind], unwaived(record) in ("fail", "error"), old_rule_fails(record))
            lines.append(cell_line(record, kind))
    for name, (fault, run, cells) in planted.items():
        for record in (r for r in run.records() if r["cell_id"] in cells):
            if not reaches(fault, record):
                lines.append(f"  {'unplanted':8} {record['cell_id']:62} its backend reads nothing {name} patches")
                continue
            if fault.every_mode:
                count(rows["planted every mode"], unwaived(record) == "fail", twin_fails(record))
            else:
                count(rows["planted"], unwaived(record) == "fail", old_rule_fails(record))
            lines.append(cell_line(record, "planted") + f" [{name}]")
    n, new, old = rows["clean"]
    table = [f"{'':31} {'kvmatrix (new)':>16} {'old rule':>10}",
             f"{'false alarms / clean':31} {f'{new}/{n}':>16} {f'{old}/{n}':>10}"]
    for kind in ("known fault", "planted", "planted every mode"):
        n_, new_, old_ = rows[kind]
        table.append(f"{'detected / ' + kind:31} {f'{new_}/{n_}':>16} {f'{old_}/{n_}':>10}")
    ok = new == 0 and all(rows[k][1] == rows[k][0] for k in ("known fault", "planted", "planted every mode"))
    notes = ["clean cells: the compared cells (with their oracle, their bf16 reference or both) and the oracles "
             "(each judged by its own noise floor; the old rule judged no oracle). The old rule: the free-running "
             "tokens with a 0.1 logprob tolerance; for faults wrong in every mode, the comparison with the eager "
             "twin alone", "",
             "per cell (typical distance / allowed, worst, top-1 flips, the oracle's floor):"]
    return table + ["", *notes, *lines], ok


def count(row: list[int], new_fails: bool, old_fails: bool) -> None:
    row[0] += 1
    row[1] += new_fails
    row[2] += old_fails
