"""Shared helpers for the harness's own tests: a throwaway cases folder with the project's registry and pool."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from matrix.load import CASES_DIR

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def cases_dir(tmp_path: Path) -> Path:
    """An empty cases folder holding copies of the real model registry and GPU pool."""
    folder = tmp_path / "cases"
    folder.mkdir()
    for name in ("_models.yaml", "_pool.yaml"):
        shutil.copy(CASES_DIR / name, folder / name)
    return folder


def write_case(folder: Path, name: str, data: dict | str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path
