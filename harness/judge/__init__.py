"""From a record to its final verdict: expectations, accuracy against the baseline, failure signatures and
fingerprints, emulation and environment overrides, flaky retries and waivers."""
