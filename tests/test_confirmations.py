"""Which warm-worker failures a fresh process has already confirmed (harness/run/task/confirmations.py), and the
gates that make a case's expected failures wait for its first (harness/run/order/confirmations.py: add_acyclic)."""

from __future__ import annotations

from kvmatrix.harness.run.order.confirmations import add_acyclic, confirmation_gates
from kvmatrix.harness.run.task.confirmations import Confirmations


def record(cell_id: str, isolation: str = "process", verdict: str = "xfail", status: str = "crash",
           signature: str | None = "no_common_block_size", **more) -> dict:
    return {"cell_id": cell_id, "case": "glm-fp8", "isolation": isolation, "verdict": verdict, "status": status,
            "signature": signature, **more}


def test_an_expected_failure_from_a_fresh_process_confirms_the_same_outcome_of_its_case():
    confirmations = Confirmations()
    assert not confirmations.has_group("glm-fp8", "waived (link)")
    confirmations.add(record("glm-fp8[kv=auto]"), "waived (link)")
    assert confirmations.has_group("glm-fp8", "waived (link)")
    assert not confirmations.has_group("glm-fp8", "waived (another link)")
    assert confirmations.confirmed_by(record("glm-fp8[kv=fp8]", isolation="worker")) == "glm-fp8[kv=auto]"
    # Another signature, another case, a FAIL or a signal: the warm run needs its own fresh process.
    assert confirmations.confirmed_by(record("glm-fp8[kv=fp8]", "worker", signature="oom")) is None
    assert confirmations.confirmed_by({**record("x", "worker"), "case": "glm-ct-kv"}) is None
    assert confirmations.confirmed_by(record("glm-fp8[kv=fp8]", "worker", verdict="fail")) is None
    assert confirmations.confirmed_by(record("glm-fp8[kv=fp8]", "worker", signal="SIGSEGV")) is None
    assert confirmations.confirmed_by(record("glm-fp8[kv=fp8]", "worker", status="timeout")) is None
    retired = {"pid": 7, "retired": "CUDA error in the cell (CUDA error)"}
    assert confirmations.confirmed_by(record("glm-fp8[kv=fp8]", "worker", worker=retired)) is None


def test_only_a_fresh_process_confirms():
    confirmations = Confirmations()
    confirmations.add(record("glm-fp8[kv=auto]", isolation="worker"), "waived (link)")
    confirmations.add(record("glm-fp8[kv=fp8]", verdict="fail"), "waived (link)")
    assert not confirmations.has_group("glm-fp8", "waived (link)")
    assert confirmations.confirmed_by(record("glm-fp8[kv=bf16]", isolation="worker")) is None


class _Case:
    def __init__(self, name: str) -> None:
        self.name = name


class _Cell:
    def __init__(self, case: str) -> None:
        self.case = _Case(case)


class _Task:
    def __init__(self, key: str, case: str) -> None:
        self.key, self.cell = key, _Cell(case)


def test_a_cases_expected_failures_wait_for_the_first_expected_for_the_same_reason():
    tasks = [_Task("a1", "a"), _Task("b1", "b"), _Task("a2", "a"), _Task("a3", "a"), _Task("b2", "b"),
             _Task("a4", "a")]
    expected = {"a1": "waived (x)", "a2": "waived (x)", "a3": None, "b1": None, "b2": "the case expects failure x",
                "a4": "waived (y)"}
    assert confirmation_gates(tasks, expected) == {"a1": set(), "b1": set(), "a2": {"a1"}, "a3": set(),
                                                   "b2": set(), "a4": set()}


def test_a_gate_that_would_close_a_cycle_is_left_out():
    waits = {"pilot": set(), "a1": {"pilot"}, "a2": set()}
    # a2 is a1's confirmation gate, but a1 already waits (through the pilot) for nothing of a2's: kept. A gate
    # making the pilot wait for a1, which waits for the pilot, would never open: dropped.
    merged = add_acyclic(waits, {"a2": {"a1"}, "pilot": {"a1"}})
    assert merged == {"pilot": set(), "a1": {"pilot"}, "a2": {"a1"}}
    assert waits == {"pilot": set(), "a1": {"pilot"}, "a2": set()}  # not changed in place
