"""SGLang line kinds: one small frozen class per kind of memory line SGLang prints.

The order of the classes is the order a rank's `observed` keys are listed in the report, and
where two kinds fill one key the earlier is preferred (Fact.OBSERVED).
"""
from __future__ import annotations

from typing import Any, ClassVar, Optional

import attrs

from capdiag.facts.base import Fact, frozen_fact


@frozen_fact
class SGLangFact(Fact):
    """A line kind only SGLang prints."""

    FRAMEWORK: ClassVar[Optional[str]] = "sglang"


# ---- main-process lines -----------------------------------------------------------------

@frozen_fact
class ServerArgs(SGLangFact):
    """`server_args=ServerArgs(...)` or `server_args={...}`: the resolved configuration."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("server_args",)
    RANK_NEUTRAL: ClassVar[bool] = True
    OPENS_LAUNCH: ClassVar[bool] = True
    fields: dict[str, Any]
    style: str  # "repr" or "dict"
    truncated_at: Optional[int] = None  # character offset where a damaged line stops
    elided: bool = False  # the line holds `...` in place of fields


@frozen_fact
class ModelPathHint(SGLangFact):
    """A model path named outside server_args (HF snapshot or tokenizer lines)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("HF snapshot", "Tokenizer for")
    RANK_NEUTRAL: ClassVar[bool] = True
    path: str
    source: str


# ---- scheduler (per-rank) lines ----------------------------------------------------------

@frozen_fact
class LoadWeightBegin(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("Load weight",)
    BEGINS_RANK: ClassVar[bool] = True
    PHASE: ClassVar[str] = "weights"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("avail_gib", "load_weight_begin_avail_gib"),)
    DRAFT_BY: ClassVar[Optional[str]] = "order"
    avail_gib: float


@frozen_fact
class LoadWeightEnd(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("Load weight",)
    PHASE: ClassVar[str] = "weights"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("avail_gib", "load_weight_end_avail_gib"),
        ("mem_usage_gib", "weight_mem_usage_gib"))
    DRAFT_BY: ClassVar[Optional[str]] = "order"
    avail_gib: Optional[float] = None
    mem_usage_gib: Optional[float] = None
    model_class: Optional[str] = None
    dtype: Optional[str] = None
    quant: Optional[str] = None
    elapsed_s: Optional[float] = None


@frozen_fact
class TorchDistributedBegin(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("distributed begin",)
    BEGINS_RANK: ClassVar[bool] = True
    PHASE: ClassVar[str] = "init"


@frozen_fact
class TorchDistributedEnd(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("distributed ends",)
    PHASE: ClassVar[str] = "init"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("mem_usage_gib", "torch_distributed_mem_usage_gib"),)
    DRAFT_BY: ClassVar[Optional[str]] = "order"
    mem_usage_gib: Optional[float] = None
    elapsed_s: Optional[float] = None


@frozen_fact
class WeightsCommitted(SGLangFact):
    """`--startup-weight-load-mode overlap`: the end line with no memory fields."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Load weight",)
    PHASE: ClassVar[str] = "graph_capture"


@frozen_fact
class KVCacheAllocated(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("KV Cache is allocated", "KV Cache VA upper bound")
    PHASE: ClassVar[str] = "kv_pool"
    DRAFT_BY: ClassVar[Optional[str]] = "pool"
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


@frozen_fact
class MemoryPoolEnd(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("Memory pool end",)
    PHASE: ClassVar[str] = "kv_pool"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("avail_gib", "memory_pool_end_avail_gib"),)
    DRAFT_BY: ClassVar[Optional[str]] = "order"
    avail_gib: float


@frozen_fact
class MambaCacheAllocated(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("Mamba Cache",)
    PHASE: ClassVar[str] = "kv_pool"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("max_cache_size", "mamba_max_cache_size"),
        ("conv_gib", "mamba_conv_state_gib"),
        ("ssm_gib", "mamba_ssm_state_gib"))
    DRAFT_BY: ClassVar[Optional[str]] = "pool"
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


@frozen_fact
class GraphCaptureBegin(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("graph begin",)
    PHASE: ClassVar[str] = "graph_capture"
    graph: str  # "decode", "verify", "prefill", "extend", "piecewise"
    device: str
    avail_gib: Optional[float] = None


@frozen_fact
class GraphCaptureEnd(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("graph end",)
    PHASE: ClassVar[str] = "graph_capture"
    graph: str
    device: str
    elapsed_s: Optional[float] = None
    mem_usage_gib: Optional[float] = None
    avail_gib: Optional[float] = None


@frozen_fact
class MemoryProfiling(SGLangFact):
    """DeepSeek-V4 day-0 branch: `total_gpu_memory` is free memory before weights, not HBM."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Memory profiling",)
    PHASE: ClassVar[str] = "kv_pool"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("available_gpu_memory_gib", "memory_profiling_available_gpu_memory_gib"),
        ("total_gpu_memory_gib", "memory_profiling_total_gpu_memory_gib"),
        ("rest_memory_gib", "memory_profiling_rest_memory_gib"))

    available_gpu_memory_gib: Optional[float] = None
    total_gpu_memory_gib: Optional[float] = None
    mem_fraction_static: Optional[float] = None
    rest_memory_gib: Optional[float] = None


@frozen_fact
class DSV4MemoryCalculation(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("memory calculation",)
    PHASE: ClassVar[str] = "kv_pool"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("available_bytes_gib", "dsv4_available_bytes_gib"),
        ("full_token", "dsv4_full_token"),
        ("bytes_per_full_token", "dsv4_bytes_per_full_token"))
    bytes_per_full_token: Optional[float] = None
    available_bytes_gib: Optional[float] = None
    full_token: Optional[int] = None
    fixed_gib: dict[str, float] = attrs.Factory(dict)  # c128_state_fixed, swa_fixed, …


