"""A stand-in for `python -m kvmatrix.harness.cell.worker`: the production worker loop (`serve`) running the misbehaving
fake cells (tests/fake_cell.py) in-process, so a segfault, a kill or a hang takes the whole worker down, as a
real one would be. It retires after a CUDA error as the real worker does; it holds no GPU memory to check."""

from __future__ import annotations

import sys

from kvmatrix.harness.cell.worker import serve
from kvmatrix.harness.record.files import read_result
from kvmatrix.harness.vllm_compat import cuda_error_in
from tests.fake_cell import run


def serve_fake_cells(reply_fd: int) -> None:
    serve(run, reply_fd, lambda result_path: cuda_error_in(read_result(result_path)))


if __name__ == "__main__":
    serve_fake_cells(int(sys.argv[1]))
