"""What caps the KV pool, when a setting rather than memory does."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, rule
from capdiag.rules._common import line_ref, number_or_text

# Settings that fix the pool's size whatever memory is free (SGLang; vLLM).
CAPS = ("max_total_tokens", "kv_cache_memory_bytes", "kv_cache_memory", "num_gpu_blocks_override")


@rule("pool.cap", reads=(F.ServerArgs, F.VllmArgs, F.VllmEngineConfig, F.LaunchCommand), concludes=("pool_cap",))
def pool_cap(kb):
    """What it concludes: `pool_cap`: the setting that sizes the KV pool instead of the memory
    fraction.

    How: The setting that sizes the KV pool instead of the memory fraction: SGLang's
    `max_total_tokens`, vLLM's `kv_cache_memory_bytes` (`--kv-cache-memory`) or
    `num_gpu_blocks_override`, as the arguments, the engine config or the launch command state them.
    Absent when none is set (None or not printed).

    Example: `server_args=ServerArgs(…, max_total_tokens=200000, …)`."""
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
