"""Per-rank `observed` values: figures exactly as the log prints them, under the report keys of
the JSON contract (shared spec: report-json.md). Nothing here computes; it only files facts.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from capdiag import facts as F
from capdiag.rules.derive.kv_pool import main_kv_line

# (fact kind, attribute, observed key). The first line of a kind on a rank fills the key.
_SIMPLE = (
    (F.LoadWeightBegin, "avail_gib", "load_weight_begin_avail_gib"),
    (F.LoadWeightEnd, "avail_gib", "load_weight_end_avail_gib"),
    (F.LoadWeightEnd, "mem_usage_gib", "weight_mem_usage_gib"),
    (F.TorchDistributedEnd, "mem_usage_gib", "torch_distributed_mem_usage_gib"),
    (F.MemoryPoolEnd, "avail_gib", "memory_pool_end_avail_gib"),
    (F.MambaCacheAllocated, "max_cache_size", "mamba_max_cache_size"),
    (F.MambaCacheAllocated, "conv_gib", "mamba_conv_state_gib"),
    (F.MambaCacheAllocated, "ssm_gib", "mamba_ssm_state_gib"),
    (F.MemoryProfiling, "available_gpu_memory_gib", "memory_profiling_available_gpu_memory_gib"),
    (F.MemoryProfiling, "total_gpu_memory_gib", "memory_profiling_total_gpu_memory_gib"),
    (F.MemoryProfiling, "rest_memory_gib", "memory_profiling_rest_memory_gib"),
    (F.DSV4MemoryCalculation, "available_bytes_gib", "dsv4_available_bytes_gib"),
    (F.DSV4MemoryCalculation, "full_token", "dsv4_full_token"),
    (F.DSV4MemoryCalculation, "bytes_per_full_token", "dsv4_bytes_per_full_token"),
    (F.SWAKVPoolUsage, "gib", "swa_kv_pool_mem_usage_gib"),
    (F.SWAKVPoolUsage, "full_size", "swa_kv_pool_full_size"),
    (F.SWAKVPoolUsage, "swa_size", "swa_kv_pool_swa_size"),
    (F.PostCaptureKVSizing, "kv_gib", "post_capture_kv_size_gib"),
    (F.KVAvailableMemory, "gib", "kv_available_memory_gib"),
    (F.PostCaptureKVSizing, "tokens", "post_capture_kv_tokens"),
    (F.TokenBudget, "max_total_num_tokens", "max_total_num_tokens"),
    (F.TokenBudget, "max_running_requests", "max_running_requests"),
    (F.TokenBudget, "context_len", "context_len"),
    (F.TokenBudget, "chunked_prefill_size", "chunked_prefill_size"),
    (F.TokenBudget, "available_gpu_mem_gib", "available_gpu_mem_gib"),
    (F.TokenBudget, "available_cpu_mem_gib", "available_cpu_mem_gib"),
    (F.OutOfMemory, "tried_to_allocate_mib", "oom_tried_to_allocate_mib"),
    (F.OutOfMemory, "total_capacity_gib", "oom_total_capacity_gib"),
    (F.OutOfMemory, "free_mib", "oom_free_mib"),
    (F.OutOfMemory, "process_in_use_gib", "oom_process_in_use_gib"),
    (F.OutOfMemory, "allocated_by_pytorch_gib", "oom_allocated_by_pytorch_gib"),
    (F.OutOfMemory, "reserved_unallocated_mib", "oom_reserved_unallocated_mib"),
    # vLLM; where two kinds fill one key, the earlier row is the preferred statement
    (F.VllmModelLoading, "gib", "model_loading_gib"),
    (F.VllmMemoryProfile, "values.weights_gib", "model_loading_gib"),
    (F.VllmAvailableKV, "gib", "available_kv_cache_gib"),
    (F.VllmMemoryProfile, "values.kv_cache_gib", "available_kv_cache_gib"),
    (F.VllmCpuKVSpace, "kv_gib", "available_kv_cache_gib"),
    (F.VllmCpuKVSpace, "node_total_gib", "cpu_node_memory_gib"),
    (F.VllmKVCacheSize, "tokens", "kv_cache_tokens"),
    (F.VllmStartupError, "kv_tokens", "kv_cache_tokens"),
    (F.VllmMaxConcurrency, "tokens", "max_concurrency_tokens"),
    (F.VllmMaxConcurrency, "x", "max_concurrency_x"),
    (F.VllmGraphCapture, "gib", "graph_capture_gib"),
    (F.VllmGpuBlocks, "blocks", "gpu_blocks"),
    (F.VllmMemoryProfile, "values.total_gpu_memory_gib", "total_gpu_memory_gib"),
    (F.VllmStartupMemory, "total_gib", "total_gpu_memory_gib"),
    (F.VllmMemoryProfile, "values.gpu_memory_utilization", "gpu_memory_utilization_printed"),
    (F.VllmMemoryProfile, "values.non_torch_gib", "non_torch_memory_gib"),
    (F.VllmMemoryProfile, "values.activation_peak_gib", "activation_peak_gib"),
    (F.VllmStartupMemory, "free_gib", "free_memory_on_startup_gib"),
    (F.VllmStartupMemory, "activation_gib", "activation_peak_gib"),
    (F.VllmStartupMemory, "non_torch_gib", "non_torch_memory_gib"),
    (F.VllmStartupMemory, "consumed_gib", "consumed_memory_gib"),
    (F.VllmStartupMemory, "kv_in_use_gib", "kv_cache_in_use_gib"),
    (F.VllmGraphPool, "actual_gib", "cuda_graph_pool_actual_gib"),
    (F.VllmGraphPool, "estimated_gib", "cuda_graph_pool_estimated_gib"),
    (F.VllmGraphEstimate, "gib", "estimated_cuda_graph_memory_gib"),
)
_LAST_WINS = (F.OutOfMemory,)  # "the last such message of the launch"

# The keys the report contract names (shared spec: report-json.md). They are always present,
# null where the log does not print the figure; other keys appear only with a value.
CONTRACT_KEYS = {
    "sglang": (
        "load_weight_begin_avail_gib", "load_weight_end_avail_gib", "weight_mem_usage_gib", "kv_tokens",
        "k_size_gib", "v_size_gib", "kv_size_gib", "memory_pool_end_avail_gib", "cuda_graph_mem_usage_gib",
        "cuda_graph_end_avail_gib", "piecewise_cuda_graph_mem_usage_gib", "piecewise_cuda_graph_end_avail_gib",
        "prefill_cuda_graph_mem_usage_gib", "max_total_num_tokens", "max_running_requests", "context_len",
        "available_gpu_mem_gib", "mamba_max_cache_size", "mamba_conv_state_gib", "mamba_ssm_state_gib",
        "memory_profiling_available_gpu_memory_gib", "memory_profiling_total_gpu_memory_gib",
        "memory_profiling_rest_memory_gib", "dsv4_available_bytes_gib", "dsv4_full_token",
        "swa_kv_pool_mem_usage_gib", "swa_kv_pool_full_size", "swa_kv_pool_swa_size"),
    "vllm": (
        "model_loading_gib", "available_kv_cache_gib", "kv_cache_tokens", "max_concurrency_tokens",
        "max_concurrency_x", "graph_capture_gib", "gpu_blocks", "total_gpu_memory_gib"),
}
OOM_KEYS = ("oom_tried_to_allocate_mib", "oom_total_capacity_gib", "oom_free_mib", "oom_process_in_use_gib",
            "oom_allocated_by_pytorch_gib", "oom_reserved_unallocated_mib")


def with_contract_keys(observed: dict[str, Any], framework: str | None) -> dict[str, Any]:
    """The contract's keys for the framework first (null where not printed), then the rest."""
    named = CONTRACT_KEYS.get(framework or "", ()) + OOM_KEYS
    return {**{key: observed.get(key) for key in named}, **observed}


