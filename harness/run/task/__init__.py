"""One task to its judged record (runner.py): whether it runs here at all, what its process is told
(spec.py: engine arguments and SPEC.json; speculative.py: the draft; accuracy.py: lm-eval), its attempts, and the
judging of each with its neighbours."""
