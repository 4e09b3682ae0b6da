"""`kvmatrix init DIR`: a starter folder of one's own cases, one small case file and a README that says how to run
it. The folder borrows the built-in model registry, GPU pool and known failures until it brings its own."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import OK

CASE_NAME = "my-first-case.yaml"
CASE = """\
# A case is one file: a model of the registry, the GPU classes it runs on, the axes it varies (every combination
# is a cell) and what must hold in each cell. The registry (_models.yaml), the pool (_pool.yaml) and the known
# failures (_waivers.txt) are the built-in ones until this folder has its own files of those names.
description: the tiny Llama's KV cache in the model's dtype and in an explicit bfloat16
model: llama
gpus: ["*"]
matrix:
  kv_cache_dtype: [auto, bfloat16]
expect:
  - crash: false
  - layers: {kv_cache_dtype: [auto, bfloat16], spec_dtype: bfloat16}
"""
README = """\
# My kvmatrix cases

Each `*.yaml` here (not starting with `_`) is a case; `{case}` is a first one to copy from.

    kvmatrix list --cases-dir {folder}         # the cells these cases expand to
    kvmatrix run --cases-dir {folder}          # run them on this machine's class: reports under reports/runs/
    kvmatrix run --cases-dir {folder} -k 'my-first-case[kv=auto,skip=-,spec=-]'   # one cell, by its exact id

The case format, the expectations and the built-in cases are described in kvmatrix's README.
"""


def write_starter(folder: Path) -> list[Path]:
    """The starter files, written into `folder` (created); a file already there is kept, never overwritten."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in ((CASE_NAME, CASE), ("README.md", README.format(case=CASE_NAME, folder=folder))):
        path = folder / name
        if not path.exists():
            path.write_text(text)
            written.append(path)
    return written



def add_arguments(init: argparse.ArgumentParser) -> None:
    init.add_argument("folder")
    init.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    written = write_starter(Path(args.folder))
    for path in written:
        print(f"wrote {path}")
    print(f"next: kvmatrix list --cases-dir {args.folder}")
    return OK
