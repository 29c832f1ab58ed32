"""Across ranks: which one binds the KV pool."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, rule
from capdiag.rules._common import line_ref


@rule("ranks.binding")
def binding_rank(kb):
    """The rank with the least free memory after its weights load binds the KV pool: SGLang
    sizes every rank's pool from the minimum over ranks. Where no rank printed that reading,
    the least free memory after the pools stands in."""
    for kind, what in ((F.LoadWeightEnd, "free after weights"), (F.MemoryPoolEnd, "free after pools")):
        readings = [f for f in kb.of(kind) if f.avail_gib is not None]
        ranks = {f.rank.key() for f in readings}
        if len(ranks) < 2:
            continue
        least = min(readings, key=lambda f: (f.avail_gib, f.rank.key()))
        spread = round(max(f.avail_gib for f in readings) - least.avail_gib, 2)
        yield Derived("binding_rank", None, least.rank.label, "ranks.binding", tuple(readings),
                      f"least {what}: {least.avail_gib} GiB on {least.rank.label} ({line_ref(least)}); "
                      f"spread across {len(ranks)} ranks {spread} GiB",
                      {"rank": least.rank.key(), "reading": what, "gib": least.avail_gib, "spread_gib": spread})
        return