def _kv(lines: list[F.KVCacheAllocated], budget) -> dict[str, Any]:
    main = main_kv_line(lines, budget) or next((f for f in lines if not f.va_upper_bound), None)
    if main is None:
        return {}
    return {"kv_tokens": main.tokens, "k_size_gib": main.k_gib, "v_size_gib": main.v_gib, "kv_size_gib": main.kv_gib}


def _graphs(ends: list[F.GraphCaptureEnd], role: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if role == "draft":
        usage = [e.mem_usage_gib for e in ends if e.mem_usage_gib is not None]
        if usage:
            out["cuda_graph_mem_usage_gib"] = round(sum(usage), 2)
        return out
    main = next((e for e in ends if e.graph in ("decode", "verify")), None)
    if main is not None:
        out["cuda_graph_mem_usage_gib"] = main.mem_usage_gib
        out["cuda_graph_end_avail_gib"] = main.avail_gib
    for kind in ("piecewise", "prefill"):
        end = next((e for e in ends if e.graph == kind), None)
        if end is not None:
            out[f"{kind}_cuda_graph_mem_usage_gib"] = end.mem_usage_gib
            out[f"{kind}_cuda_graph_end_avail_gib"] = end.avail_gib
    return out


def _get(fact: F.Fact, attr: str) -> Any:
    """An attribute, or `values.key` for a fact that keeps its figures in a mapping."""
    if attr.startswith("values."):
        return fact.values.get(attr[len("values."):])
    return getattr(fact, attr)


def owner(fact: F.Fact) -> tuple:
    """The rank a fact is filed under: an untagged OOM message belongs to the GPU it names."""
    if isinstance(fact, F.OutOfMemory) and not fact.rank.tagged and fact.gpu is not None:
        return (0, 0, fact.gpu, "")
    return fact.rank.key()


def observed_by_rank(facts: Iterable[F.Fact]) -> dict[tuple, dict[str, Any]]:
    grouped: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for fact in facts:
        if fact.role != F.RUNTIME_ROLE:  # traffic lines are the run-time section's, not a rank's start-up
            grouped[owner(fact)][fact.role].append(fact)
    result: dict[tuple, dict[str, Any]] = {}
    for rank, by_role in grouped.items():
        values: dict[str, Any] = {}
        for role in ("target", "draft"):
            items = by_role.get(role, [])
            prefix = "draft_" if role == "draft" else ""
            own: dict[str, Any] = {}
            for kind, attr, key in _SIMPLE:
                found = [f for f in items if isinstance(f, kind) and _get(f, attr) is not None]
                if found and key not in own:
                    own[key] = _get(found[-1] if kind in _LAST_WINS else found[0], attr)
            budget = next((f for f in items if isinstance(f, F.TokenBudget)), None)
            own.update(_kv([f for f in items if isinstance(f, F.KVCacheAllocated)], budget))
            own.update(_graphs([f for f in items if isinstance(f, F.GraphCaptureEnd)], role))
            begin = next((f for f in items if isinstance(f, F.GraphCaptureBegin)
                          and f.graph in ("decode", "verify") and f.avail_gib is not None), None)
            if begin is not None:
                own["cuda_graph_begin_avail_gib"] = begin.avail_gib
            values.update({prefix + k: v for k, v in own.items() if v is not None})
        result[rank] = values
    return result
