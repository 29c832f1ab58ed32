from __future__ import annotations

from capdiag.engine import Parts, cannot_judge, rule
from capdiag import facts as F
from capdiag.rules._common import gib, is_vllm, shares_system_memory, target
from capdiag.vocabulary import GIB


# Lines that show the start-up failed or ran out of memory: free memory is then no waste.
_FAILED = (F.OutOfMemory, F.NotEnoughMemory, F.VllmStartupError, F.SchedulerException)


@rule("excess-headroom", code="CD111", severity="info",
      thresholds={"max_free_gib": 8.0, "keep_gib": 3.0, "keep_share": 0.15},
      reads=(F.LoadWeightBegin, F.MemoryProfiling, F.Options, *_FAILED, "breakdown:kv_cache?", "kv_pool:bytes_per_token?",
             "kv_pool:tokens?", "breakdown:budget?", "gpu:total_gib?", "config:gpu_memory_utilization?",
             "breakdown:free?", "config:mem_fraction_static?", "target_rank?", "failure?", "pool_cap?",
             F.VllmStartupMemory, "gpu:identity?", "config:sleep_mode?"))
def excess_headroom(kb, t):
    """What it checks: more than `max_free_gib` GiB is still free at the end of start-up.

    Why it matters: the KV pool could grow by about the excess, and token capacity with it.
    The projection uses the framework's own sizing: SGLang sizes the pool as free-after-weights
    − free-before-weights × (1 − fraction), so raising the fraction by Δ grows the pool by
    free-before-weights × Δ; vLLM's budget is total × utilization, so Δ grows it by total × Δ.
    Tokens = pool bytes / bytes per token.

    Example: `available_gpu_mem=34.28 GB` after capture on an H20 with fraction 0.60.

    Never for a start-up that failed or ran out of memory, nor when a setting caps the pool
    (`pool-capped` says which), nor when the projection would reach a fraction of 1 or more.

    Production guidance keeps 10–20% of a GPU free for activation spikes: memory up to
    `keep_share` of the total is headroom, not waste, and only what lies beyond both that and
    `max_free_gib` counts (where the total is not known, `keep_share` of SGLang's free memory
    before the weights, which the total is at least). Never on memory shared with the CPU (DGX Spark GB10), where what is
    "free" belongs to the whole machine; nor on a rollout server started to hand its memory back
    (vLLM sleep mode, SGLang's memory saver: `config.sleep_mode`), whose free memory is the
    colocated trainer's.

    What to do: raise the fraction to the suggested value, keeping `keep_gib` GiB and
    `keep_share` of the GPU free, and check the new start-up's free memory.
    """
    if shares_system_memory(kb) or kb.value("config", "sleep_mode") is True:
        return
    if kb.get("failure") is not None or kb.get("pool_cap") is not None or kb.of(*_FAILED, role=None) or \
            any(s.error for s in kb.of(F.VllmStartupMemory, role=None)):
        return
    vllm = is_vllm(kb)
    kv = kb.get("breakdown", "kv_cache")
    per_token = kb.get("kv_pool", "bytes_per_token")
    tokens = kb.get("kv_pool", "tokens")
    if vllm:
        budget, total, util = kb.get("breakdown", "budget"), kb.get("gpu", "total_gib"), \
            kb.get("config", "gpu_memory_utilization")
        if None in (budget, total, util) or not (budget.known and total.known and util.known):
            yield cannot_judge(("vLLM's memory budget", budget), ("the GPU total", total),
                               ("gpu_memory_utilization", util))
            return
        free, base, fraction, name = total.value - budget.value, total.value, util.value, "gpu_memory_utilization"
        premises = (budget, total, util)
    else:
        free_row, mfs = kb.get("breakdown", "free"), kb.get("config", "mem_fraction_static")
        rank = target(kb)
        begin = kb.first(F.LoadWeightBegin, rank) if rank is not None else None
        profiling = kb.first(F.MemoryProfiling, role=None)
        pre = begin.avail_gib if begin is not None else profiling.total_gpu_memory_gib if profiling else None
        if free_row is None or not free_row.known or mfs is None or not mfs.known or pre is None:
            yield cannot_judge(("the memory free at the end of start-up", free_row),
                               ("mem_fraction_static", mfs),
                               *((("the free memory before weights load", None),) if pre is None else ()))
            return
        free, fraction, name, base = free_row.value, mfs.value, "mem_fraction_static", pre
        premises = (free_row, mfs, begin or profiling)
    total_d = kb.get("gpu", "total_gib")
    # the share kept free is of the GPU total; where it is not known, of SGLang's free memory
    # before the weights, which the total is at least (vLLM's base is the total itself)
    share_of = total_d.value if total_d is not None and total_d.known else base
    keep = max(t["keep_gib"], t["keep_share"] * share_of)
    grow = free - keep
    if free <= t["max_free_gib"] or grow <= t["max_free_gib"] - t["keep_gib"] or base <= 0:
        return
    suggested = round(fraction + grow / base, 3)
    if not fraction < suggested < 1:
        return
    projection = ""
    if per_token is not None and per_token.known and per_token.value > 0 and tokens is not None and tokens.known:
        extra = int(grow * GIB // per_token.value)
        projection = f": about {extra:,} more tokens ({tokens.value:,} → {tokens.value + extra:,})"
        premises += (per_token, tokens)
    yield Parts(premises + ((kv,) if kv is not None else ()),
                title=f"{gib(free)} GiB left unused after start-up",
                message=f"{gib(free)} GiB is still free after start-up; {name} could go from {fraction} up to "
                        f"{suggested}, the most that keeps {gib(keep)} GiB free, growing the KV pool by up to "
                        f"{gib(grow)} GiB{projection}.",
                action=f"Raise {name} to about {suggested} and check the next start-up's free memory.",
                detail={"free_gib": gib(free), "suggested": suggested})
