"""The declared surface of the installed vLLM: for every GPU class of the pool, every attention backend of that
class's platform (standard, MLA, sparse MLA), every KV-cache dtype vLLM knows and the head size of the matrix's
model for that layer type, vLLM's own verdict on the configuration: declared supported, or its refusal reasons.
No engine starts; `python -m kvmatrix.harness.surface.declared OUT.json` writes it as JSON (how a surface is read in
another environment, for `kvmatrix surface --diff`: vLLM prints notes of its own on stdout)."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvmatrix.harness.models.tiny_llama import llama_config
from kvmatrix.harness.models.tiny_mla import deepseek_v32_config, mla_config
from kvmatrix.harness.vllm_compat import known_kv_cache_dtypes, reported_capability
from kvmatrix.harness.vllm_compat.declarations import (
    attention_backends,
    backend_kind,
    is_install_reason,
    platform_of,
    refusal_reasons,
)
from kvmatrix.matrix.load import load_pool
from kvmatrix.matrix.schema import GpuClass


def _mla_head(cfg: dict) -> int:
    return cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]


# Which model of the matrix serves each layer type, and its head size (the latent head for MLA).
FAMILIES = {
    "standard": ("llama", llama_config()["head_dim"]),
    "mla": ("deepseek-mla", _mla_head(mla_config("DeepseekV2ForCausalLM", "deepseek_v2"))),
    "sparse-mla": ("deepseek-v32", _mla_head(deepseek_v32_config())),
}


@dataclass
class Point:
    """One (class, backend, KV dtype) of the surface: declared supported when `reasons` is empty."""

    gpu_class: str
    backend: str
    kind: str
    kv_cache_dtype: str
    model: str
    head_size: int
    reasons: list[str] = field(default_factory=list)

    @property
    def supported(self) -> bool:
        return not self.reasons

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.gpu_class, self.backend, self.kv_cache_dtype, self.model


@dataclass
class Surface:
    vllm_version: str | None
    points: list[Point]
    unreadable: dict[str, str]  # backend -> why its declaration could not be read here

    def as_json(self) -> dict:
        return {"vllm_version": self.vllm_version, "points": [asdict(p) for p in self.points],
                "unreadable": self.unreadable}

    @classmethod
    def from_json(cls, data: dict) -> Surface:
        return cls(data.get("vllm_version"), [Point(**p) for p in data["points"]], data.get("unreadable", {}))


def _capability(gpu: GpuClass) -> tuple[int, int] | None:
    if gpu.compute_capability is None:
        return None
    major, minor = gpu.compute_capability.split(".")
    return int(major), int(minor)


def declared_surface(pool: dict[str, GpuClass], classes: list[str] | None = None) -> Surface:
    """The installed vLLM's declarations for `classes` (default: every class of the pool)."""
    from kvmatrix.harness.vllm_compat import installed_vllm_distribution

    classes = classes or list(pool)
    backends = attention_backends({pool[name].device for name in classes})
    dtypes = sorted(known_kv_cache_dtypes())
    version = installed_vllm_distribution()[1]
    points = []
    for name in classes:
        gpu, capability = pool[name], _capability(pool[name])
        # Declarations that ask the platform answer for this class, not for the machine reading them.
        with reported_capability(*capability, version) if capability else nullcontext():
            for backend, cls in backends.items():
                if isinstance(cls, str) or platform_of(backend) != gpu.device:
                    continue
                kind = backend_kind(cls)
                model, head = FAMILIES[kind]
                for dtype in dtypes:
                    reasons = refusal_reasons(cls, head_size=head, kv_cache_dtype=dtype, capability=capability)
                    points.append(Point(name, backend, kind, dtype, model, head, reasons))
    return Surface(version, points,
                   {b: err for b, err in backends.items() if isinstance(err, str)})


def summary_rows(surface: Surface) -> list[list]:
    """Per class: points, declared supported, refused by the declaration, refused for this install's build."""
    rows = []
    for gpu in dict.fromkeys(p.gpu_class for p in surface.points):
        mine = [p for p in surface.points if p.gpu_class == gpu]
        install = [p for p in mine if p.reasons and all(is_install_reason(r) for r in p.reasons)]
        supported = [p for p in mine if p.supported]
        backends = sorted({p.backend for p in supported})
        rows.append([gpu, len(mine), len(supported), len(mine) - len(supported) - len(install), len(install),
                     ", ".join(backends)])
    return rows


def main(argv: list[str]) -> int:
    Path(argv[0]).write_text(json.dumps(declared_surface(load_pool()).as_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
