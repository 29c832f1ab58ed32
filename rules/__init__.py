"""The rules, in the order the engine fires them: conclusions first, then findings.

Each rule is a short pure function of the knowledge base; its docstring is its documentation
(`capdiag rules` prints it). Rules that raise findings carry a stable code and slug. Each
framework has its own reading of the memory lines; the rest is shared.
"""
from capdiag.rules import (breakdown, concurrency, config, context_exceeds_kv, gpu, kv_pool, kv_theory,
                           mem_fraction_unstated, nvidia_smi, out_of_memory, ranks, startup_incomplete,
                           startup_phase, target_rank, utilization_too_high, vllm_breakdown, vllm_capacity,
                           vllm_config, weights_theory)

SGLANG = (
    config.config,
    config.mem_fraction,
    breakdown.weights,
    breakdown.kv_cache,
    breakdown.cuda_graph,
    breakdown.mamba_state,
    breakdown.draft_weights,
    breakdown.draft_kv_cache,
    breakdown.draft_cuda_graph,
    breakdown.framework,
    breakdown.free,
    breakdown.unattributed,
    kv_pool.tokens,
    kv_pool.bytes_per_token,
    kv_pool.budget,
    concurrency.concurrency,
)

VLLM = (
    vllm_config.config,
    vllm_config.gpu_memory_utilization,
    vllm_breakdown.weights,
    vllm_breakdown.kv_cache,
    vllm_breakdown.cuda_graph,
    vllm_breakdown.activation,
    vllm_breakdown.framework,
    vllm_breakdown.budget,
    vllm_capacity.tokens,
    vllm_capacity.bytes_per_token,
    vllm_capacity.concurrency,
    vllm_capacity.concurrency_check,
)

COMMON_BEFORE = (target_rank.target_rank, gpu.identity, gpu.total)

COMMON_AFTER = (
    nvidia_smi.ranks,
    nvidia_smi.other,
    kv_theory.kv_dtype,
    kv_theory.theoretical,
    kv_theory.compare,
    weights_theory.theoretical,
    ranks.binding_rank,
    startup_phase.phase,
    startup_incomplete.startup_incomplete,
    out_of_memory.out_of_memory,
    context_exceeds_kv.context_exceeds_kv,
    utilization_too_high.utilization_too_high,
    mem_fraction_unstated.mem_fraction_unstated,
)

BY_FRAMEWORK = {"sglang": SGLANG, "vllm": VLLM}


def rules_for(framework: str) -> tuple:
    return COMMON_BEFORE + BY_FRAMEWORK[framework] + COMMON_AFTER


ALL = COMMON_BEFORE + SGLANG + VLLM + COMMON_AFTER
FINDING_RULES = tuple(r for r in ALL if r.code)
