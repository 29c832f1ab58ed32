"""SGLang line kinds: one small frozen class per kind of memory line SGLang prints."""
from __future__ import annotations

from typing import Any, ClassVar, Optional

import attrs

from capdiag.facts.base import Fact


# ---- main-process lines -----------------------------------------------------------------

@attrs.frozen(kw_only=True)
class ServerArgs(Fact):
    """`server_args=ServerArgs(...)` or `server_args={...}`: the resolved configuration."""

    fields: dict[str, Any]
    style: str  # "repr" or "dict"
    truncated_at: Optional[int] = None  # character offset where a damaged line stops
    elided: bool = False  # the line holds `...` in place of fields


@attrs.frozen(kw_only=True)
class ModelPathHint(Fact):
    """A model path named outside server_args (HF snapshot or tokenizer lines)."""

    path: str
    source: str


# ---- scheduler (per-rank) lines ----------------------------------------------------------

@attrs.frozen(kw_only=True)
class TorchDistributedBegin(Fact):
    PHASE: ClassVar[str] = "init"


@attrs.frozen(kw_only=True)
class TorchDistributedEnd(Fact):
    PHASE: ClassVar[str] = "init"
    mem_usage_gib: Optional[float] = None
    elapsed_s: Optional[float] = None


@attrs.frozen(kw_only=True)
class LoadWeightBegin(Fact):
    PHASE: ClassVar[str] = "weights"
    avail_gib: float


@attrs.frozen(kw_only=True)
class LoadWeightEnd(Fact):
    PHASE: ClassVar[str] = "weights"
    avail_gib: Optional[float] = None
    mem_usage_gib: Optional[float] = None
    model_class: Optional[str] = None
    dtype: Optional[str] = None
    quant: Optional[str] = None
    elapsed_s: Optional[float] = None


@attrs.frozen(kw_only=True)
class WeightsCommitted(Fact):
    """`--startup-weight-load-mode overlap`: the end line with no memory fields."""

    PHASE: ClassVar[str] = "graph_capture"


@attrs.frozen(kw_only=True)
class KVCacheAllocated(Fact):
    PHASE: ClassVar[str] = "kv_pool"
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

    PHASE: ClassVar[str] = "kv_pool"

    gib: Optional[float] = None
    swa_size: Optional[int] = None
    full_size: Optional[int] = None
    va_upper_bound: bool = False


@attrs.frozen(kw_only=True)
class MambaCacheAllocated(Fact):
    PHASE: ClassVar[str] = "kv_pool"
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
    PHASE: ClassVar[str] = "kv_pool"
    avail_gib: float


@attrs.frozen(kw_only=True)
class GraphCaptureBegin(Fact):
    PHASE: ClassVar[str] = "graph_capture"
    graph: str  # "decode", "verify", "prefill", "extend", "piecewise"
    device: str
    avail_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class GraphCaptureEnd(Fact):
    PHASE: ClassVar[str] = "graph_capture"
    graph: str
    device: str
    elapsed_s: Optional[float] = None
    mem_usage_gib: Optional[float] = None
    avail_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class TokenBudget(Fact):
    """`max_total_num_tokens=…, max_running_requests=…, context_len=…, available_gpu_mem=…`."""

    PHASE: ClassVar[str] = "graph_capture"

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

    PHASE: ClassVar[str] = "kv_pool"

    available_gpu_memory_gib: Optional[float] = None
    total_gpu_memory_gib: Optional[float] = None
    mem_fraction_static: Optional[float] = None
    rest_memory_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class DSV4MemoryCalculation(Fact):
    PHASE: ClassVar[str] = "kv_pool"
    bytes_per_full_token: Optional[float] = None
    available_bytes_gib: Optional[float] = None
    full_token: Optional[int] = None
    fixed_gib: dict[str, float] = attrs.Factory(dict)  # c128_state_fixed, swa_fixed, …


@attrs.frozen(kw_only=True)
class PostCaptureKVSizing(Fact):
    """The final KV bytes actually backed when post-capture sizing is on (v0.5.17+)."""

    PHASE: ClassVar[str] = "graph_capture"

    dtype: Optional[str] = None
    tokens: Optional[int] = None
    kv_gib: Optional[float] = None
    avail_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class KVCacheDtype(Fact):
    dtype: str


@attrs.frozen(kw_only=True)
class KVAvailableMemory(Fact):
    """`The available memory for KV cache is X GB.` (Ascend builds): what the pool is sized
    from on this rank; negative when the weights left nothing."""

    gib: float


@attrs.frozen(kw_only=True)
class SlidingWindowSplit(Fact):
    full_layer_tokens: Optional[int] = None
    swa_layer_tokens: Optional[int] = None


@attrs.frozen(kw_only=True)
class NotEnoughMemory(Fact):
    """SGLang's start-up refusal: the KV pool cannot be sized under mem_fraction_static."""


@attrs.frozen(kw_only=True)
class SchedulerException(Fact):
    """`Scheduler hit an exception`: a scheduler process died during start-up."""


@attrs.frozen(kw_only=True)
class DeepGEMMActivity(Fact):
    required_gib: Optional[float] = None
    available_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class KernelCacheNote(Fact):
    """v0.5.18+: `Compiled-kernel caches now live under SGLANG_CACHE_DIR (…)` — legacy cache
    directories exist, so this node's caches were built by an older release."""
