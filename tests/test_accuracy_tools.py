"""A run whose accuracy cells cannot be evaluated here (lm-eval, scipy or statsmodels not importable: a GPU machine
without them carried) says so in one line before it starts, naming what is missing and how to get it; a run that has
them, or no accuracy cell, says nothing."""

from __future__ import annotations

import importlib.util

from kvmatrix.harness.run.task import accuracy
from tests.conftest import shipped_matrix


def test_a_run_without_lm_eval_says_so_before_it_starts(monkeypatch):
    _, cells, _ = shipped_matrix()
    everything = list(cells.values())
    assert accuracy.missing_accuracy_tools(everything) is None  # this environment has them
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else found(name, *a))
    line = accuracy.missing_accuracy_tools(everything)
    n = sum(1 for c in everything if c.case.accuracy is not None)
    assert line is not None and line.startswith("kvmatrix: lm-eval not installed here")
    assert f"this run's {n} accuracy cells will be skipped" in line and "'lm-eval>=0.4.13,<0.5'" in line
    assert accuracy.missing_accuracy_tools([c for c in everything if c.case.accuracy is None]) is None
