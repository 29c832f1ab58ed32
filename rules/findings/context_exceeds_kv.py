from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, cannot_judge, rule
from capdiag.rules._common import line_ref, shares_system_memory
from capdiag.vocabulary import MAX_FRACTION

PRINTED = 0.005  # vLLM prints the sizes to two decimals of GiB


def _refusal_action(kb, error: F.VllmStartupError) -> tuple[str, str]:
    """(what the refusal says of the longest request that fits, the action): the context length
    that fits first, then each other way out only where vLLM's own sizes show it closes the gap —
    an fp8 KV cache halves the need; a higher utilization adds total × Δ, never past MAX_FRACTION
    nor on memory shared with the CPU."""
    limit, estimated = error.kv_tokens or error.longest_fit, False
    need, have = error.needed_gib, error.available_gib
    if not limit and need and have and error.model_len:
        # the need grows with the length (exactly so for full attention): the least the memory
        # may be over the most the need may be, as printed
        limit, estimated = int(error.model_len * max(have - PRINTED, 0) / (need + PRINTED)), True
    ways = []
    dtype = " ".join(str(kb.value(*k) or "") for k in (("kv_pool", "dtype"), ("config", "kv_cache_dtype")))
    if "fp8" not in dtype.lower():
        if need and have and need / 2 <= have - PRINTED:
            ways.append(f"store the KV cache in fp8 (--kv-cache-dtype fp8: {need / 2:.2f} GiB needed of {have:.2f})")
        elif error.kv_tokens and error.model_len and 2 * error.kv_tokens >= error.model_len:
            ways.append(f"store the KV cache in fp8 (--kv-cache-dtype fp8: about {2 * error.kv_tokens:,} tokens)")
    total, util = kb.value("gpu", "total_gib"), kb.value("config", "gpu_memory_utilization")
    if need and have and isinstance(total, (int, float)) and isinstance(util, float) and total > 0 \
            and not shares_system_memory(kb):
        raised = -(-round((util + (need - have + PRINTED) / total) * 100, 6) // 1) / 100
        if util < raised <= MAX_FRACTION:
            ways.append(f"raise --gpu-memory-utilization to {raised:.2f} ({need - have:.2f} GiB more)")
    ways.append("shard the model over more GPUs (--tensor-parallel-size)")
    said = (f"exceeds the {error.kv_tokens} tokens the KV cache holds" if error.kv_tokens else
            f"needs more KV cache than is available: the longest request that fits is {error.longest_fit} "
            "tokens, as vLLM estimates it" if error.longest_fit else
            f"needs {need:.2f} GiB of KV cache, {have:.2f} GiB is available: a request of at most about "
            f"{limit:,} tokens fits ({error.model_len:,} × {have:.2f} / {need:.2f}, as the need grows with "
            "the length)" if estimated else "needs more KV cache than is available")
    first = f"Set --max-model-len ≤ {limit}" if limit else "Lower --max-model-len"
    return said, f"{first}; or {', or '.join(ways)}."


@rule("context-exceeds-kv", code="CD104", worse=("fit", "lower"), severity="warning", thresholds={"few_requests": 2},
      reads=(F.VllmStartupError, F.VllmMaxConcurrency, F.VllmKVCacheSize, "kv_pool:tokens", "config:max_model_len?", "config:context_len?",
             "pool_cap?", "kv_pool:dtype?", "config:kv_cache_dtype?", "gpu:total_gib?", "config:gpu_memory_utilization?",
             "gpu:identity?"))
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
    static fraction / gpu_memory_utilization, an fp8 KV cache, more TP. Where vLLM refused to
    start, the fp8 cache and the higher utilization are offered only where the sizes its error
    states show they close the gap (an fp8 cache halves the need; the utilization never past
    0.95, never on memory shared with the CPU), and where it states only the sizes, the longest
    length that fits is the context scaled by available / needed.
    """
    error = next((e for e in kb.of(F.VllmStartupError, role=None) if e.reason == "max-seq-len"), None)
    if error is not None:
        # V0 states the pool's tokens; V1 the longest request the memory allows, or only the
        # sizes needed and available
        said, action = _refusal_action(kb, error)
        yield Parts((error,),
                    title="The context length exceeds the KV cache",
                    message=f"vLLM refused to start ({line_ref(error)}): max_model_len {error.model_len} {said}.",
                    action=action, severity="error")
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
