"""The report's `observed` sections: the keys the JSON contract (shared spec: report-json.md)
always names. The figures themselves are the `observed` conclusions (rules/derive/observed.py).
"""
from __future__ import annotations

from typing import Any

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

