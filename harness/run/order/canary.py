"""The canary first (harness/run/canary.py): the plainest cell of the first model, picked in the order the earlier
runs gave, starts ahead of all and waits for nothing; a run without a canary (`settings.canary` off) has none."""

from __future__ import annotations

from dataclasses import replace

from kvmatrix.harness.run.canary import pick_canary
from kvmatrix.harness.run.order.policy import StartContext, StartOrder


class CanaryFirst:
    def order(self, draft: StartOrder, context: StartContext) -> StartOrder:
        if not context.settings.canary:
            return draft
        canary = pick_canary(list(draft.tasks), context.settings, dict(context.expected_failure),
                             list(context.finished))
        if canary is None:
            return draft
        return replace(draft, canary=canary, first=(canary, *draft.first))
