"""`python -m kvmatrix ...`: the `kvmatrix` command, for an environment whose scripts are not on PATH."""

import sys

from kvmatrix.harness.cli import main

sys.exit(main())
