"""The KV pool in detail: its token capacity, the bytes per token it implies, its budget."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import dsv4_built, gib, line_ref, target
from capdiag.vocabulary import implied_bytes_per_token


def main_kv_line(lines, budget):
    """The full-attention pool's line among a rank's KV lines: the `Full` label (v0.5.17+), else
    the line whose #tokens is max_total_num_tokens, else the largest — before v0.5.17 a hybrid
    sliding-window model prints the smaller SWA pool first, unlabelled."""
    real = [f for f in lines if f.tokens is not None and not f.va_upper_bound]
    full = [f for f in real if f.label == "Full"]
    matching = [f for f in real if budget is not None and f.tokens == budget.max_total_num_tokens]
    return (full or matching or sorted(real, key=lambda f: -f.tokens) or [None])[0]


@rule("kv-pool.tokens", frameworks=("sglang",),
      reads=(F.TokenBudget, F.KVCacheAllocated, F.DSV4MemoryCalculation, F.DSV4PoolSizes, F.MemoryPoolEnd,
             "target_rank"),
      concludes=("kv_pool:tokens",))
def tokens(kb):
    """What it concludes: `kv_pool.tokens`: the token capacity of the target KV pool on the rank.

    How: `#tokens` of the full-attention KV line (hybrid sliding-window models print a smaller SWA
    pool too), else `max_total_num_tokens`, else the `full` count DeepSeek-V4's pools were built
    with (the last `DSV4 pool sizes` line: a limit may have cut them below `full_token`), else
    its `full_token`. Under DP attention it is per DP worker.

    Example: `KV Cache is allocated. #tokens: 415615, …`."""
    rank = target(kb)
    if rank is None:
        return
    budget = kb.first(F.TokenBudget, role=None)
    kv = main_kv_line(kb.of(F.KVCacheAllocated, rank=rank), budget)
    dsv4 = kb.first(F.DSV4MemoryCalculation, rank)
    built = dsv4_built(kb, rank)
    if kv is not None:
        yield Derived("kv_pool", "tokens", kv.tokens, "kv-pool.tokens", (kv,), f"#tokens ({line_ref(kv)})")
    elif budget is not None:
        yield Derived("kv_pool", "tokens", budget.max_total_num_tokens, "kv-pool.tokens", (budget,),
                      f"max_total_num_tokens ({line_ref(budget)})")
    elif built is not None:
        yield Derived("kv_pool", "tokens", built[2].full, "kv-pool.tokens", (built[0], built[2]),
                      f"DSV4 pool sizes full ({line_ref(built[2])})")
    elif dsv4 is not None and dsv4.full_token is not None:
        yield Derived("kv_pool", "tokens", dsv4.full_token, "kv-pool.tokens", (dsv4,),
                      f"DSV4 full_token ({line_ref(dsv4)})")
    else:
        yield Derived("kv_pool", "tokens", Unknown("no pool token count is stated"), "kv-pool.tokens")


@rule("kv-pool.bytes-per-token", frameworks=("sglang",),
      reads=(F.DSV4MemoryCalculation, "target_rank", "kv_pool:tokens", "breakdown:kv_cache"),
      concludes=("kv_pool:bytes_per_token",))
def bytes_per_token(kb):
    """What it concludes: `kv_pool.bytes_per_token`: the bytes one token's KV takes in the pool, as the
    log implies.

    How: Bytes per token the log implies: KV bytes / tokens. The sizes are printed in GiB with two
    decimals, so the figure carries that rounding (±0.005 GiB); the pool also holds one padding
    page. DeepSeek-V4 prints `bytes_per_full_token` itself.

    Example: 50.74 GiB × 2^30 / 415615 tokens = 131087 B (printed rounding: 131074–131100 B)."""
    rank = target(kb)
    tokens_d, kv_d = kb.get("kv_pool", "tokens"), kb.get("breakdown", "kv_cache")
    if rank is None or tokens_d is None or kv_d is None:
        return
    dsv4 = kb.first(F.DSV4MemoryCalculation, rank)
    if dsv4 is not None and dsv4.bytes_per_full_token is not None:
        yield Derived("kv_pool", "bytes_per_token", dsv4.bytes_per_full_token, "kv-pool.bytes-per-token", (dsv4,),
                      f"bytes_per_full_token printed ({line_ref(dsv4)}); compressed layers included")
        return
    if not (tokens_d.known and kv_d.known and kv_d.detail.get("status") == "measured" and tokens_d.value):
        yield Derived("kv_pool", "bytes_per_token", Unknown("needs a printed KV size and token count"),
                      "kv-pool.bytes-per-token", (tokens_d, kv_d))
        return
    cell = implied_bytes_per_token(kv_d.value, tokens_d.value)
    yield Derived("kv_pool", "bytes_per_token", cell.bytes, "kv-pool.bytes-per-token", (kv_d, tokens_d), cell.formula,
                  {"low": cell.low, "high": cell.high})


@rule("kv-pool.budget", frameworks=("sglang",),
      reads=(F.MemoryProfiling, F.LoadWeightBegin, F.LoadWeightEnd, F.MemoryPoolEnd, "target_rank", "config:mem_fraction_static"),
      concludes=("kv_pool:budget_gib", "kv_pool:headroom_gib"))
def budget(kb):
    """What it concludes: `kv_pool.budget_gib` and `kv_pool.headroom_gib`: the memory SGLang sized the
    KV pool from, and what the fraction leaves for activations and graphs.

    How: The KV budget SGLang sized the pool from: free memory after weights minus free memory
    before weights × (1 − mem_fraction_static). SGLang takes both readings as the minimum over
    ranks; the log prints this rank's own, so the figure is approximate. Also the headroom it leaves
    for activations and graphs: free before weights × (1 − mem_fraction_static). The DeepSeek-V4
    branch prints the budget itself (`Memory profiling: … rest_memory`).

    Example: 63.44 − 78.43 × (1 − 0.838) = 50.73 GiB; headroom 78.43 × 0.162 = 12.71 GiB."""
    rank = target(kb)
    mfs = kb.get("config", "mem_fraction_static")
    if rank is None or mfs is None:
        return
    profiling = kb.first(F.MemoryProfiling, rank)
    if profiling is not None and profiling.rest_memory_gib is not None:
        yield Derived("kv_pool", "budget_gib", profiling.rest_memory_gib, "kv-pool.budget", (profiling,),
                      f"rest_memory printed by `Memory profiling:` ({line_ref(profiling)})")
        if profiling.total_gpu_memory_gib is not None and profiling.mem_fraction_static is not None:
            yield Derived("kv_pool", "headroom_gib",
                          gib(profiling.total_gpu_memory_gib * (1 - profiling.mem_fraction_static)),
                          "kv-pool.budget", (profiling,),
                          f"{profiling.total_gpu_memory_gib} × (1 − {profiling.mem_fraction_static}) GiB "
                          f"({line_ref(profiling)})")
        return
    begin = kb.first(F.LoadWeightBegin, rank)
    pool = kb.first(F.MemoryPoolEnd, rank)
    # the pool is sized after every weight load that precedes it (the draft's too, v0.5.14+)
    ends = [e for e in kb.of(F.LoadWeightEnd, rank=rank, role=None) if e.avail_gib is not None
            and (pool is None or e.evidence.line < pool.evidence.line)]
    if not mfs.known:
        for key in ("budget_gib", "headroom_gib"):
            yield Derived("kv_pool", key, Unknown(f"needs mem_fraction_static: {mfs.value.reason}"),
                          "kv-pool.budget", (mfs,))
        return
    if begin is None or not ends:
        for key in ("budget_gib", "headroom_gib"):
            yield Derived("kv_pool", key, Unknown("needs the free memory before and after the weights load"),
                          "kv-pool.budget", (mfs,))
        return
    after = ends[-1]
    headroom = gib(begin.avail_gib * (1 - mfs.value))
    yield Derived("kv_pool", "headroom_gib", headroom, "kv-pool.budget", (begin, mfs),
                  f"{begin.avail_gib} × (1 − {mfs.value}) GiB")
    yield Derived("kv_pool", "budget_gib", gib(after.avail_gib - begin.avail_gib * (1 - mfs.value)),
                  "kv-pool.budget", (begin, after, mfs),
                  f"{after.avail_gib} − {begin.avail_gib} × (1 − {mfs.value}) GiB")
