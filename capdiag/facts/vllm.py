"""vLLM line kinds: one small frozen class per kind of memory line vLLM prints.

Figures are in GiB as printed (old releases print "GB" for a value computed in GiB; the
`unit` field keeps what was printed). A process label such as `VllmWorkerProcess pid=7`
stands in for the rank where the line does not give its index.

The order of the classes is the order a rank's `observed` keys are listed in the report, and
where two kinds fill one key the earlier is preferred (Fact.OBSERVED).
"""
from __future__ import annotations

from typing import Any, ClassVar, Optional

from capdiag.facts.base import Fact, frozen_fact


@frozen_fact
class VllmFact(Fact):
    """A line kind only vLLM prints."""

    FRAMEWORK: ClassVar[Optional[str]] = "vllm"


@frozen_fact
class VllmVersion(VllmFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("version",)
    RANK_NEUTRAL: ClassVar[bool] = True
    OPENS_LAUNCH: ClassVar[bool] = True
    version: str


@frozen_fact
class VllmEngineConfig(VllmFact):
    """`Initializing a V1 LLM engine (v0.x.y) with config: model=…, …` (V0: `an LLM engine`)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("with config:",)
    RANK_NEUTRAL: ClassVar[bool] = True
    OPENS_LAUNCH: ClassVar[bool] = True
    version: str
    engine: Optional[str]  # "V0", "V1" or None (older wording names neither)
    fields: dict[str, Any]
    truncated_at: Optional[int] = None


@frozen_fact
class VllmArgs(VllmFact):
    """`non-default args: {…}` (0.9+) or `args: Namespace(…)` (≤0.8): the user's settings."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("non-default args", "args: Namespace")
    RANK_NEUTRAL: ClassVar[bool] = True
    OPENS_LAUNCH: ClassVar[bool] = True
    fields: dict[str, Any]
    style: str  # "non-default" or "namespace"
    truncated_at: Optional[int] = None


@frozen_fact
class VllmMaxModelLen(VllmFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("max model len",)
    RANK_NEUTRAL: ClassVar[bool] = True
    tokens: int


@frozen_fact
class VllmModelName(VllmFact):
    """A model named outside the configuration records: `Starting to load model X...` (the
    model runner of every backend, V0 and V1)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Starting to load model",)
    name: str
    source: str


@frozen_fact
class VllmModelLoading(VllmFact):
    """`Model loading took X GiB …` / `Loading model weights took X GB`: torch memory of the
    weights on this rank."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Model loading took", "Loading model weights took")
    BEGINS_RANK: ClassVar[bool] = True
    PHASE: ClassVar[str] = "weights"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("gib", "model_loading_gib"),)
    gib: float
    unit: Optional[str] = None
    seconds: Optional[float] = None


@frozen_fact
class VllmAvailableKV(VllmFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("Available KV cache memory",)
    PHASE: ClassVar[str] = "kv_pool"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("gib", "available_kv_cache_gib"),)
    gib: float


@frozen_fact
class VllmMemoryProfile(VllmFact):
    """A memory-profiling statement (V0 three-line record, its table form, 0.6.4's one line).

    `values` holds what this line states, under: total_gpu_memory_gib, gpu_memory_utilization,
    usable_gib, weights_gib, non_torch_gib, activation_peak_gib, kv_cache_gib, seconds.
    """

    KEYWORDS: ClassVar[tuple[str, ...]] = (
        "Memory profiling", "vLLM instance can use", "model weights take", "total_gpu_memory", "gpu_memory_utilization",
        "non_torch_memory", "activation peak memory", "available_kv_cache_memory",
        # other backends' memory lines (XPU, HPU, TPU)
        "Model profiling run took", "Initializing cache engine took", "init_cache_engine took", "Free device memory",
        "Memory statistics |")
    PHASE: ClassVar[str] = "kv_pool"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("values.weights_gib", "model_loading_gib"),
        ("values.kv_cache_gib", "available_kv_cache_gib"),
        ("values.total_gpu_memory_gib", "total_gpu_memory_gib"),
        ("values.gpu_memory_utilization", "gpu_memory_utilization_printed"),
        ("values.non_torch_gib", "non_torch_memory_gib"),
        ("values.activation_peak_gib", "activation_peak_gib"))
    values: dict[str, float]
    form: str


@frozen_fact
class VllmKVCacheSize(VllmFact):
    """`GPU KV cache size: N tokens` (from 0.21 derived from the concurrency for hybrid models)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("KV cache size",)
    PHASE: ClassVar[str] = "kv_pool"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("tokens", "kv_cache_tokens"),)
    tokens: int
    device: str


@frozen_fact
class VllmMaxConcurrency(VllmFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("Maximum concurrency",)
    PHASE: ClassVar[str] = "kv_pool"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("tokens", "max_concurrency_tokens"), ("x", "max_concurrency_x"))
    tokens: int
    x: float


@frozen_fact
class VllmGpuBlocks(VllmFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("blocks:", "num_gpu_blocks")
    PHASE: ClassVar[str] = "kv_pool"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("blocks", "gpu_blocks"),)
    blocks: int
    cpu_blocks: Optional[int] = None
    wording: str = "# GPU blocks"


@frozen_fact
class VllmGraphCapture(VllmFact):
    """`Graph capturing finished in S secs, took X GiB` (a difference of free memory: can be < 0)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Graph capturing finished",)
    PHASE: ClassVar[str] = "graph_capture"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("gib", "graph_capture_gib"),)
    seconds: Optional[float] = None
    gib: Optional[float] = None


