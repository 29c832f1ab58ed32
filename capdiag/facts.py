"""Typed, immutable observations read from the inputs.

Every fact carries its Evidence (line number, raw text, launch) and the rank tags of the
process that printed it: the end of every evidence chain an auditor walks. Memory figures
are in GiB exactly as printed (SGLang's "GB" is bytes / 2**30); the `_gib` suffix says so.
"""
from __future__ import annotations

from typing import Any, Optional

import attrs


@attrs.frozen
class Evidence:
    line: int
    text: str
    launch: int = 1


@attrs.frozen(order=True)
class Rank:
    """Rank tags from the line prefix; None where the prefix does not carry that tag."""

    tp: Optional[int] = None
    dp: Optional[int] = None
    pp: Optional[int] = None
    ep: Optional[int] = None
    attn_cp: Optional[int] = None
    moe_dp: Optional[int] = None

    @property
    def tagged(self) -> bool:
        return any(v is not None for v in attrs.astuple(self))

    @property
    def tp_index(self) -> int:
        """Lines with no TP tag belong to TP 0 (single GPU, or a main-process line)."""
        return self.tp if self.tp is not None else 0

    @property
    def label(self) -> str:
        parts = [f"{name.upper()}{value}" for name, value in
                 (("dp", self.dp), ("pp", self.pp), ("attn_cp", self.attn_cp),
                  ("moe_dp", self.moe_dp), ("tp", self.tp), ("ep", self.ep)) if value is not None]
        return " ".join(parts) or "untagged (TP0)"

    def key(self) -> tuple:
        """Sort/identity key that treats an untagged line as TP0."""
        return (self.dp or 0, self.pp or 0, self.tp_index)


NO_RANK = Rank()


@attrs.frozen(kw_only=True)
class Fact:
    """Base of every observation. `role` is `target` or `draft` (speculative decoding)."""

    evidence: Evidence
    rank: Rank = NO_RANK
    role: str = "target"
    role_stated: bool = False  # the line itself says target/draft (v0.5.14+ graph lines)

    @property
    def kind(self) -> str:
        return type(self).__name__


# ---- main-process lines -----------------------------------------------------------------

@attrs.frozen(kw_only=True)
class ServerArgs(Fact):
    """`server_args=ServerArgs(...)` or `server_args={...}`: the resolved configuration."""

    fields: dict[str, Any]
    style: str  # "repr" or "dict"
    truncated_at: Optional[int] = None  # character offset where a damaged line stops
    elided: bool = False  # the line holds `...` in place of fields


@attrs.frozen(kw_only=True)
class LaunchCommand(Fact):
    """`python -m sglang.launch_server --model-path … --tp 8` as pasted into the log."""

    program: str
    args: dict[str, Optional[str]]  # option name with dashes as underscores -> value


@attrs.frozen(kw_only=True)
class ModelPathHint(Fact):
    """A model path named outside server_args (HF snapshot or tokenizer lines)."""

    path: str
    source: str


@attrs.frozen(kw_only=True)
class ServerReady(Fact):
    pass


# ---- scheduler (per-rank) lines ----------------------------------------------------------

@attrs.frozen(kw_only=True)
class TorchDistributedBegin(Fact):
    pass


@attrs.frozen(kw_only=True)
class TorchDistributedEnd(Fact):
    mem_usage_gib: Optional[float] = None
    elapsed_s: Optional[float] = None


@attrs.frozen(kw_only=True)
class LoadWeightBegin(Fact):
    avail_gib: float


@attrs.frozen(kw_only=True)
class LoadWeightEnd(Fact):
    avail_gib: Optional[float] = None
    mem_usage_gib: Optional[float] = None
    model_class: Optional[str] = None
    dtype: Optional[str] = None
    quant: Optional[str] = None
    elapsed_s: Optional[float] = None


@attrs.frozen(kw_only=True)
class WeightsCommitted(Fact):
    """`--startup-weight-load-mode overlap`: the end line with no memory fields."""


@attrs.frozen(kw_only=True)
class KVCacheAllocated(Fact):
    label: Optional[str] = None  # "Full", "SWA" (v0.5.17+) or None
    dtype: Optional[str] = None
    tokens: Optional[int] = None
    k_gib: Optional[float] = None
    v_gib: Optional[float] = None
    kv_gib: Optional[float] = None
    va_upper_bound: bool = False  # a reserved address range, not an allocation

    @property
    def total_gib(self) -> Optional[float]:
        if self.kv_gib is not None:
            return self.kv_gib
        if self.k_gib is not None and self.v_gib is not None:
            return round(self.k_gib + self.v_gib, 2)
        return None


@attrs.frozen(kw_only=True)
class SWAKVPoolUsage(Fact):
    """Sum of the Full and SWA sub-pools: never add it to them."""

    gib: Optional[float] = None
    swa_size: Optional[int] = None
    full_size: Optional[int] = None
    va_upper_bound: bool = False


