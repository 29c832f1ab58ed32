from __future__ import annotations

from capdiag.engine import Parts, rule

# the conclusions drawn from mem_fraction_static (rules/kv_pool.py's budget)
_NEEDS_IT = ("budget_gib", "headroom_gib")


@rule("mem-fraction-unstated", code="CD103", severity="info", frameworks=("sglang",),
      reads=("config:mem_fraction_static", *(f"kv_pool:{key}" for key in _NEEDS_IT)))
def mem_fraction_unstated(kb):
    """What it checks: the log does not state SGLang's `mem_fraction_static` (no intact
    `server_args` line, no `Memory profiling:` line).

    Why it matters: SGLang chooses the fraction at start-up from the GPU's total memory and
    the configuration; 0.88 is only its fallback when it cannot read the total. Assuming any
    value would invent the KV budget and the headroom left for activations and graphs.

    Example: an excerpt that starts at `Load weight begin`, or `server_args=ServerArgs(model_path='…', ...)`.

    What to do: include the `server_args=` line in the log you analyse, or pass the value the
    server ran with. Until then capdiag reports the KV budget and the headroom as unknown.
    """
    mfs = kb.get("config", "mem_fraction_static")
    if mfs is None or mfs.known:
        return
    blocked = [d for d in (kb.get("kv_pool", key) for key in _NEEDS_IT)
               if d is not None and not d.known and mfs in d.premises]
    names = sorted({f"{d.topic}.{d.key}" for d in blocked})
    yield Parts((mfs, *blocked),
                title="mem_fraction_static is not stated in the log",
                message=f"{mfs.value.reason}; not computed because of it: {', '.join(names) or 'nothing else'}.",
                action="Include the server_args line (or its mem_fraction_static) in the log analysed.",
                detail={"not_computed": names})
