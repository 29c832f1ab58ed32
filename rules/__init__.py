"""The rules, grouped by what they do. The order here does not matter: the engine derives the
firing order from each rule's `reads=`/`concludes=` declarations (capdiag/engine.py).

Each rule is a short pure function of the knowledge base; its docstring is its documentation
(`capdiag rules` prints it, docs/rules.md is generated from it). Rules that raise findings
carry a stable code and slug. Each framework has its own reading of the memory lines; the
rest is shared.
"""
from capdiag.rules.derive import (breakdown, concurrency, config, failure_cause, gpu, kv_pool, kv_theory, nvidia_smi,
                                  observed, pool_cap, ranks, runtime, stand_in, startup_phase, target_rank, vllm_breakdown,
                                  vllm_capacity, vllm_config, weights_theory, worker_ranks)
from capdiag.rules.findings import (context_exceeds_kv, cuda_graph_estimate_off, cuda_graph_heavy,
                                    deepgemm_jit_suspected, dp_attention_budget, excess_headroom, fp8_kv_opportunity,
                                    gpu_capacity_ambiguous, kernel_cache_cold, kv_capacity_binds, kv_head_replication,
                                    kv_retractions, low_concurrency, mem_fraction_unstated, moe_expert_buffers,
                                    observed_lengths, out_of_memory, overlap_weight_load, pool_capped, pp_stage_skew, rank_imbalance,
                                    request_limit_binds, request_limit_binds_traffic, speculative_draft_memory,
                                    startup_failed, startup_incomplete, swa_compressed_kv, thin_headroom,
                                    unexplained_memory, utilization_too_high, weights_exceed_budget)
from capdiag.rules.diff.rules import DIFF_RULES
from capdiag.rules.plan import rules as plan
from capdiag.rules.what_if import projection as what_if

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

COMMON_BEFORE = (target_rank.target_rank, stand_in.stand_in, worker_ranks.worker_ranks, gpu.identity, gpu.total)

COMMON_AFTER = (
    nvidia_smi.ranks,
    nvidia_smi.processes,
    nvidia_smi.other,
    kv_theory.kv_dtype,
    kv_theory.theoretical,
    kv_theory.compare,
    weights_theory.theoretical,
    observed.by_rank,
    observed.target,
    ranks.binding_rank,
    ranks.rank_memory,
    startup_phase.phase,
    failure_cause.root_cause,
    pool_cap.pool_cap,
    runtime.summary,
)

# Findings, by code.
FINDINGS = (
    startup_incomplete.startup_incomplete,
    out_of_memory.out_of_memory,
    mem_fraction_unstated.mem_fraction_unstated,
    context_exceeds_kv.context_exceeds_kv,
    utilization_too_high.utilization_too_high,
    unexplained_memory.unexplained_memory,
    deepgemm_jit_suspected.deepgemm_jit_suspected,
    kernel_cache_cold.kernel_cache_cold,
    overlap_weight_load.overlap_weight_load,
    thin_headroom.thin_headroom,
    excess_headroom.excess_headroom,
    rank_imbalance.rank_imbalance,
    kv_head_replication.kv_head_replication,
    fp8_kv_opportunity.fp8_kv_opportunity,
    request_limit_binds.request_limit_binds,
    cuda_graph_heavy.cuda_graph_heavy,
    cuda_graph_estimate_off.cuda_graph_estimate_off,
    pp_stage_skew.pp_stage_skew,
    dp_attention_budget.dp_attention_budget,
    speculative_draft_memory.speculative_draft_memory,
    swa_compressed_kv.swa_compressed_kv,
    moe_expert_buffers.moe_expert_buffers,
    gpu_capacity_ambiguous.gpu_capacity_ambiguous,
    low_concurrency.low_concurrency,
    weights_exceed_budget.weights_exceed_budget,
    pool_capped.pool_capped,
    startup_failed.startup_failed,
    kv_capacity_binds.kv_capacity_binds,
    request_limit_binds_traffic.request_limit_binds_traffic,
    kv_retractions.kv_retractions,
    observed_lengths.observed_lengths,
)

# Projections run last: they say which findings a change would add or remove.
WHAT_IF = (what_if.sglang, what_if.vllm)

BY_FRAMEWORK = {"sglang": SGLANG, "vllm": VLLM}


def rules_for(framework: str, every: bool = False) -> tuple:
    """The rule set for one framework's logs: its own readings, the shared rules, and the
    findings and projections that apply to it (with `every`, also those that do not, for the
    trace to say why they did not fire). The engine orders them from their declarations."""
    return tuple(r for r in COMMON_BEFORE + BY_FRAMEWORK[framework] + COMMON_AFTER + FINDINGS + WHAT_IF
                 if every or not r.frameworks or framework in r.frameworks)


ALL = COMMON_BEFORE + SGLANG + VLLM + COMMON_AFTER + FINDINGS + WHAT_IF
FINDING_RULES = FINDINGS


def find_rule(name_or_code: str):
    """A finding rule by slug or code (case-insensitive); None if there is none."""
    wanted = name_or_code.strip().lower()
    return next((r for r in FINDINGS if r.name == wanted or (r.code or "").lower() == wanted), None)


PLAN = (gpu.identity, gpu.total, plan.parameters, plan.weights, plan.kv_per_token, plan.usable, plan.buckets,
        plan.verdict)

DIFF = DIFF_RULES

# The rules that derive values (everything but the findings), each once: `capdiag rules --derivations`.
DERIVATIONS = tuple(dict.fromkeys(r for r in ALL + PLAN + DIFF if r.code is None))


def find_any_rule(name_or_code: str):
    """A finding rule by slug or code, else a derivation rule by name (case-insensitive)."""
    wanted = name_or_code.strip().lower()
    return find_rule(name_or_code) or next((r for r in DERIVATIONS if r.name == wanted), None)