@attrs.frozen(kw_only=True)
class MambaCacheAllocated(Fact):
    max_cache_size: Optional[int] = None
    conv_gib: Optional[float] = None
    ssm_gib: Optional[float] = None
    intermediate_ssm_gib: Optional[float] = None
    intermediate_conv_gib: Optional[float] = None

    @property
    def total_gib(self) -> Optional[float]:
        parts = [self.conv_gib, self.ssm_gib, self.intermediate_ssm_gib, self.intermediate_conv_gib]
        if self.conv_gib is None or self.ssm_gib is None:
            return None
        return round(sum(p for p in parts if p is not None), 2)


@attrs.frozen(kw_only=True)
class MemoryPoolEnd(Fact):
    avail_gib: float


@attrs.frozen(kw_only=True)
class GraphCaptureBegin(Fact):
    graph: str  # "decode", "verify", "prefill", "extend", "piecewise"
    device: str
    avail_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class GraphCaptureEnd(Fact):
    graph: str
    device: str
    elapsed_s: Optional[float] = None
    mem_usage_gib: Optional[float] = None
    avail_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class TokenBudget(Fact):
    """`max_total_num_tokens=…, max_running_requests=…, context_len=…, available_gpu_mem=…`."""

    max_total_num_tokens: int
    chunked_prefill_size: Optional[int] = None
    max_prefill_tokens: Optional[int] = None
    max_running_requests: Optional[int] = None
    context_len: Optional[int] = None
    available_gpu_mem_gib: Optional[float] = None
    available_cpu_mem_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class MemoryProfiling(Fact):
    """DeepSeek-V4 day-0 branch: `total_gpu_memory` is free memory before weights, not HBM."""

    available_gpu_memory_gib: Optional[float] = None
    total_gpu_memory_gib: Optional[float] = None
    mem_fraction_static: Optional[float] = None
    rest_memory_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class DSV4MemoryCalculation(Fact):
    bytes_per_full_token: Optional[float] = None
    available_bytes_gib: Optional[float] = None
    full_token: Optional[int] = None
    fixed_gib: dict[str, float] = attrs.Factory(dict)  # c128_state_fixed, swa_fixed, …


@attrs.frozen(kw_only=True)
class PostCaptureKVSizing(Fact):
    """The final KV bytes actually backed when post-capture sizing is on (v0.5.17+)."""

    dtype: Optional[str] = None
    tokens: Optional[int] = None
    kv_gib: Optional[float] = None
    avail_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class KVCacheDtype(Fact):
    dtype: str


@attrs.frozen(kw_only=True)
class SlidingWindowSplit(Fact):
    full_layer_tokens: Optional[int] = None
    swa_layer_tokens: Optional[int] = None


@attrs.frozen(kw_only=True)
class OutOfMemory(Fact):
    """PyTorch's CUDA out-of-memory message; `gpu` is the device index it names."""

    gpu: Optional[int] = None
    tried_to_allocate_mib: Optional[float] = None
    total_capacity_gib: Optional[float] = None
    free_mib: Optional[float] = None
    process_in_use_gib: Optional[float] = None
    allocated_by_pytorch_gib: Optional[float] = None
    reserved_unallocated_mib: Optional[float] = None


@attrs.frozen(kw_only=True)
class NotEnoughMemory(Fact):
    """SGLang's start-up refusal: the KV pool cannot be sized under mem_fraction_static."""


@attrs.frozen(kw_only=True)
class SchedulerException(Fact):
    pass


@attrs.frozen(kw_only=True)
class DeepGEMMActivity(Fact):
    required_gib: Optional[float] = None
    available_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class DeviceName(Fact):
    """The GPU name torch reports, as embedded in a MoE kernel-config file name."""

    name: str


# The phase a fact shows the start-up has reached, in start-up order.
PHASES = ("init", "weights", "kv_pool", "graph_capture", "ready")

PHASE_OF: dict[type, str] = {
    TorchDistributedBegin: "init",
    TorchDistributedEnd: "init",
    LoadWeightBegin: "weights",
    LoadWeightEnd: "weights",
    WeightsCommitted: "graph_capture",
    KVCacheAllocated: "kv_pool",
    SWAKVPoolUsage: "kv_pool",
    MambaCacheAllocated: "kv_pool",
    MemoryProfiling: "kv_pool",
    DSV4MemoryCalculation: "kv_pool",
    MemoryPoolEnd: "kv_pool",
    GraphCaptureBegin: "graph_capture",
    GraphCaptureEnd: "graph_capture",
    PostCaptureKVSizing: "graph_capture",
    TokenBudget: "graph_capture",
    ServerReady: "ready",
}


# ---- inputs other than the log -------------------------------------------------------------

INPUT_LINE = 0  # Evidence.line of a fact that came from the command line or a reference file


@attrs.frozen(kw_only=True)
class GpuTotal(Fact):
    """The GPU's total memory, given on the command line or looked up in the references."""

    gib: float
    source: str
    alias: Optional[str] = None
    name: Optional[str] = None


@attrs.frozen(kw_only=True)
class Options(Fact):
    """What the user asked for: the target rank and the request lengths to size for."""

    target_rank: int = 0
    token_lengths: tuple[int, ...] = (4096, 6144, 8192)
