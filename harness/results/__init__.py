"""Across runs: the history database, what changed since the previous run, and the CI pipeline definitions."""
