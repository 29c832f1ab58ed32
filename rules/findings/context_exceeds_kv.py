from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, cannot_judge, rule
from capdiag.rules._common import line_ref

@rule("context-exceeds-kv", code="CD104", worse=("fit", "lower"), severity="warning", thresholds={"few_requests": 2},
      reads=(F.VllmStartupError, F.VllmMaxConcurrency, F.VllmKVCacheSize, "kv_pool:tokens", "config:max_model_len?", "config:context_len?",
             "pool_cap?"))
def context_exceeds_kv(kb, t):
    """What it checks: one request at the full context length (SGLang's `context_len`, vLLM's
    `max_model_len`) does not fit in the KV pool, or only a handful do. vLLM refuses to start
    in the first case ("The model's max seq len (N) is larger than the maximum number of tokens
    that can be stored in KV cache (M)"); SGLang starts, and such a request waits forever or is
    cut. Fewer than `few_requests` full-length requests fitting is reported as information.
    Where vLLM prints its own `Maximum concurrency for L tokens per request` at the full context,
    that figure is the count (a hybrid model's sliding-window layers hold only their window, so
    more requests fit than tokens ÷ L); vLLM's V1 refusal states the longest request that fits.

    Why it matters: the context length promises clients a prompt size the pool cannot hold.

    Example: `max_total_num_tokens=20480 … context_len=32768`.

    What to do: lower the context length to what the pool holds, or grow the pool: a higher
    static fraction / gpu_memory_utilization, an fp8 KV cache, more TP.
    """
    error = next((e for e in kb.of(F.VllmStartupError, role=None) if e.reason == "max-seq-len"), None)
    if error is not None:
        # V0 states the pool's tokens; V1 the longest request the memory allows (or neither)
        limit = error.kv_tokens or error.longest_fit
        said = (f"exceeds the {error.kv_tokens} tokens the KV cache holds" if error.kv_tokens else
                f"needs more KV cache than is available: the longest request that fits is {error.longest_fit} "
                "tokens, as vLLM estimates it" if error.longest_fit else "needs more KV cache than is available")
        yield Parts((error,),
                    title="The context length exceeds the KV cache",
                    message=f"vLLM refused to start ({line_ref(error)}): max_model_len {error.model_len} {said}.",
                    action=(f"Set --max-model-len ≤ {limit}, or" if limit else "Lower --max-model-len, or")
                           + " raise --gpu-memory-utilization, use an fp8 KV cache or more TP.",
                    severity="error")
        return
    tokens = kb.get("kv_pool", "tokens")
    context = kb.get("config", "max_model_len") or kb.get("config", "context_len")
    if tokens is None or context is None or not tokens.known or not context.known \
            or not isinstance(context.value, int) or not context.value:
        yield cannot_judge(("the KV pool's token count", tokens),
                           ("the context length", context if context is None or context.known and
                            isinstance(context.value, int) and context.value else None))
        return
    # vLLM's own `Maximum concurrency` at this length counts what a request holds in each
    # layer: a sliding-window layer keeps only its window, so a hybrid model fits more requests
    # than tokens // length (gemma-3: 52,608 tokens, 7.64 requests of 32,768). Its ratio to the
    # printed pool scales any pool (a what-if's too); ~1 for full attention, where tokens // length
    # is exact and the printed 2 decimals are not.
    stated = next((c for c in kb.of(F.VllmMaxConcurrency, role=None) if c.tokens == context.value), None)
    printed = min((s.tokens for s in kb.of(F.VllmKVCacheSize, role=None)), default=None)
    ratio = stated.x * stated.tokens / printed if stated is not None and printed else 1.0
    stated = stated if ratio > 1.01 else None
    fit = int(round(tokens.value * ratio / context.value, 6)) if stated is not None else tokens.value // context.value
    if fit >= t["few_requests"]:
        return
    if kb.get("pool_cap") is not None:
        return  # a setting, not memory, sized the pool: pool-capped says which, and lifting it is the fix
    title = ("One request at the full context does not fit in the KV pool" if fit == 0
             else f"Only {fit} request at the full context fits in the KV pool")
    said = (f"vLLM states {stated.x}x requests of {stated.tokens} tokens ({line_ref(stated)})" if stated is not None
            else f"{fit} full-length request(s) fit at once")
    yield Parts((tokens, context) + ((stated,) if stated is not None else ()),
                title=title,
                message=f"The pool holds {tokens.value} tokens; the context length is {context.value}: {said}.",
                action=f"Lower the context length to ≤ {tokens.value}, or grow the pool (higher static fraction, "
                       "fp8 KV cache, more TP).",
                detail={"fit": fit},
                severity="warning" if fit == 0 else "info")
