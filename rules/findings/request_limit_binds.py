from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, cannot_judge, rule
from capdiag.rules._common import is_vllm


@rule("request-limit-binds", code="CD115", severity="info",
      reads=(F.Options, "concurrency"))
def request_limit_binds(kb):
    """What it checks: at some request length the request limit (`max_running_requests`, vLLM
    `max_num_seqs`) caps concurrency before the KV tokens do — or the reverse across lengths.

    Why it matters: a request cap below what the pool holds leaves KV memory idle at short
    lengths; raising it buys throughput for free. Where tokens bind, more requests only queue.

    Example: `max_total_num_tokens=1317632 … max_running_requests=256`: at 4096 tokens the pool
    holds 321 requests, the cap allows 256.

    What to do: raise `--max-running-requests` (vLLM `--max-num-seqs`) toward the token limit at
    your typical length, watching activation memory; or accept the cap.
    """
    rows = sorted((c for c in kb.topic("concurrency") if c.known), key=lambda c: c.key)
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
    yield Parts(capped,
                title="The request limit, not KV memory, caps concurrency",
                message=f"The request limit binds before the KV pool at {parts}.",
                action=f"Raise {flag} toward the token limit at your typical request length if throughput matters.")
