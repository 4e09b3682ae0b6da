"""Wide cells last: a cell spanning several GPUs runs once the one-GPU cells are done, on whole GPUs of its own;
one that needs more GPUs than this machine has stays with the rest and is skipped there (harness/run/task/runner.py
`gpus_reason`)."""

from __future__ import annotations

from dataclasses import replace

from kvmatrix.harness.run.order.policy import StartContext, StartOrder


class WideLast:
    def order(self, draft: StartOrder, context: StartContext) -> StartOrder:
        wide = tuple(t for t in draft.tasks if 1 < t.cell.gpus_needed <= context.devices)
        narrow = tuple(t for t in draft.tasks if t not in wide)
        return replace(draft, tasks=narrow, waits={t.key: draft.waits[t.key] for t in narrow}, wide=draft.wide + wide)