@frozen_fact
class DSV4PoolSizes(SGLangFact):
    """The token counts DeepSeek-V4's pools are built with. A rank prints it once as sized from
    the memory calculation, and again when a limit cut the pools (`max_running_requests` ×
    the context, the SWA request cap): the last line before the rank's `Memory pool end` is what
    was allocated."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("pool sizes",)
    full: Optional[int] = None
    swa: Optional[int] = None
    c4: Optional[int] = None
    c128: Optional[int] = None


@frozen_fact
class SWAKVPoolUsage(SGLangFact):
    """Sum of the Full and SWA sub-pools: never add it to them."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("SWAKVPool",)
    PHASE: ClassVar[str] = "kv_pool"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("gib", "swa_kv_pool_mem_usage_gib"),
        ("full_size", "swa_kv_pool_full_size"),
        ("swa_size", "swa_kv_pool_swa_size"))
    DRAFT_BY: ClassVar[Optional[str]] = "pool"

    gib: Optional[float] = None
    swa_size: Optional[int] = None
    full_size: Optional[int] = None
    va_upper_bound: bool = False


@frozen_fact
class PostCaptureKVSizing(SGLangFact):
    """The final KV bytes actually backed when post-capture sizing is on (v0.5.17+)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Post-capture KV sizing",)
    PHASE: ClassVar[str] = "graph_capture"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("kv_gib", "post_capture_kv_size_gib"),
        ("tokens", "post_capture_kv_tokens"))

    dtype: Optional[str] = None
    tokens: Optional[int] = None
    kv_gib: Optional[float] = None
    avail_gib: Optional[float] = None


@frozen_fact
class KVCacheDtype(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("KV cache dtype",)
    dtype: str


@frozen_fact
class KVAvailableMemory(SGLangFact):
    """`The available memory for KV cache is X GB.` (Ascend builds): what the pool is sized
    from on this rank; negative when the weights left nothing."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("available memory for KV cache",)
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("gib", "kv_available_memory_gib"),)
    DRAFT_BY: ClassVar[Optional[str]] = "pool"
    gib: float


@frozen_fact
class TokenBudget(SGLangFact):
    """`max_total_num_tokens=…, max_running_requests=…, context_len=…, available_gpu_mem=…`."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("max_total_num_tokens",)
    PHASE: ClassVar[str] = "graph_capture"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("max_total_num_tokens", "max_total_num_tokens"),
        ("max_running_requests", "max_running_requests"),
        ("context_len", "context_len"),
        ("chunked_prefill_size", "chunked_prefill_size"),
        ("available_gpu_mem_gib", "available_gpu_mem_gib"),
        ("available_cpu_mem_gib", "available_cpu_mem_gib"))

    max_total_num_tokens: int
    chunked_prefill_size: Optional[int] = None
    max_prefill_tokens: Optional[int] = None
    max_running_requests: Optional[int] = None
    context_len: Optional[int] = None
    available_gpu_mem_gib: Optional[float] = None
    available_cpu_mem_gib: Optional[float] = None


@frozen_fact
class SlidingWindowSplit(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("sliding window memory pool",)
    full_layer_tokens: Optional[int] = None
    swa_layer_tokens: Optional[int] = None


@frozen_fact
class NotEnoughMemory(SGLangFact):
    """SGLang's start-up refusal: the KV pool cannot be sized under mem_fraction_static."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Not enough memory", "leave no GPU memory")
    FAILS_STARTUP: ClassVar[bool] = True
    mem_fraction_static: Optional[float] = None  # `Current value: mem_fraction_static=…` (2025-09+)

@frozen_fact
class FrameworkSolution(SGLangFact):
    """One line of the `Possible solutions:` list SGLang appends to an error it wraps (graph
    capture), or its head (`text` None): the framework's own advice, shown as the framework's."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Possible solutions:", "to a smaller value (e.g.",
                                           "by not using --enable-torch-compile", "by --disable-cuda-graph")
    text: Optional[str] = None


@frozen_fact
class SchedulerException(SGLangFact):
    """`Scheduler hit an exception`: a scheduler process died during start-up."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("hit an exception",)
    FAILS_STARTUP: ClassVar[bool] = True

@frozen_fact
class DeepGEMMActivity(SGLangFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("DeepGEMM", "Required memory for warmup")
    required_gib: Optional[float] = None
    available_gib: Optional[float] = None


@frozen_fact
class KernelCacheNote(SGLangFact):
    """v0.5.18+: `Compiled-kernel caches now live under SGLANG_CACHE_DIR (…)` — legacy cache
    directories exist, so this node's caches were built by an older release."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("SGLANG_CACHE_DIR",)


@frozen_fact
class DeviceCapacity(SGLangFact):
    """Where nvidia-smi reports no capacity (a GB10 shows N/A), SGLang falls back to torch and says
    what it read: `Reported total GPU memory per device (MiB): [124546], using min: 124546 MiB.`
    (mem_get_info's total // 2^20 per device, then the least): the GPU total the log states."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Reported total GPU memory per device",)
    RANK_NEUTRAL: ClassVar[bool] = True  # the main process prints it while sizing its defaults
    per_device_mib: tuple[int, ...]
    total_mib: int


@frozen_fact
class ChildFailed(SGLangFact):
    """A parent noticing that a child died: SGLang's `Received sigquit from a child process. It
    usually means the child failed.` — always a consequence. Only SGLang prints it (its launcher's
    SIGQUIT handler; read by the traceback grammar), so a pasted tail that holds nothing else of
    SGLang is SGLang's by it."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("sigquit",)  # both wordings, as the prefilter ignores case
    process: Optional[str] = None
