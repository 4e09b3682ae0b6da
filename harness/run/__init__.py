"""Running cells, by role: the run as a whole (its plan, made once: plan.py; the session, settings, resuming, the
guards), the executors that run tasks behind one protocol (executor/: this machine's slots, or a Ray cluster),
the order cells start in (order/: one policy a module), one task to its judged record (task/), process mechanics
(process/) and the host's accounting (host/). docs/walk-of-a-cell.md follows one cell through them."""
