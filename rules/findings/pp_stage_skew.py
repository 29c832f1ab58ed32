from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule

_READINGS = ((F.LoadWeightEnd, "mem_usage_gib", "weights"), (F.VllmModelLoading, "gib", "weights"),
             (F.MemoryPoolEnd, "avail_gib", "free after pools"), (F.VllmAvailableKV, "gib", "available KV memory"))


@rule("pp-stage-skew", code="CD118", worse=("spread_gib", "higher"), severity="warning", thresholds={"max_spread_gib": 2.0},
      reads=(F.LoadWeightEnd, F.MemoryPoolEnd, F.VllmAvailableKV, F.VllmModelLoading))
def pp_stage_skew(kb, t):
    """What it checks: pipeline stages differ by more than `max_spread_gib` GiB in weights, free
    memory after the pools, or available KV memory.

    Why it matters: the first stage holds the embeddings, the last the LM head, and layer
    counts need not divide evenly; the token capacity is the minimum over stages, so the
    heaviest stage decides it for all.

    Example: PP0 weights 30.5 GiB, PP1 weights 33.1 GiB.

    What to do: rebalance layers across stages (SGLang `SGLANG_PP_LAYER_PARTITION`, vLLM
    `VLLM_PP_LAYER_PARTITION`), or use TP for the heavy part.
    """
    for kind, attr, what in _READINGS:
        by_stage: dict[int, F.Fact] = {}
        for f in kb.of(kind):
            if f.rank.pp is not None and getattr(f, attr) is not None:
                by_stage.setdefault(f.rank.pp, f)
        if len(by_stage) < 2:
            continue
        low = min(by_stage.values(), key=lambda f: getattr(f, attr))
        high = max(by_stage.values(), key=lambda f: getattr(f, attr))
        spread = round(getattr(high, attr) - getattr(low, attr), 2)
        if spread > t["max_spread_gib"]:
            yield Parts(tuple(by_stage.values()),
                        title=f"PP stages differ by {spread} GiB in {what}",
                        message=f"Pipeline stages differ by {spread} GiB in {what}: PP{low.rank.pp} "
                                f"{getattr(low, attr)}, PP{high.rank.pp} {getattr(high, attr)} GiB.",
                        action="Rebalance the layer partition across stages (SGLANG_PP_LAYER_PARTITION / "
                               "VLLM_PP_LAYER_PARTITION).",
                        detail={"reading": what, "spread_gib": spread},
                        key=what)
