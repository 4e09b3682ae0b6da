"""`kvmatrix models`: the model registry a folder of cases runs with (its own `_models.yaml`, else the built-in
one): each name a case's `model:` or `speculative:` may use, where it comes from (a tiny local builder for offline
runs, a hub id with `--hub`), and what it is."""

from __future__ import annotations

import argparse

from tabulate import tabulate

from kvmatrix.harness.cli.exit_codes import OK
from kvmatrix.harness.run.guards import cases_dir_for
from kvmatrix.matrix.load import MODELS_FILE, load_models, shared_file


def add_arguments(mod: argparse.ArgumentParser) -> None:
    mod.add_argument("--cases-dir", help="folder of case files (default: the built-in cases)")
    mod.set_defaults(func=cmd_models)


def _short(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def cmd_models(args: argparse.Namespace) -> int:
    cases_dir = cases_dir_for(args.cases_dir)
    models = load_models(cases_dir)
    rows = [(name, entry.tiny or "-", entry.hub_id or "-",
             f"{entry.draft.method} ({entry.draft.num_speculative_tokens} tokens)" if entry.draft else "-",
             _short(entry.description)) for name, entry in models.items()]
    print(tabulate(rows, headers=("model", "tiny builder (offline)", "hub id (--hub)", "draft method", "what"),
                   tablefmt="github"))
    print(f"{len(models)} models in {shared_file(cases_dir, MODELS_FILE)}")
    return OK
