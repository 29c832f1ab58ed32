"""vLLM line kinds: one small frozen class per kind of memory line vLLM prints.

Figures are in GiB as printed (old releases print "GB" for a value computed in GiB; the
`unit` field keeps what was printed). A process label such as `VllmWorkerProcess pid=7`
stands in for the rank where the line does not give its index.
"""
from __future__ import annotations

from typing import Any, ClassVar, Optional

import attrs

from capdiag.facts.base import Fact


@attrs.frozen(kw_only=True)
class VllmVersion(Fact):
    version: str


@attrs.frozen(kw_only=True)
class VllmEngineConfig(Fact):
    """`Initializing a V1 LLM engine (v0.x.y) with config: model=…, …` (V0: `an LLM engine`)."""

    version: str
    engine: Optional[str]  # "V0", "V1" or None (older wording names neither)
    fields: dict[str, Any]
    truncated_at: Optional[int] = None


@attrs.frozen(kw_only=True)
class VllmArgs(Fact):
    """`non-default args: {…}` (0.9+) or `args: Namespace(…)` (≤0.8): the user's settings."""

    fields: dict[str, Any]
    style: str  # "non-default" or "namespace"
    truncated_at: Optional[int] = None


@attrs.frozen(kw_only=True)
class VllmMaxModelLen(Fact):
    tokens: int


@attrs.frozen(kw_only=True)
class VllmModelName(Fact):
    """A model named outside the configuration records: `Starting to load model X...` (the
    model runner of every backend, V0 and V1)."""

    name: str
    source: str


@attrs.frozen(kw_only=True)
class VllmModelLoading(Fact):
    """`Model loading took X GiB …` / `Loading model weights took X GB`: torch memory of the
    weights on this rank."""

    PHASE: ClassVar[str] = "weights"
    gib: float
    unit: Optional[str] = None
    seconds: Optional[float] = None


@attrs.frozen(kw_only=True)
class VllmMemoryProfile(Fact):
    """A memory-profiling statement (V0 three-line record, its table form, 0.6.4's one line).

    `values` holds what this line states, under: total_gpu_memory_gib, gpu_memory_utilization,
    usable_gib, weights_gib, non_torch_gib, activation_peak_gib, kv_cache_gib, seconds.
    """

    PHASE: ClassVar[str] = "kv_pool"
    values: dict[str, float]
    form: str


@attrs.frozen(kw_only=True)
class VllmAvailableKV(Fact):
    PHASE: ClassVar[str] = "kv_pool"
    gib: float


@attrs.frozen(kw_only=True)
class VllmKVCacheSize(Fact):
    """`GPU KV cache size: N tokens` (from 0.21 derived from the concurrency for hybrid models)."""

    PHASE: ClassVar[str] = "kv_pool"
    tokens: int
    device: str


@attrs.frozen(kw_only=True)
class VllmMaxConcurrency(Fact):
    PHASE: ClassVar[str] = "kv_pool"
    tokens: int
    x: float


@attrs.frozen(kw_only=True)
class VllmGpuBlocks(Fact):
    PHASE: ClassVar[str] = "kv_pool"
    blocks: int
    cpu_blocks: Optional[int] = None
    wording: str = "# GPU blocks"


@attrs.frozen(kw_only=True)
class VllmGraphCapture(Fact):
    """`Graph capturing finished in S secs, took X GiB` (a difference of free memory: can be < 0)."""

    PHASE: ClassVar[str] = "graph_capture"
    seconds: Optional[float] = None
    gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class VllmGraphPool(Fact):
    PHASE: ClassVar[str] = "graph_capture"
    actual_gib: float
    estimated_gib: float
    difference_gib: Optional[float] = None
    percent: Optional[float] = None


@attrs.frozen(kw_only=True)
class VllmGraphEstimate(Fact):
    PHASE: ClassVar[str] = "kv_pool"
    gib: float


@attrs.frozen(kw_only=True)
class VllmUtilizationAdvice(Fact):
    """0.20+: `The current --gpu-memory-utilization=U is equivalent to … E … increase … to S`."""

    current: Optional[float] = None
    equivalent: Optional[float] = None
    suggested: Optional[float] = None


@attrs.frozen(kw_only=True)
class VllmStartupMemory(Fact):
    """`Free memory on device [cuda:N] (F/T GiB) on startup. …` — the success report after capture,
    or the start-up error when free memory is below what the utilization asks for (`error`):
    `… is less than desired GPU memory utilization (U, R GiB)`, R = total × U (0.9.1–0.13 rounds
    it to 2 decimals, 0.14+ rounds the bytes up)."""

    free_gib: Optional[float] = None
    total_gib: Optional[float] = None
    utilization: Optional[float] = None
    requested_gib: Optional[float] = None
    device: Optional[str] = None  # 0.14+ names it: `cuda:1`
    weights_gib: Optional[float] = None
    consumed_gib: Optional[float] = None
    activation_gib: Optional[float] = None
    non_torch_gib: Optional[float] = None
    cudagraph_gib: Optional[float] = None
    kv_in_use_gib: Optional[float] = None
    error: bool = False


@attrs.frozen(kw_only=True)
class VllmInitialFree(Fact):
    """`Initial free memory …; Requested memory …` (DEBUG) or the `--kv-cache-memory` reservation
    `Initial free memory X GiB, reserved Y GiB memory for KV Cache …`."""

    free_gib: Optional[float] = None
    requested_gib: Optional[float] = None
    utilization: Optional[float] = None
    reserved_kv_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class VllmCpuKVSpace(Fact):
    """The CPU backend's KV cache space on a NUMA node: `Explicitly set (K/N) GiB for KV cache on
    node 0.` (VLLM_CPU_KVCACHE_SPACE) or `Auto set (K/N) GiB for KV cache on node 0, with R GiB
    requested memory for the worker. U GiB memory was consumed by non-kv usages.` — K the KV
    space, N the node's memory, R what the worker may use, U what the rest took."""

    kv_gib: float
    node_total_gib: Optional[float] = None
    node: Optional[int] = None
    mode: str = "explicit"  # or "auto"
    requested_gib: Optional[float] = None
    non_kv_gib: Optional[float] = None


@attrs.frozen(kw_only=True)
class VllmStartupError(Fact):
    """A start-up error vLLM states: no memory for cache blocks, max seq len beyond the KV
    cache, the engine core failing to start."""

    reason: str  # "no-cache-memory", "max-seq-len", "engine-failed"
    model_len: Optional[int] = None
    kv_tokens: Optional[int] = None


@attrs.frozen(kw_only=True)
class VllmEngineReady(Fact):
    """`init engine (profile, create kv cache, warmup model) took S seconds`: the engine is up."""

    PHASE: ClassVar[str] = "ready"


@attrs.frozen(kw_only=True)
class VllmRankAssignment(Fact):
    """`rank R in world size W is assigned as DP rank a, PP rank b, TP rank c, EP rank d` (0.8+,
    parallel_state.py): which ranks the process that printed it holds. A Ray or multiprocessing
    worker whose prefix names no rank is placed by this line (capdiag.parsing.worker_ranks)."""

    global_rank: int
    world_size: int
    dp: Optional[int] = None
    pp: Optional[int] = None
    tp: Optional[int] = None
    ep: Optional[int] = None


@attrs.frozen(kw_only=True)
class VllmHybridBlockSize(Fact):
    """`Setting attention block size to N tokens to ensure that attention page size is >= mamba
    page size`: the model is hybrid (attention + Mamba/linear layers)."""

    block_size: int
