"""Conditions as terms, ranges and wildcards (the TensorRT-LLM test-db idea), shared by `when:` clauses,
GPU-class filters and expectation values.

A condition value is one of:
- a scalar: equal (strings with `*`, `?` or `[` are shell-style globs, case-sensitive);
- a string starting with a comparison operator: a range, e.g. ``">=8.0,<9.0"`` or ``"<0.27"``, compared as
  versions (compute capabilities and vLLM versions both read as versions) by `version_in`, the project's one
  version rule: a pre-release, dev or local build counts as its release (0.25.0rc1.dev3 is 0.25 for `>=0.25`);
- a list: any of its members matches (a list of lists compares lists as whole values).
"""

from __future__ import annotations

import fnmatch
import re
from typing import TypeGuard

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

_RANGE = re.compile(r"^\s*(==|!=|<=|>=|<|>|~=)")
_GLOB_CHARS = set("*?[")


def is_range(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(_RANGE.match(value))


def check_condition_value(value: object) -> str | None:
    """Returns why `value` is not a valid condition, or None."""
    if isinstance(value, list):
        for member in value:
            if isinstance(member, dict):
                return "a list of conditions holds scalars or lists, not mappings"
        return None
    if isinstance(value, dict):
        return "a condition is a scalar, a range string or a list, not a mapping"
    if is_range(value):
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            return f"invalid range {value!r} (write e.g. '>=8.0,<9.0')"
    return None


def release_of(version: str) -> Version:
    """A version as its release: "0.25.0rc1.dev3+g12" -> 0.25.0. Pre-releases and dev builds are built from the
    branch that already carries the release's changes, which is what ranges key on. Raises InvalidVersion
    (a ValueError) for what is not a version."""
    return Version(".".join(str(part) for part in Version(version).release))


def version_in(version: str, specifier: str) -> bool:
    """Whether `version`, as its release, lies in `specifier` (comma-separated clauses, all must hold)."""
    return SpecifierSet(specifier).contains(release_of(version), prereleases=True)


def matches(condition: object, actual: object) -> bool:
    """Does the recorded or configured value `actual` satisfy `condition`?"""
    if isinstance(condition, list) and not (isinstance(actual, list) and _is_flat(condition)):
        return any(matches(member, actual) for member in condition)
    if is_range(condition):
        if actual is None:
            return False
        try:
            return version_in(str(actual), condition)
        except InvalidVersion:
            return False
    if isinstance(condition, str) and _GLOB_CHARS & set(condition) and isinstance(actual, str):
        return fnmatch.fnmatchcase(actual, condition)
    if isinstance(condition, (int, float)) and not isinstance(condition, bool) and isinstance(actual, str):
        return str(condition) == actual
    return condition == actual


def _is_flat(values: list) -> bool:
    """A flat list compared with a list value is that value itself (skip layers `["0"]` vs `["0"]`)."""
    return all(not isinstance(v, list) for v in values)


def gpu_matches(condition: object, gpu: dict) -> bool:
    """A GPU-class condition: a class-name glob, or a mapping of pool fields (`name` is the class name)."""
    if isinstance(condition, list):
        return any(gpu_matches(c, gpu) for c in condition)
    if isinstance(condition, dict):
        for field, cond in condition.items():
            actual = gpu.get(field)
            if isinstance(actual, list) and actual and not isinstance(cond, list):
                if not any(matches(cond, a) for a in actual):  # memory_gb: [40, 80] matches '>=80'
                    return False
            elif not matches(cond, actual):
                return False
        return True
    return matches(condition, gpu.get("name"))


def when_matches(when: dict, context: dict) -> bool:
    """A `when:` clause against a cell's context (its axes, model, gpu class, vLLM version, emulation)."""
    for key, cond in when.items():
        if key == "gpu":
            if not gpu_matches(cond, context["gpu"]):
                return False
        elif not matches(cond, context.get(key)):
            return False
    return True
