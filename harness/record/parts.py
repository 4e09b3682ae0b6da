"""The parts of a cell record (harness/record/types.py, its phases), one TypedDict each, open to other keys: the
axes, what the probe resolved (layers, KV-cache groups, attention groups and their builders), what the cell
process recorded (exception, timings, emulation, accuracy), the outcome (crash, GPU-memory check) and the warm worker
that ran it. What judging adds is judged_parts.py's."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from kvmatrix.matrix.axes import Axes  # noqa: F401  (the record's `axes`: defined with the matrix it places a cell on)

# The verdicts, worst first: the one order every report and table counts, sorts and lists them in.
Verdict = Literal["fail", "error", "xfail", "pass", "skip"]
# ok / crash: the cell process's own; timeout / killed / error: the runner's (harness/judge/outcome.py).
Status = Literal["ok", "crash", "timeout", "killed", "error", "skipped"]
Mode = Literal["full", "probe"]  # probe: `kvmatrix run --probe-only`; records from before the modes ran in full
# How a cell's process started: its command run ("exec"), or forked from a template that had imported torch and
# vLLM (harness/run/process/template_client.py).
ProcessStartedBy = Literal["exec", "fork"]

VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
# What makes a run red (its exit status), a cell a new failure, a waiver apply, a retry happen.
FAILING_VERDICTS = ("fail", "error")
# What a report lists one by one below its table: the failures and the expected ones.
LISTED_VERDICTS = (*FAILING_VERDICTS, "xfail")
open_to_other_keys = with_config(ConfigDict(extra="allow"))


# --- what the worker resolved (harness/cell/probe.py) ------------------------------------------------------


@open_to_other_keys
class Layer(TypedDict, total=False):
    """One attention layer: what `layers:` expectations select and check (matrix/expectations.py LAYER_FIELDS)."""

    name: str
    index: int | None
    role: Literal["target", "draft"]
    kv_cache_dtype: str | None
    backend: str | None
    backend_module: str | None  # the vLLM source module of the backend class (vllm_compat/modules.py)
    quant_method_module: str | None  # the module of the layer's quant method class, if it has one
    spec_dtype: str | None
    page_size_bytes: int | None
    group: int | None
    k_scale: float | None
    v_scale: float | None


@open_to_other_keys
class RankState(TypedDict, total=False):
    """What one rank of a multi-GPU cell resolved (harness/cell/probe.py on every rank; rank 0's is the record's
    own `layers` / `kv_groups` too)."""

    rank: int
    layers: list[Layer]
    kv_groups: list[KvGroup]


@open_to_other_keys
class KvGroup(TypedDict, total=False):
    """One KV-cache group and its spec (vllm_compat.KV_SPEC_FIELDS): what `groups:` expectations check."""

    group: int
    layer_names: list[str]
    spec_type: str | None
    spec_module: str | None
    dtype: str | None
    block_size: int | None
    page_size_bytes: int | None
    kv_quant_mode: str | None
    cache_dtype_str: str | None


# An attention metadata builder's dtypes: the named ones (vllm_compat.BUILDER_DTYPE_ATTRS, with the current names
# of renamed ones, vllm_compat.QUERY_DTYPE_FIELDS) and any other attribute holding a dtype. `class` is a keyword,
# hence the functional form, opened by a call (a type checker reads no decorator there).
Builder = TypedDict("Builder", {
    "class": str,
    "module": str | None,
    "q_data_type_prefill": str | None,
    "q_data_type_decode": str | None,
    "q_data_type": str | None,
    "cache_dtype": str | None,
    "kv_cache_dtype": str | None,
}, total=False)
open_to_other_keys(Builder)


@open_to_other_keys
class AttnGroup(TypedDict, total=False):
    """One attention group of the model runner and its first metadata builder: what `builders:` checks."""

    group: int
    subgroup: int
    backend: str | None
    backend_module: str | None
    layer_names: list[str]
    builder: Builder | None


# --- what the cell process and the runner observed ---------------------------------------------------------


@open_to_other_keys
class ExceptionInfo(TypedDict, total=False):
    """The exception a phase of the cell process raised (harness/cell/main.py describe)."""

    type: str
    message: str
    traceback_tail: str


@open_to_other_keys
class Timings(TypedDict, total=False):
    """Seconds per phase of the cell process, and the whole cell as the runner timed it."""

    import_s: float
    init_s: float
    probe_s: float
    generate_s: float
    references_s: float  # an oracle's plain generation of its cells' workload prompts
    forced_s: float  # the teacher-forced decodes: a compared cell's of its oracle's and its reference's tokens, a floor
    accuracy_s: float
    teardown_s: float  # a warm worker's engine teardown after the cell
    total_s: float
    # CPU seconds the cell's process and the compilers it waited for (nvcc, ptxas) used: against total_s, whether
    # a cold cell waited on the CPU (JIT builds) or on something else.
    cpu_s: float
    # Parts of the engine's start (init_s) as vLLM's own log lines time them (harness/vllm_compat/phase_log.py);
    # a part the log does not show is absent, never zero. harness/record/phases.py breaks a cell down with them.
    model_load_s: float  # the model's construction and weights (`Model loading took`)
    weights_s: float  # of which reading the weights (`Loading weights took`, target and draft)
    engine_core_s: float  # profile run, torch.compile, KV-cache allocation, warm-up and graph capture
    compile_s: float  # torch.compile in all (`torch.compile took`, every compiled module; on a CPU its warm-up)
    dynamo_s: float  # of which Dynamo's bytecode transform
    inductor_s: float  # of which Inductor compiling graphs (absent: every graph came from the compile cache)
    jit_warmup_s: float  # vLLM's kernel warm-up (Triton JIT)
    graph_capture_s: float  # CUDA-graph capture (whole seconds, as vLLM prints it)
    flashinfer_jit_s: float  # FlashInfer's JIT module builds (nvcc), wherever in the cell they happened


@open_to_other_keys
class Emulation(TypedDict, total=False):
    """What the cell patched to take another class's decisions: a CUDA capability or a CPU level."""

    capability: list[int]
    patched_classes: list[str]
    cpu_isa: str
    patched_probes: list[str]


