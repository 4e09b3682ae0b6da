"""An issue draft beside a minimal reproducer, in the shape of vLLM's bug report form (environment, the bug with
its script, expected and actual behaviour, the first bad release where a bisection found it, where the finding is
written up). Markdown only: nothing here is executed, and the script is fenced with more backticks than it holds."""

from __future__ import annotations

import re
from typing import Any

from kvmatrix.harness.record.types import JudgedRecord


def fenced(text: str, language: str = "") -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text.rstrip()}\n{fence}"


def _environment(record: JudgedRecord | None, gpu_class: str, version: str | None) -> str:
    if record is None:
        seen = f"vLLM {version}; " if version else ""
        return (f"{seen}GPU class {gpu_class} (kvmatrix's name). Add the output of `python -m vllm.collect_env` from "
                "the machine that ran the script.")
    host = f", emulated on a real {record['emulated_from']}" if record.get("emulated_from") else ""
    return (f"vLLM {record.get('vllm_version')}, torch {record.get('torch_version')}, Python {record.get('python')}; "
            f"GPU class {gpu_class}{host}. Add the output of `python -m vllm.collect_env`.")


def _actual(record: JudgedRecord | None, said: str | None) -> str:
    if said:
        return f"the script ends in `{said}`"
    if record is None:
        return "the script's assertion fails: run it and paste its last lines."
    said = record.get("error_tail") or record.get("reason") or "-"
    return f"{record.get('verdict')} in kvmatrix: {said.strip().splitlines()[-1] if said.strip() else '-'}"


def render(spec: dict[str, Any], script: str, expected: str, record: JudgedRecord | None = None,
           first_bad: str | None = None, link: str | None = None, said: str | None = None,
           version: str | None = None) -> str:
    """The draft's Markdown. `first_bad`: the releases' sentence (e.g. "0.26.0 (0.24.0 good)"), `link`: the
    findings entry, `said`: the script's last words where it has run, on vLLM `version`."""
    observed = (said or "").removeprefix("AssertionError: ").split("; observed: ")[-1]
    title = f"[Bug]: {spec['cell']} on {spec['gpu_class']}: " + (observed[:120] or f"expected {expected}")
    lines = [
        f"<!-- title: {title} -->",
        "### Your current environment",
        "",
        "<details><summary>The output of <code>python collect_env.py</code></summary>",
        "",
        fenced(_environment(record, spec["gpu_class"], version), "text"),
        "</details>",
        "",
        "### 🐛 Describe the bug",
        "",
        f"The script below is standalone (vLLM and torch only; {len(script.splitlines())} lines, tiny random model). "
        f"Its last line asserts that {expected}; it fails.",
        "",
        fenced(script, "python"),
        "",
        f"**Expected:** {expected}.",
        "",
        f"**Actual:** {_actual(record, said)}",
        "",
        f"**First bad release:** {first_bad or 'not bisected'}",
        "",
        f"**Found by:** kvmatrix cell `{spec['cell']}` on `{spec['gpu_class']}`"
        + (f"; written up at {link}" if link else "") + ".",
        "",
        "### Before submitting a new issue...",
        "",
        "- [ ] Make sure you already searched for relevant issues, and asked the chatbot living at the bottom right "
        "corner of the [documentation page](https://docs.vllm.ai/en/latest/), which can answer lots of frequently "
        "asked questions.",
    ]
    return "\n".join(lines) + "\n"
