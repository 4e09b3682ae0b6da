"""`python -m kvmatrix.harness.cli`: the same as `python -m kvmatrix`."""

import sys

from kvmatrix.harness.cli import main

sys.exit(main())