@open_to_other_keys
class AccuracyResult(TypedDict, total=False):
    """lm-eval's score of the cell's engine, per sample in doc order (harness/cell/lm_eval_engine.py)."""

    task: str
    metric: str
    score: float
    n: int
    doc_ids: list[int]
    samples: list[float]
    tokens: list[list[int]]


@open_to_other_keys
class Crash(TypedDict, total=False):
    """The parts a crash fingerprint hashes (harness/judge/fingerprint.py Crash)."""

    type: str
    message: str
    site: str | None
    phase: str | None


@open_to_other_keys
class GpuMemoryCheck(TypedDict, total=False):
    """The cell's GPU after it ended, against the run's baseline (harness/run/process/gpu_check.py)."""

    gpu_index: int
    baseline_mib: float
    after_mib: float
    leaked_mib: float
    leaked_pids: dict[str, float]
    exclusive: bool
    waited_s: float


@open_to_other_keys
class WorkerInfo(TypedDict, total=False):
    """The warm worker that ran the cell (harness/run/process/launch.py): its pid, how many cells it ran before this
    one, the engine's teardown, what torch still reserved after it, and why the worker retired after the cell."""

    pid: int
    cells_before: int
    teardown_s: float | None
    gpu_memory_left_mib: float | None
    retired: str


@open_to_other_keys
class WarmAttempt(TypedDict, total=False):
    """What a warm worker's run of the cell gave before a fresh process ran it again (harness/run/task/runner.py)."""

    status: Status | None
    verdict: Verdict | None
    signature: str | None
    signal: str | None
    error_tail: str | None
    reason: str | None
    worker: WorkerInfo | None
    timings: Timings | None


@open_to_other_keys
class Runtime(TypedDict, total=False):
    """What the engine resolved for the execution mode and the runtime paths (vllm_compat RUNTIME_CONFIG_PATHS)."""

    enforce_eager: bool | None
    compilation_mode: str | None
    cudagraph_mode: str | None
    enable_prefix_caching: bool | None
    enable_chunked_prefill: bool | None
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    max_model_len: int | None
    num_blocks: int | None


@open_to_other_keys
class WorkloadRun(TypedDict, total=False):
    """A workload cell's generation (harness/cell/workloads.py): its prompts, and whether it took its path."""

    name: str
    block_size: int | None
    prompt_tokens: list[int]
    cached_tokens: list[int | None]
    preemptions: int | None
    reached: bool
    detail: str


@open_to_other_keys
class Reference(TypedDict, total=False):
    """A workload's prompts generated plainly by an oracle cell, for the cells compared with it."""

    tokens: list[list[int]]
    texts: list[str]
    logprobs: list[list[dict[str, float]]]
    cached_tokens: list[int | None]
    block_size: int
    missing: str


@open_to_other_keys
class ForcedRun(TypedDict, total=False):
    """A teacher-forced decode (harness/cell/forced.py): the engine's own decode path made to emit given tokens one
    step at a time, with per position the raw logprobs vLLM computed before the forcing (harness/vllm_compat/
    forced_decode.py). A compared cell decodes its oracle's greedy tokens, and its model reference's; an oracle
    (or a reference) decodes its own again in another batch (its noise floor)."""

    of: str  # whose tokens: the oracle's cell id, or "itself" (a noise floor)
    batch: str  # how the forced requests were batched
    tokens: list[list[int]]  # what the engine emitted: the forced tokens
    logprobs: list[list[dict[str, float]]]
    missing: str  # why no forced decode ran (vLLM takes no logits processor here, no oracle tokens)
    decoded_as: str  # the record field whose decode this one is (the model reference is the cell's oracle)
