"""An issue draft beside a minimal reproducer, in the shape of vLLM's bug report form: a title and a first paragraph
that say what vLLM did (the exception, its signature and the vLLM function that raised it; or the value it resolved
against the one it should have), then the environment (vLLM, torch, the GPU, `collect_env`), then the script,
expected and actual behaviour, the first bad release where a bisection found it, and where the finding is written
up. Markdown only: nothing here is executed, and the script is fenced with more backticks than it holds."""

from __future__ import annotations

import ast
import re
from typing import Any

from kvmatrix.harness.judge.fingerprint import failure_name
from kvmatrix.harness.judge.signatures import classify, last_exception_line
from kvmatrix.harness.record.types import JudgedRecord

# Engine arguments every minimal script sets to run small (not what the finding is about).
SMALL_RUN_ARGS = ("dtype", "max_model_len", "enforce_eager", "kv_cache_memory_bytes", "gpu_memory_utilization",
                  "load_format", "skip_tokenizer_init", "disable_log_stats")
NO_REFUSAL = "it started, and no refusal"  # what a runs script says where vLLM should have refused
SITE = re.compile(r" \(raised at (?P<site>[^)]*)\)$")
EXCEPTION = re.compile(r"(?:\w+\.)*\w*(?:Error|Exception|Interrupt): ")


def fenced(text: str, language: str = "") -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text.rstrip()}\n{fence}"


def configuration(spec: dict[str, Any]) -> str:
    """The engine arguments that are the finding's own, as a reader types them."""
    args = {k: v for k, v in spec["engine_args"].items() if k not in SMALL_RUN_ARGS}
    draft = args.get("speculative_config")
    if isinstance(draft, dict):
        args["speculative_config"] = {k: v for k, v in draft.items() if k != "model"}
    return ", ".join(f"{k}={v!r}" for k, v in args.items()) or "the defaults"


def what_vllm_did(record: JudgedRecord | None, said: str | None, expected: str,
                  version: str | None = None) -> str | None:
    """One sentence of what happened: from the script's own last words where it ran (the exception, its signature
    and the vLLM function that raised it; or what it resolved wrong), else from the record; None where neither
    says (the script has not run, no record)."""
    observed = (said or "").removeprefix("AssertionError: ").removeprefix(f"expected {expected}; ")
    if said and observed != said.removeprefix("AssertionError: "):
        return _observed(observed.removeprefix("observed: "), version)
    if record is None:
        return None
    crash = record.get("crash")
    if crash:  # the message as vLLM wrote it (the fingerprint's is normalized), where it was raised, its name
        message = last_exception_line(record.get("error_tail") or "") or f"{crash.get('type')}: {crash.get('message')}"
        phase = f" ({record.get('phase')} phase)" if record.get("phase") else ""
        named = record.get("signature") or classify(record.get("error_tail") or "", record.get("vllm_version"))
        return f"raises `{message}` in `{crash.get('site') or '?'}`{phase}, signature `{named or failure_name(record)}`"
    unmet = [e.get("detail", "") for e in record.get("expectations") or [] if not e.get("ok")]
    return f"resolves {'; '.join(unmet)}" if unmet else None


def _observed(text: str, version: str | None) -> str:
    """A script's observation in words: an exception with where it was raised, or the list of what is wrong."""
    site = SITE.search(text)
    if site or EXCEPTION.match(text):
        error = SITE.sub("", text)
        named = classify(error, version)
        return (f"raises `{error}`" + (f" in `{site['site']}`" if site else "")
                + (f", signature `{named}`" if named else ""))
    if text == NO_REFUSAL:
        return "starts without the refusal it should give"
    try:
        wrong = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return f"fails: {text}"
    return "resolves " + "; ".join(map(str, wrong)) if isinstance(wrong, list) else f"fails: {text}"


def _environment(record: JudgedRecord | None, gpu_class: str, version: str | None, ran_on: str | None) -> str:
    if record is None:
        seen = f"vLLM {version}; " if version else ""
        machine = f"; what the script said below was seen on {ran_on}" if ran_on else ""
        return (f"{seen}GPU class {gpu_class} (kvmatrix's name){machine}. Add the output of `python -m "
                "vllm.collect_env` from the machine that ran the script.")
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
           version: str | None = None, ran_on: str | None = None) -> str:
    """The draft's Markdown. `first_bad`: the releases' sentence (e.g. "0.26.0 (0.24.0 good)"), `link`: the
    findings entry, `said`: the script's last words where it has run, on vLLM `version`, on the machine `ran_on`
    describes where that is not of the script's class ("a real H100 (...)")."""
    seen = version or (record.get("vllm_version") if record is not None else None)
    did = what_vllm_did(record, said, expected, seen)
    where = f"vLLM {seen}" if seen else "vLLM"
    config = configuration(spec)
    short = (did or f"does not do what it should ({expected})").split(", signature")[0]
    title = f"[Bug]: {where} {short} with {config} on {spec['gpu_class']}"
    first = (f"With {config} on {spec['gpu_class']}, {where} {did}; expected: {expected}." if did else
             f"With {config} on {spec['gpu_class']}, {where} is expected to do this: {expected}. Run the script and "
             "paste what it says in place of this sentence.")
    lines = [
        f"<!-- title: {title} -->",
        first,
        "",
        "### Your current environment",
        "",
        "<details><summary>The output of <code>python collect_env.py</code></summary>",
        "",
        fenced(_environment(record, spec["gpu_class"], seen, ran_on), "text"),
        "</details>",
        "",
        "### 🐛 Describe the bug",
        "",
        f"The script below is standalone (vLLM and torch only; {len(script.splitlines())} lines, a tiny model with "
        "random weights); it exits 1 with an AssertionError where vLLM behaves so, 0 where it does not.",
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
