"""The rules, in the order the engine fires them: conclusions first, then findings.

Each rule is a short pure function of the knowledge base; its docstring is its documentation
(`capdiag rules` prints it). Rules that raise findings carry a stable code and slug.
"""
from capdiag.rules import (breakdown, concurrency, config, kv_pool, mem_fraction_unstated, out_of_memory,
                           ranks, startup_incomplete, startup_phase, target_rank)

ALL = (
    target_rank.target_rank,
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
    breakdown.other,
    breakdown.unattributed,
    kv_pool.tokens,
    kv_pool.bytes_per_token,
    kv_pool.budget,
    concurrency.concurrency,
    ranks.binding_rank,
    startup_phase.phase,
    startup_incomplete.startup_incomplete,
    out_of_memory.out_of_memory,
    mem_fraction_unstated.mem_fraction_unstated,
)

FINDING_RULES = tuple(r for r in ALL if r.code)