@frozen_fact
class VllmStartupMemory(VllmFact):
    """`Free memory on device [cuda:N] (F/T GiB) on startup. …` — the success report after capture,
    or the start-up error when free memory is below what the utilization asks for (`error`):
    `… is less than desired GPU memory utilization (U, R GiB)`, R = total × U (0.9.1–0.13 rounds
    it to 2 decimals, 0.14+ rounds the bytes up)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Free memory on device",)
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("total_gib", "total_gpu_memory_gib"),
        ("free_gib", "free_memory_on_startup_gib"),
        ("activation_gib", "activation_peak_gib"),
        ("non_torch_gib", "non_torch_memory_gib"),
        ("consumed_gib", "consumed_memory_gib"),
        ("kv_in_use_gib", "kv_cache_in_use_gib"))
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


@frozen_fact
class VllmGraphPool(VllmFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("graph pool memory",)
    PHASE: ClassVar[str] = "graph_capture"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("actual_gib", "cuda_graph_pool_actual_gib"),
        ("estimated_gib", "cuda_graph_pool_estimated_gib"))
    actual_gib: float
    estimated_gib: float
    difference_gib: Optional[float] = None
    percent: Optional[float] = None


@frozen_fact
class VllmGraphEstimate(VllmFact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("Estimated CUDA graph memory",)
    PHASE: ClassVar[str] = "kv_pool"
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("gib", "estimated_cuda_graph_memory_gib"),)
    gib: float


@frozen_fact
class VllmUtilizationAdvice(VllmFact):
    """0.20+: `The current --gpu-memory-utilization=U is equivalent to … E … increase … to S`."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("graph memory profiling is",)
    current: Optional[float] = None
    equivalent: Optional[float] = None
    suggested: Optional[float] = None


@frozen_fact
class VllmInitialFree(VllmFact):
    """`Initial free memory …; Requested memory …` (DEBUG) or the `--kv-cache-memory` reservation
    `Initial free memory X GiB, reserved Y GiB memory for KV Cache …`."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Initial free memory",)
    # the reservation stands where profiling would print `Available KV cache memory` (skipped)
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("reserved_kv_gib", "available_kv_cache_gib"),)
    free_gib: Optional[float] = None
    requested_gib: Optional[float] = None
    utilization: Optional[float] = None
    reserved_kv_gib: Optional[float] = None


@frozen_fact
class VllmCpuKVSpace(VllmFact):
    """The CPU backend's KV cache space on a NUMA node: `Explicitly set (K/N) GiB for KV cache on
    node 0.` (VLLM_CPU_KVCACHE_SPACE) or `Auto set (K/N) GiB for KV cache on node 0, with R GiB
    requested memory for the worker. U GiB memory was consumed by non-kv usages.` — K the KV
    space, N the node's memory, R what the worker may use, U what the rest took."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("for KV cache on node",)
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("kv_gib", "available_kv_cache_gib"),
        ("node_total_gib", "cpu_node_memory_gib"))
    kv_gib: float
    node_total_gib: Optional[float] = None
    node: Optional[int] = None
    mode: str = "explicit"  # or "auto"
    requested_gib: Optional[float] = None
    non_kv_gib: Optional[float] = None


@frozen_fact
class VllmStartupError(VllmFact):
    """A start-up error vLLM states: no memory for cache blocks, max seq len beyond the KV
    cache, the engine core failing to start, its command line refused (`vllm: error: …`)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("No available memory for the cache blocks", "max seq len", "serve at least one request", "EngineCore failed", "Engine core initialization failed", "vllm: error:", "vllm serve: error:")
    FAILS_STARTUP: ClassVar[bool] = True
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (("kv_tokens", "kv_cache_tokens"),)
    reason: str  # "no-cache-memory", "max-seq-len", "engine-failed", "arguments" (argparse refused them)
    model_len: Optional[int] = None
    kv_tokens: Optional[int] = None  # V0's wording: the tokens the pool holds
    longest_fit: Optional[int] = None  # V1's: the longest request the memory allows, as vLLM estimates
    needed_gib: Optional[float] = None  # V1's: the KV one request of max_model_len needs
    available_gib: Optional[float] = None  # V1's: the KV memory there is


@frozen_fact
class VllmEngineReady(VllmFact):
    """`init engine (profile, create kv cache, warmup model) took S seconds`: the engine is up."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("init engine",)
    PHASE: ClassVar[str] = "ready"


@frozen_fact
class VllmRankAssignment(VllmFact):
    """`rank R in world size W is assigned as DP rank a, PP rank b, TP rank c, EP rank d` (0.8+,
    parallel_state.py): which ranks the process that printed it holds. A Ray or multiprocessing
    worker whose prefix names no rank is placed by this line (capdiag.parsing.worker_ranks)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("is assigned as",)
    global_rank: int
    world_size: int
    dp: Optional[int] = None
    pp: Optional[int] = None
    tp: Optional[int] = None
    ep: Optional[int] = None


@frozen_fact
class VllmHybridBlockSize(VllmFact):
    """`Setting attention block size to N tokens to ensure that attention page size is >= mamba
    page size`: the model is hybrid (attention + Mamba/linear layers)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("attention block size",)
    # the API server prints it while resolving the config (0.16+), before the engine's config line
    # opens the start-up: it is no rank's line, so it must not make that line open a second one
    RANK_NEUTRAL: ClassVar[bool] = True
    block_size: int
