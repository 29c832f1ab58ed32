from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, cannot_judge, rule

# (fact kind, attribute, what it measures)
_READINGS = ((F.LoadWeightBegin, "avail_gib", "free before weights"), (F.LoadWeightEnd, "mem_usage_gib", "weights"),
             (F.LoadWeightEnd, "avail_gib", "free after weights"), (F.MemoryPoolEnd, "avail_gib", "free after pools"),
             (F.VllmModelLoading, "gib", "weights"), (F.VllmAvailableKV, "gib", "available KV memory"))


@rule("rank-imbalance", code="CD112", worse=("spread_gib", "higher"), severity="warning", thresholds={"max_spread_gib": 1.0},
      reads=(F.LoadWeightBegin, F.LoadWeightEnd, F.MemoryPoolEnd, F.VllmAvailableKV, F.VllmModelLoading,
             "config:tp_size", "config:pp_size", "config:dp_size"))
def rank_imbalance(kb, t):
    """What it checks: ranks of one launch differ by more than `max_spread_gib` GiB in free
    memory before or after weights, in weights, or in KV memory.

    Why it matters: every rank's KV pool is sized from the minimum over ranks, so one rank with
    less free memory (another process on its GPU, an uneven PP split, a rank holding extra
    layers) shrinks the pool on all of them.

    Example: TP0 starts with 78.4 GiB free, TP5 with 71.2 GiB: something else holds 7 GiB on
    GPU 5.

    What to do: find what holds memory on the binding rank's GPU (nvidia-smi's process list);
    rebalance PP layers; the binding rank is named.
    """
    compared = False
    for kind, attr, what in _READINGS:
        readings = [f for f in kb.of(kind) if getattr(f, attr) is not None]
        if len({f.rank.key() for f in readings}) < 2:
            continue
        compared = True
        low = min(readings, key=lambda f: getattr(f, attr))
        high = max(readings, key=lambda f: getattr(f, attr))
        spread = round(getattr(high, attr) - getattr(low, attr), 2)
        if spread <= t["max_spread_gib"]:
            continue
        binding = low if "free" in what or "KV" in what else high
        # stages hold different layers; TP ranks hold equal shards, so a TP rank that differs
        # has something else on its GPU
        staged = any(f.rank.pp not in (None, 0) for f in readings) or (kb.value("config", "pp_size") or 1) > 1
        # the binding rank's reading first: the line a pointer to this finding lands on
        yield Parts((binding, *(f for f in readings if f is not binding)),
                    title=f"Ranks differ by {spread} GiB in {what}",
                    message=f"{what} differs by {spread} GiB across ranks: {getattr(low, attr)} on {low.rank.label}, "
                            f"{getattr(high, attr)} on {high.rank.label}; {binding.rank.label} binds the pool.",
                    action=f"Check what else holds memory on {binding.rank.label}'s GPU (nvidia-smi processes)"
                           + ("; rebalance the pipeline stages' layers." if staged else
                              ": the ranks hold equal shards, so the difference is another process or the GPU itself."),
                    detail={"reading": what, "spread_gib": spread, "binding_rank": binding.rank.label},
                    key=what)
    sizes = [kb.get("config", k) for k in ("tp_size", "pp_size", "dp_size")]
    if not compared and not all(d is not None and d.known and d.value == 1 for d in sizes):
        yield cannot_judge(("the same reading from two or more ranks",
                            "the log shows one rank, and does not state TP, PP and DP as 1"))
