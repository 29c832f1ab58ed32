"""vLLM's KV token capacity and how many requests of a given length fit at once."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import context_of, line_ref, request_lengths
from capdiag.rules.derive.concurrency import refused
from capdiag.vocabulary import implied_bytes_per_token


def release(version) -> tuple:
    """(major, minor) of a version string such as `0.10.1.1` or `0.15.0rc2.dev46+g…`; () if none."""
    parts = []
    for piece in str(version or "").split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isascii() and ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits or len(digits) > 6:  # no release is numbered past six digits
            break
        parts.append(int(digits))
    return tuple(parts)


@rule("vllm.kv-pool.tokens", frameworks=("vllm",),
      reads=(F.VllmKVCacheSize, F.VllmStartupError, F.VllmGpuBlocks, F.VllmHybridBlockSize, "config:block_size", "config:framework_version"),
      concludes=("kv_pool:tokens",))
def tokens(kb):
    """What it concludes: `kv_pool.tokens`: the token capacity of vLLM's KV cache.

    How: `GPU KV cache size: N tokens`. Up to 0.11.0 the engine prints one such line per worker and
    uses the smallest, so the minimum is the capacity; older engines print `# GPU blocks` instead,
    which gives tokens only with a stated block size (the max-seq-len start-up error states the
    token count too). From 0.21 the figure is derived from the concurrency, and for hybrid models it
    can exceed what the pool holds.

    Example: `GPU KV cache size: 97,728 tokens`."""
    sizes = kb.of(F.VllmKVCacheSize, role=None)
    refused = next((e for e in kb.of(F.VllmStartupError, role=None) if e.kv_tokens is not None), None)
    blocks = kb.first(F.VllmGpuBlocks, role=None)
    block_size = kb.value("config", "block_size")
    if sizes:
        least = min(sizes, key=lambda s: s.tokens)
        note = (f"the least of {len(sizes)} per-worker lines (the engine uses the minimum)"
                if len(sizes) > 1 else "printed by the engine")
        hybrid = kb.first(F.VllmHybridBlockSize, role=None)
        version = kb.value("config", "framework_version")
        premises = tuple(sizes) + ((hybrid,) if hybrid else ())
        if hybrid is not None and release(version) >= (0, 21):
            note += ("; the model is hybrid and from 0.21 this figure is derived from the concurrency, so it can "
                     f"exceed what the attention pool holds ({line_ref(hybrid)})")
        yield Derived("kv_pool", "tokens", least.tokens, "vllm.kv-pool.tokens", premises,
                      f"GPU KV cache size {least.tokens:,} tokens ({line_ref(least)}), {note}",
                      {"hybrid": hybrid is not None})
    elif refused is not None:
        yield Derived("kv_pool", "tokens", refused.kv_tokens, "vllm.kv-pool.tokens", (refused,),
                      f"the tokens the KV cache holds, as the start-up error states ({line_ref(refused)})")
    elif blocks is not None and isinstance(block_size, int):
        value = blocks.blocks * block_size
        yield Derived("kv_pool", "tokens", value, "vllm.kv-pool.tokens", (blocks, kb.get("config", "block_size")),
                      f"{blocks.blocks} blocks × block_size {block_size} ({line_ref(blocks)})")
    else:
        reason = ("the log prints blocks, not tokens, and no block size" if blocks is not None
                  else "the log prints no KV cache size")
        yield Derived("kv_pool", "tokens", Unknown(reason), "vllm.kv-pool.tokens", (blocks,) if blocks else ())


@rule("vllm.kv-pool.bytes-per-token", frameworks=("vllm",),
      reads=("kv_pool:tokens", "breakdown:kv_cache"),
      concludes=("kv_pool:bytes_per_token",))
def bytes_per_token(kb):
    """What it concludes: `kv_pool.bytes_per_token`: the bytes one token's KV takes, as the log
    implies.

    How: Bytes per token the log implies: the available KV memory / the token capacity (GiB printed
    to two decimals, so ±0.005 GiB of rounding).

    Example: `Available KV cache memory: 34.64 GiB` and `GPU KV cache size: 1,135,072 tokens`: 34.64
    × 2^30 / 1135072 ≈ 32768 B."""
    tokens_d, kv_d = kb.get("kv_pool", "tokens"), kb.get("breakdown", "kv_cache")
    if tokens_d is None or kv_d is None:
        return
    if not (tokens_d.known and kv_d.known and tokens_d.value):
        yield Derived("kv_pool", "bytes_per_token", Unknown("needs a KV memory figure and a token count"),
                      "vllm.kv-pool.bytes-per-token", (tokens_d, kv_d))
        return
    cell = implied_bytes_per_token(kv_d.value, tokens_d.value)
    yield Derived("kv_pool", "bytes_per_token", cell.bytes, "vllm.kv-pool.bytes-per-token", (kv_d, tokens_d),
                  cell.formula, {"low": cell.low, "high": cell.high})


@rule("vllm.concurrency", frameworks=("vllm",),
      reads=(F.Options, "kv_pool:tokens", "config:max_running_requests", "config:max_model_len?",
             "config:context_len?"),
      concludes=("concurrency",))
def concurrency(kb):
    """What it concludes: `concurrency.<L>`: how many requests of L tokens fit in vLLM's KV cache at
    once.

    How: For each request length L (and max_model_len itself where some L is longer: a longer row
    keeps its arithmetic and says such a request is refused): token limit = KV tokens // L; request limit = max_num_seqs where
    the log states it (its default depends on release and GPU, so it is not assumed); concurrent
    requests = the smaller, or the token limit as an upper bound when the request limit is unknown.
    vLLM's own `Maximum concurrency` line is shown beside it as a check.

    Example: 97,728 tokens // 8192 = 11 requests; vLLM prints `Maximum concurrency for 8,192 tokens
    per request: 11.93x`."""
    lengths = request_lengths(kb)
    tokens_d = kb.get("kv_pool", "tokens")
    seqs, context = kb.get("config", "max_running_requests"), context_of(kb)
    if tokens_d is None:
        return
    for length in lengths:
        if not tokens_d.known:
            yield Derived("concurrency", length, Unknown(tokens_d.value.reason), "vllm.concurrency", (tokens_d,))
            continue
        token_limit = tokens_d.value // length
        requests = seqs.value if seqs is not None and seqs.known else None
        value = min(token_limit, requests) if requests is not None else token_limit
        formula = (f"min({tokens_d.value} // {length} = {token_limit}, max_num_seqs {requests})" if requests is not None
                   else f"{tokens_d.value} // {length} = {token_limit}; max_num_seqs not stated, so an upper bound")
        detail = {"token_limit": token_limit, "request_limit": requests,
                  "binding": ("tokens" if requests is None or token_limit < requests else
                              "requests" if requests < token_limit else "both"),
                  "upper_bound": requests is None}
        formula, detail = refused(formula, detail, length, context)
        yield Derived("concurrency", length, value, "vllm.concurrency",
                      tuple(p for p in (tokens_d, seqs) if p is not None), formula, detail)


@rule("vllm.concurrency-check", frameworks=("vllm",),
      reads=(F.VllmMaxConcurrency, "kv_pool:tokens"),
      concludes=("concurrency_check",))
def concurrency_check(kb):
    """What it concludes: `concurrency_check`: whether vLLM's own maximum-concurrency figure agrees
    with capdiag's.

    How: vLLM's own `Maximum concurrency for N tokens per request: X` beside capdiag's figure at N:
    KV tokens / N must give X (to two decimals), else the two disagree and the report says so.

    Example: `Maximum concurrency for 8,192 tokens per request: 11.93x` against 97,728 / 8192 =
    11.93."""
    tokens_d = kb.get("kv_pool", "tokens")
    stated = [s for s in kb.of(F.VllmMaxConcurrency, role=None) if s.tokens > 0]  # "for 0 tokens" checks nothing
    if tokens_d is None or not tokens_d.known or not stated:
        return
    least = min(stated, key=lambda s: s.x)
    computed = round(tokens_d.value / least.tokens, 2)
    agree = abs(computed - least.x) <= 0.011
    yield Derived("concurrency_check", None, {"tokens": least.tokens, "vllm_x": least.x, "capdiag_x": computed,
                                               "agree": agree},
                  "vllm.concurrency-check", (least, tokens_d),
                  f"{tokens_d.value} / {least.tokens} = {computed} vs vLLM's {least.x}x ({line_ref(least)})"
                  + ("" if agree else ": they disagree (hybrid or sliding-window pools, or a later resize)"))
