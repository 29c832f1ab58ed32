from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, cannot_judge, rule
from capdiag.rules._common import is_vllm


@rule("request-limit-binds", code="CD115", severity="info",
      reads=(F.Options, F.MambaCacheAllocated, "concurrency"))
def request_limit_binds(kb):
    """What it checks: at some request length the request limit (`max_running_requests`, vLLM
    `max_num_seqs`) caps concurrency before the KV tokens do — or the reverse across lengths.

    Why it matters: a request cap below what the pool holds leaves KV memory idle at short
    lengths; raising it buys throughput for free. Where tokens bind, more requests only queue.

    Example: `max_total_num_tokens=1317632 … max_running_requests=256`: at 4096 tokens the pool
    holds 321 requests, the cap allows 256.

    A hybrid model's limit can be SGLang's own: its Mamba state slots (`max_mamba_cache_size`),
    three a request with the radix cache. Then the cap is the state pool, which was sized from
    the same memory as the KV pool: more requests take state slots from it, not a setting.

    What to do: raise `--max-running-requests` (vLLM `--max-num-seqs`) toward the token limit at
    your typical length, watching activation memory; or accept the cap. Where the Mamba slots
    set it, more requests need more state memory (`--max-mamba-cache-size`, taken from the KV
    pool) or more memory.
    """
    rows = sorted((c for c in kb.topic("concurrency") if c.known and not c.detail.get("longer_than_context")),
                  key=lambda c: c.key)
    if not rows:
        unknown = sorted(kb.topic("concurrency"), key=lambda c: c.key)
        yield cannot_judge(("the concurrency per request length", unknown[0] if unknown else None))
        return
    capped = [c for c in rows if c.detail.get("binding") == "requests"]
    if not capped:
        return
    flag = "--max-num-seqs" if is_vllm(kb) else "--max-running-requests"
    parts = ", ".join(f"{c.key} tokens: {c.detail['token_limit']} fit, {c.detail['request_limit']} allowed"
                      for c in capped)
    mamba = kb.first(F.MambaCacheAllocated, role=None)
    limit = capped[0].detail["request_limit"]
    if mamba is not None and mamba.max_cache_size and isinstance(limit, int) and limit <= mamba.max_cache_size // 2:
        yield Parts(capped + [mamba],
                    title="The Mamba state slots, not KV memory, cap concurrency",
                    message=f"The request limit binds before the KV pool at {parts}; the limit is the state pool's: "
                            f"{mamba.max_cache_size} Mamba state slots, {mamba.max_cache_size // limit} a request.",
                    action=f"Raising {flag} does not lift this cap: each request needs state slots, sized from the "
                           "same memory as the KV pool. Give the state more slots (--max-mamba-cache-size, taken from "
                           "the KV pool) or the server more memory; or accept the cap.",
                    key="mamba")
        return
    yield Parts(capped,
                title="The request limit, not KV memory, caps concurrency",
                message=f"The request limit binds before the KV pool at {parts}.",
                action=f"Raise {flag} toward the token limit at your typical request length if throughput matters.")
