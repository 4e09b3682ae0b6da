"""The start order: every policy, in the order they apply. The earlier runs' order comes first (the canary is the
first plain cell in it); each later policy adds waits and moves cells within what the earlier ones decided; the
last places each cell after what it waits for, with the cells that start ahead of all in front."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType

from kvmatrix.harness.record.files import record_stem
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.order.baselines import BaselinesFirst
from kvmatrix.harness.run.order.canary import CanaryFirst
from kvmatrix.harness.run.order.confirmations import ConfirmationsAhead
from kvmatrix.harness.run.order.longest_first import LongestFirst
from kvmatrix.harness.run.order.pilots import PilotsAhead
from kvmatrix.harness.run.order.policy import PastRuns, StartContext, StartOrder, StartPolicy
from kvmatrix.harness.run.order.prerequisites import PrerequisitesFirst
from kvmatrix.harness.run.order.wide import WideLast
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.runner import expected_not_to_pass

POLICIES: tuple[StartPolicy, ...] = (
    LongestFirst(),        # the earlier runs' timings: failed last time first, then longest first
    CanaryFirst(),         # the plainest cell of the first model, alone ahead of all
    WideLast(),            # cells spanning several GPUs after the rest, on whole GPUs
    BaselinesFirst(),      # a compared cell waits for its baseline, oracle or twins
    PilotsAhead(),         # a cold kernel family's cells wait for its pilot
    ConfirmationsAhead(),  # a case's expected failures wait for the first, confirmed in a fresh process
    PrerequisitesFirst(),  # each cell after what it waits for; the cells ahead of all in front
)


def start_order(tasks: list[Task], context: StartContext) -> StartOrder:
    """The order `tasks` start in and what each waits for, every policy applied."""
    draft = StartOrder.given(tasks)
    for policy in POLICIES:
        draft = policy.order(draft, context)
    return replace(draft, expected_failure=context.expected_failure)


def planned_order(tasks: list[Task], settings: RunSettings, slots: int, devices: int, past: PastRuns,
                  finished: Sequence[JudgedRecord]) -> StartOrder:
    """The order a run's `tasks` start in, as its plan holds it: those not `finished` already (the run folder's
    records, a resumed run), each expected not to pass for the reason its case, a waiver or the earlier runs'
    verdicts give, on `slots` slots beside `devices` GPUs a cell may span."""
    done = {record_stem(r["cell_id"], r["gpu_class"]) for r in finished}
    todo = [t for t in tasks if t.key not in done]
    expected = {t.key: expected_not_to_pass(t, settings, dict(past.verdicts)) for t in todo}
    order = start_order(todo, StartContext(settings, expected, max(1, slots), devices, past, tuple(finished)))
    return replace(order, waits=MappingProxyType(dict(order.waits)),
                   expected_failure=MappingProxyType(dict(order.expected_failure)))
