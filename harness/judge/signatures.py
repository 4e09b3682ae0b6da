"""Naming a cell's failure: the first signature in vllm_compat.SIGNATURES whose pattern occurs in the text.

Expectations refer to failures by these names (`crash: {signature: no_common_block_size}`), so a known failure
stays recognisable when vLLM rewords the surrounding log. A failure no pattern names has no signature: its
fingerprint (harness/judge/fingerprint.py) is what groups it with the same crash elsewhere.
"""

from __future__ import annotations

import re

from kvmatrix.harness.vllm_compat import SIGNATURES, version_matches

# "ValueError: ...", also inside a log line ("ERROR 11-29 ... [core.py:1] RuntimeError: ...") or qualified
# ("torch.OutOfMemoryError: ...").
_EXCEPTION_LINE = re.compile(r"\b(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception)\b: .*")
_LINE_CAP = 500


def classify(text: str, vllm_version: str | None) -> str | None:
    """The signature name for an exception message plus log tail; None when no pattern matches.

    Exception lines are tried first: a log tail also holds warnings that mention other failures in passing.
    """
    if not text:
        return None
    for part in ("\n".join(_EXCEPTION_LINE.findall(text)), text):
        for name, versions, patterns in SIGNATURES:
            if version_matches(vllm_version, versions) and any(re.search(p, part, re.I) for p in patterns):
                return name
    return None


def last_exception_line(text: str, last_line: bool = True) -> str:
    """The last `SomeError: message` line of a traceback or log (else, with `last_line`, its last non-empty
    line), capped."""
    found = _EXCEPTION_LINE.findall(text or "")
    if found:
        return found[-1].strip()[:_LINE_CAP]
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()] if last_line else []
    return lines[-1][:_LINE_CAP] if lines else ""
