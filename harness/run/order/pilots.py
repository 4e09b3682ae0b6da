"""Pilots (harness/run/pilots.py): with several slots on a cold machine, one cell of each kernel family compiles
its kernels while the family's other cells wait for it; unless the order is a history's (longest first), the
pilots lead, and those of a forced backend that compiles per KV dtype (the long JIT builds, a cold run's critical
path) start ahead of all."""

from __future__ import annotations

from dataclasses import replace

from kvmatrix.harness.run.cell_run import not_run_reason
from kvmatrix.harness.run.order.policy import StartContext, StartOrder
from kvmatrix.harness.run.pilots import pilot_gates, warm_families
from kvmatrix.harness.vllm_compat import compiles_per_kv_dtype


class PilotsAhead:
    def order(self, draft: StartOrder, context: StartContext) -> StartOrder:
        if context.slots <= 1:
            return draft
        settings, timed = context.settings, context.past.timed
        # A compared cell waits for its oracle (or twins), so it cannot be the pilot they wait for.
        can_pilot = {t.key for t in draft.tasks if context.expected_failure[t.key] is None
                     and not_run_reason(t, settings) is None and not t.cell.compared_with(t.gpu_name)}
        tasks, pilot_waits = pilot_gates(list(draft.tasks), warm_families(settings), can_pilot,
                                         pilots_first=not timed, backends=dict(context.past.backends))
        draft = replace(draft.with_waits(pilot_waits), tasks=tuple(tasks))
        if timed:
            return draft
        pilots = set().union(*pilot_waits.values())
        lead = tuple(t for t in tasks
                     if t.key in pilots and compiles_per_kv_dtype(t.cell.axes["attention_backend"] or ""))
        return replace(draft, first=draft.first + lead)
