"""What runs in the cell's own process (`python -m kvmatrix.harness.cell SPEC.json RESULT.json`): start vLLM, probe what
it resolved, generate, and evaluate accuracy through the cell's own engine."""
