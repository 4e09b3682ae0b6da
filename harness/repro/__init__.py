"""`kvmatrix repro`: one cell as a standalone Python script that needs only vLLM and torch."""
