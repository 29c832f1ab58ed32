from __future__ import annotations

from capdiag.engine import Parts, cannot_judge, rule


@rule("low-concurrency", code="CD124", worse=("concurrent", "lower"), severity="warning", thresholds={"request_tokens": 4096, "min_concurrent": 1},
      reads=("config:max_running_requests", "config:context_len?", "config:max_model_len?", "kv_pool:tokens"))
def low_concurrency(kb, t):
    """What it checks: fewer than `min_concurrent` requests of `request_tokens` tokens fit at once
    — the KV tokens // request length, capped by the request limit where the log states it. A
    server whose stated context length is shorter than `request_tokens` refuses such requests
    whatever its pool holds, so it is judged at its context length: growing the pool would not
    let it take a longer request.

    Why it matters: a deploy gate's capacity floor. A configuration change (longer context,
    bigger model, a lower fraction) can leave the pool too small for the traffic it must carry,
    and the server still starts.

    Example: a policy with `request_tokens = 8192` and `min_concurrent = 32` against a pool of
    200,000 tokens: 24 fit.

    What to do: grow the pool (higher static fraction, fp8 KV, more TP) or lower the per-request
    length the deployment promises; set the floor in the policy to what the service needs.
    """
    tokens = kb.get("kv_pool", "tokens")
    if tokens is None or not tokens.known:
        yield cannot_judge(("the KV pool's token count", tokens))
        return
    asked = int(t["request_tokens"])
    context = kb.get("config", "context_len") or kb.get("config", "max_model_len")
    shorter = context is not None and context.known and isinstance(context.value, int) and 0 < context.value < asked
    length = context.value if shorter else asked
    limit = kb.get("config", "max_running_requests")
    fit = tokens.value // length
    capped = min(fit, limit.value) if limit is not None and limit.known and isinstance(limit.value, int) else fit
    if capped >= t["min_concurrent"]:
        return
    yield Parts((tokens, limit) + ((context,) if shorter else ()),
                title=f"Only {capped} concurrent request(s) of {length} tokens",
                message=f"{capped} request(s) of {length} tokens fit at once ({tokens.value:,} KV tokens // {length}"
                        + (f", request limit {limit.value}" if capped != fit else "")
                        + (f"; the context length {length} is below the {asked} tokens asked" if shorter else "")
                        + f"); the floor is {t['min_concurrent']}.",
                action="Grow the KV pool (higher static fraction, fp8 KV cache, more TP) or lower the request length.",
                detail={"concurrent": capped, "request_tokens": length})
