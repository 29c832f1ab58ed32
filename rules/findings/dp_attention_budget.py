from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule


@rule("dp-attention-budget", code="CD119", severity="info",
      reads=(F.Fact, "config:dp_size", "kv_pool:tokens", "concurrency"))
def dp_attention_budget(kb):
    """What it checks: the server runs data-parallel attention or several DP replicas (SGLang
    `dp_size` > 1, vLLM `data_parallel_size` > 1, or DP tags on the ranks).

    Why it matters: `max_total_num_tokens` and `max_running_requests` (vLLM: the KV cache size)
    are per DP worker. The cluster holds dp_size times as much, but one request lives on one
    worker: a long request must fit a single worker's pool, and the worker with the smallest
    pool binds its own share.

    Example: `[… DP3 TP3] …` ranks with `max_total_num_tokens=529408` per worker.

    What to do: size per-request limits against one worker's pool; balance load across workers.
    """
    dp = kb.value("config", "dp_size")
    tags = {f.rank.dp for f in kb.facts if f.rank.dp is not None and f.role != F.RUNTIME_ROLE}
    workers = dp if isinstance(dp, int) and dp > 1 else (len(tags) if len(tags) > 1 else None)
    if not workers:
        return
    tokens = kb.get("kv_pool", "tokens")
    rows = sorted((c for c in kb.topic("concurrency") if c.known and not c.detail.get("longer_than_context")),
                  key=lambda c: c.key)
    totals = ""
    if tokens is not None and tokens.known:
        totals = f" Per worker {tokens.value:,} tokens; the cluster {tokens.value * workers:,}."
    if rows:
        totals += (f" At {rows[0].key} tokens per request: {rows[0].value} concurrent per worker, "
                   f"{rows[0].value * workers} across {workers} workers.")
    sources = [d for d in (kb.get("config", "dp_size"), tokens) if d is not None]
    yield Parts(sources or [f for f in kb.facts if f.rank.dp is not None and f.role != F.RUNTIME_ROLE][:4],
                title=f"Capacity is per DP worker ({workers} workers)",
                message=f"{workers} DP workers: token and request limits in the log are per worker.{totals}",
                action="Size the longest request against one worker's pool; multiply by the worker count only "
                       "for aggregate capacity.",
                detail={"workers": workers})
