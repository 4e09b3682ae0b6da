"""The order a run's cells start in and what each waits for, as policies composed in one list (start_order.py):
one policy a module behind the `StartPolicy` protocol (policy.py)."""
