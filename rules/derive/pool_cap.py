"""What caps the KV pool, when a setting rather than memory does."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, rule
from capdiag.rules._common import dsv4_built, line_ref, number_or_text, target

# Settings that fix the pool's size whatever memory is free (SGLang; vLLM).
CAPS = ("max_total_tokens", "kv_cache_memory_bytes", "kv_cache_memory", "num_gpu_blocks_override")


@rule("pool.cap", reads=(F.ServerArgs, F.VllmArgs, F.VllmEngineConfig, F.LaunchCommand, F.DSV4MemoryCalculation,
                         F.DSV4PoolSizes, F.MemoryPoolEnd, "target_rank?", "config:max_running_requests?",
                         "config:context_len?", "config:page_size?"), concludes=("pool_cap",))
def pool_cap(kb):
    """What it concludes: `pool_cap`: the setting that sizes the KV pool instead of the memory
    fraction.

    How: The setting that sizes the KV pool instead of the memory fraction: SGLang's
    `max_total_tokens`, vLLM's `kv_cache_memory_bytes` (`--kv-cache-memory`) or
    `num_gpu_blocks_override`, as the arguments, the engine config or the launch command state them.
    Absent when none is set (None or not printed). DeepSeek-V4's pools are also built for no more
    than `max_running_requests` requests of the whole context: where the rank's last `DSV4 pool
    sizes` line holds fewer tokens than its first (what the memory bought) and about that many
    (within a page), the request limit is the cap.

    Example: `server_args=ServerArgs(…, max_total_tokens=200000, …)`; `DSV4 pool sizes: full=852992,
    …` then `full=32768, …` with max_running_requests=1 and a 32,768-token context."""
    sources = [(f, f.fields) for f in kb.of(F.ServerArgs, F.VllmArgs, F.VllmEngineConfig, role=None)]
    sources += [(f, {k: number_or_text(v) if v is not None else None for k, v in f.args.items()})
                for f in kb.of(F.LaunchCommand, role=None)]
    for fact, fields in sources:
        for name in CAPS:
            value = fields.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                yield Derived("pool_cap", None, {"setting": name, "value": value}, "pool.cap", (fact,),
                              f"{name}={value} ({line_ref(fact)})")
                return
    rank = target(kb)
    built = dsv4_built(kb, rank) if rank is not None else None
    requests, context = kb.get("config", "max_running_requests"), kb.get("config", "context_len")
    if built is None or built[2].full >= built[1].full:
        return
    cut = {"built_tokens": built[2].full, "bought_tokens": built[1].full}
    bought = f"where the memory bought {built[1].full:,} ({line_ref(built[1])})"
    page = kb.value("config", "page_size")
    if requests is not None and context is not None and requests.known and context.known \
            and abs(built[2].full - requests.value * context.value) <= (page if isinstance(page, int) else 0):
        yield Derived("pool_cap", None, {"setting": "max_running_requests", "value": requests.value, **cut}, "pool.cap",
                      (built[1], built[2], requests, context),
                      f"DeepSeek-V4's pools built for {built[2].full:,} tokens ({line_ref(built[2])}) = "
                      f"max_running_requests {requests.value} × context {context.value:,}, {bought}")
        return
    # the log shows the cut but not the setting behind it (an excerpt without server_args)
    yield Derived("pool_cap", None, {"setting": "a limit the log does not name", "value": built[2].full, **cut},
                  "pool.cap", (built[1], built[2]),
                  f"DeepSeek-V4's pools built for {built[2].full:,} tokens ({line_ref(built[2])}), {bought}: "
                  "--max-total-tokens, or max_running_requests × the context")
