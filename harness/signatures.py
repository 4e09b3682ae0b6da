"""Naming a cell's failure: the first signature in vllm_compat.SIGNATURES whose pattern occurs in the text.

Expectations refer to failures by these names (`crash: {signature: no_common_block_size}`), so a known failure
stays recognisable when vLLM rewords the surrounding log, and a new failure shows up as `unclassified`.
"""

from __future__ import annotations

import re

from harness.vllm_compat import SIGNATURES, version_matches

UNCLASSIFIED = "unclassified"
# "ValueError: ...", also inside a log line ("ERROR 11-29 ... [core.py:1] RuntimeError: ...") or qualified
# ("torch.OutOfMemoryError: ...").
_EXCEPTION_LINE = re.compile(r"\b(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception)\b: .*")
_LINE_CAP = 500


def classify(text: str, vllm_version: str | None) -> str:
    """The signature name for an exception message plus log tail, or `unclassified`.

    Exception lines are tried first: a log tail also holds warnings that mention other failures in passing.
    """
    if not text:
        return UNCLASSIFIED
    for part in ("\n".join(_EXCEPTION_LINE.findall(text)), text):
        for name, versions, patterns in SIGNATURES:
            if version_matches(vllm_version, versions) and any(re.search(p, part, re.I) for p in patterns):
                return name
    return UNCLASSIFIED


def last_exception_line(text: str) -> str:
    """The last `SomeError: message` line of a traceback or log (else its last non-empty line), capped."""
    found = _EXCEPTION_LINE.findall(text or "")
    if found:
        return found[-1].strip()[:_LINE_CAP]
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:_LINE_CAP] if lines else ""
