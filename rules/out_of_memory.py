"""out-of-memory (CD102)."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Finding, rule
from capdiag.rules._common import line_ref


@rule("out-of-memory", code="CD102", severity="error")
def out_of_memory(kb):
    """What it checks: a CUDA out-of-memory error, SGLang's "Not enough memory" refusal, or
    "Loaded weights leave no GPU memory for the KV cache".

    Why it matters: the direction of the fix depends on the phase, and the two directions are
    opposite. When the KV pool cannot be sized (the refusal lines, or an OOM before the pool
    exists), the static fraction is too *small* for weights plus pool. When graph capture or
    serving runs out, the static fraction is too *large*: the pool took the headroom that
    activations and graphs need.

    Example: `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 384.00 MiB. GPU 0 has
    a total capacity of 23.56 GiB of which 338.75 MiB is free.` after `Capture piecewise CUDA
    graph begin`.

    What to do: pool phase → raise `--mem-fraction-static` (or more TP, a shorter context,
    fp8 KV). Capture or serving → lower `--mem-fraction-static`, or shrink
    `--cuda-graph-max-bs` / disable the piecewise graph.
    """
    errors = kb.of(F.OutOfMemory, F.NotEnoughMemory, role=None)
    if not errors:
        return
    first = errors[0]
    before = [f for f in kb.facts if f.PHASE and f.evidence.line < first.evidence.line]
    phase = before[-1].PHASE if before else "init"
    last_step = before[-1] if before else None
    refusal = isinstance(first, F.NotEnoughMemory)
    pool_missing = not kb.of(F.MemoryPoolEnd, role=None)
    if refusal or (pool_missing and phase in ("init", "weights", "kv_pool")):
        direction = "raise"
        why = "the KV pool could not be sized under the static fraction"
    else:
        direction = "lower"
        why = "the pool was allocated; capture or serving then ran out of the headroom left"
    detail = ""
    if isinstance(first, F.OutOfMemory) and first.tried_to_allocate_mib is not None:
        detail = (f" PyTorch tried to allocate {first.tried_to_allocate_mib} MiB with {first.free_mib} MiB free"
                  + (f" of {first.total_capacity_gib} GiB" if first.total_capacity_gib is not None else "") + ".")
    yield Finding("finding", "out-of-memory", None, "out-of-memory",
                  tuple(p for p in (last_step, *errors) if p is not None),
                  f"Out of memory after the {phase.replace('_', ' ')} phase ({line_ref(first)}): {why}.{detail}",
                  severity="error", title=f"Out of memory during start-up ({phase.replace('_', ' ')})",
                  action=f"{direction.capitalize()} --mem-fraction-static"
                  + (" (or add TP, shorten the context, use an fp8 KV cache)." if direction == "raise" else
                     " (or lower --cuda-graph-max-bs, or disable the piecewise graph)."),
                  detail={"direction": direction, "phase": phase})
