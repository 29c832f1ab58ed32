from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, cannot_judge, rule
from capdiag.rules._common import is_vllm
from capdiag.vocabulary import element_size


@rule("fp8-kv-opportunity", code="CD114", severity="info", thresholds={"max_full_requests": 4},
      reads=("kv_pool:dtype", "kv_pool:tokens?", "kv_pool:theoretical_bytes_per_token?", F.Options,
             "config:max_model_len?", "config:context_len?", "pool_cap?"))
def fp8_kv_opportunity(kb, t):
    """What it checks: the KV cache is stored in a 16-bit type (bf16/fp16) and capacity is what
    binds: fewer than `max_full_requests` requests of the full context fit at once. A pool that
    already holds many full-length requests needs no trade of accuracy for room.

    Why it matters: an fp8 KV cache halves the bytes per token, so the same pool holds about
    twice the tokens and, where tokens bind, about twice the concurrent requests. fp8 KV can
    cost accuracy (more so without calibrated scales); evaluate before deploying.

    Example: `KV Cache is allocated. dtype: torch.bfloat16, #tokens: 415615`.

    Only for a pool that was sized: a start-up that stopped before gets no capacity tips. Never
    where a setting caps the pool (`pool-capped` says which: `--max-total-tokens`, vLLM's
    `--kv-cache-memory`, `--num-gpu-blocks-override`): the cap, not the bytes per token, sets the
    tokens, so fp8 would hold no more of them.

    What to do: where more full-length requests must run at once, try `--kv-cache-dtype
    fp8_e4m3` (SGLang) or `--kv-cache-dtype fp8` (vLLM) and check accuracy on your evaluation set.
    """
    dtype = kb.get("kv_pool", "dtype")
    tokens = kb.get("kv_pool", "tokens")
    if dtype is None or not dtype.known:
        yield cannot_judge(("the KV cache dtype", dtype))
        return
    if element_size(dtype.value) != 2:
        return
    if tokens is None or not tokens.known:
        return  # the pool was never sized (a start-up that stopped before): no capacity to double
    if kb.get("pool_cap") is not None:
        return
    if kb.get("kv_pool", "theoretical_bytes_per_token") is not None and \
            not kb.get("kv_pool", "theoretical_bytes_per_token").known:
        return  # compressed KV (DeepSeek-V4): the halving does not follow
    context = kb.value("config", "max_model_len") or kb.value("config", "context_len")
    if not isinstance(context, int) or context <= 0:
        yield cannot_judge(("the context length, to judge whether capacity binds", None))
        return
    if tokens.value // context >= t["max_full_requests"]:
        return  # room for several full-length requests already
    # what binds is full-length requests (above): the gain is told at the full context
    full = tokens.value // context
    projected = (f": about {tokens.value * 2:,} tokens instead of {tokens.value:,}, and {(tokens.value * 2) // context} "
                 f"request(s) of the full {context:,}-token context at once instead of {full}")
    flag = "--kv-cache-dtype fp8" if is_vllm(kb) else "--kv-cache-dtype fp8_e4m3"
    yield Parts((dtype, tokens),
                title="An fp8 KV cache would roughly double token capacity",
                message=f"The KV cache is {dtype.value} (2 bytes per element); fp8 would roughly double "
                        f"capacity{projected}.",
                action=f"Try {flag}; check accuracy first (fp8 KV without calibrated scales can cost quality).")
