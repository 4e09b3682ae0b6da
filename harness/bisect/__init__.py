"""Which vLLM release or commit turned a cell bad: environments per version, one step per ref, the report."""
