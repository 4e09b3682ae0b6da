"""`python -m kvmatrix.harness.cell SPEC.json RESULT.json`: one cell in its own process (the cell's work: main.py)."""

import os
import sys

from kvmatrix.harness.cell.main import main
from kvmatrix.harness.vllm_compat import IN_PROCESS_ENGINE_ENV

os.environ.update(IN_PROCESS_ENGINE_ENV)
code = main(*sys.argv[1:3])
sys.stdout.flush()
sys.stderr.flush()
# Skip interpreter teardown: vLLM's shutdown hooks can hang or crash after the result is already written,
# and the parent would then report a finished cell as timed out or killed.
os._exit(code)
