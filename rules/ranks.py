"""Across ranks: which one binds the KV pool."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, rule
from capdiag.rules._common import line_ref


@rule("ranks.binding")
def binding_rank(kb):
    """The rank with the least memory for its KV pool binds every rank's pool (SGLang sizes the
    pool from the minimum over ranks; vLLM takes the smallest worker's block count). SGLang:
    the least free memory after the weights load, else after the pools; vLLM: the least
    `Available KV cache memory`."""
    for kind, attr, what in ((F.LoadWeightEnd, "avail_gib", "free after weights"),
                             (F.MemoryPoolEnd, "avail_gib", "free after pools"),
                             (F.VllmAvailableKV, "gib", "available KV cache memory")):
        readings = [f for f in kb.of(kind) if getattr(f, attr) is not None]
        ranks = {f.rank.key() for f in readings}
        if len(ranks) < 2:
            continue
        least = min(readings, key=lambda f: (getattr(f, attr), f.rank.key()))
        low = getattr(least, attr)
        spread = round(max(getattr(f, attr) for f in readings) - low, 2)
        yield Derived("binding_rank", None, least.rank.label, "ranks.binding", tuple(readings),
                      f"least {what}: {low} GiB on {least.rank.label} ({line_ref(least)}); "
                      f"spread across {len(ranks)} ranks {spread} GiB",
                      {"rank": least.rank.key(), "reading": what, "gib": low, "spread_gib": spread})
        return
