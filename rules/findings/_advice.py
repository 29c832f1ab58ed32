"""The value an out-of-memory finding suggests, by the direction of the fix, with its arithmetic.

Every fraction suggested lies strictly in (0, 1); when none would help, no value is given and
the arithmetic says why.
"""
from __future__ import annotations

import math
from typing import Optional

from capdiag import facts as F
from capdiag.engine import Knowledge
from capdiag.rules._common import gib, target


# The smallest share of the base a KV pool may get for a fraction to count as helping.
POOL_MIN_SHARE = 0.05


def failed(failure, causes: tuple[str, ...]) -> dict:
    """The root cause a figured finding names for the start-up (its line, cause, phase, rank), so
    that one finding says the failure: startup-failed steps aside for it."""
    if failure is None or failure.value not in causes:
        return {}
    v = failure.detail
    return {"cause": v["name"], "line": v["line"], "rank": v["rank"], "failure_phase": v["phase"]}


def round_down(x: float) -> float:
    """A fraction rounded down to the hundredth, so that it is no more than x."""
    return math.floor(x * 100 + 1e-9) / 100


def round_up(x: float) -> float:
    """A fraction rounded up to the hundredth, so that it is enough."""
    return math.ceil(x * 100 - 1e-9) / 100


def _arg(kb: Knowledge, name: str) -> Optional[int]:
    for a in kb.of(F.VllmArgs, role=None):
        value = a.fields.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return value
    return None


def advised(kb: Knowledge, direction: str, error: F.Fact, vllm: bool) -> tuple[str, str, Optional[float]]:
    """(" to X" for the action, " (arithmetic)", X or None). When no value helps, the first is
    None and the second says why and what would."""
    knob = "gpu_memory_utilization" if vllm else "mem_fraction_static"
    fraction = kb.value("config", knob)
    if direction == "lower":
        return _lower(kb, error, vllm, knob, fraction)
    if direction == "raise":
        return _raise(kb, vllm, knob)
    if direction in ("profile", "sampler"):
        name = "max_num_batched_tokens" if direction == "profile" else "max_num_seqs"
        stated = _arg(kb, name)
        if stated is None:
            return "", f" ({name} is not stated in the log: halve the value in use.)", None
        return f" to about {stated // 2}", f" (half of the stated {name}={stated}.)", None
    return "", "", None


def _lower(kb, error, vllm, knob, fraction) -> tuple[str, str, Optional[float]]:
    if not isinstance(error, F.OutOfMemory) or error.tried_to_allocate_mib is None or error.free_mib is None:
        return "", "", None
    short = max(error.tried_to_allocate_mib - error.free_mib, 0) / 1024
    rank = target(kb)
    begin = kb.first(F.LoadWeightBegin, rank) if rank is not None and not vllm else None
    total = kb.value("gpu", "total_gib") or error.total_capacity_gib
    base, what = ((begin.avail_gib, "free before weights") if begin is not None and begin.avail_gib
                  else (total, "the GPU total") if total else (None, ""))
    if base is None or fraction is None:
        return "", (f" The allocation lacked {gib(short)} GiB ({error.tried_to_allocate_mib} MiB asked, "
                    f"{error.free_mib} MiB free): lower {knob} by at least that much of the GPU."), None
    suggested = round_down(fraction - short / base - 0.01)
    arithmetic = (f" ({fraction} − lacking {gib(short)} GiB / {what} {base} GiB − 0.01 = {suggested}; the failed "
                  f"allocation asked {error.tried_to_allocate_mib} MiB with {error.free_mib} MiB free, and later "
                  "ones may need more.)")
    if not 0 < suggested < fraction:
        return None, (f"No lower {knob} is left ({fraction} − {gib(short)} / {base} ≤ 0): lower --cuda-graph-max-bs "
                      "or the batch sizes, or add GPUs."), None
    return f" to ≤ {suggested}", arithmetic, suggested


def _raise(kb, vllm, knob) -> tuple[str, str, Optional[float]]:
    """The fraction at which the KV pool stops being empty (weights and what profiling measured,
    over the base the fraction multiplies); above it the pool grows by base × Δ."""
    rank = target(kb)
    if vllm:
        total = kb.get("gpu", "total_gib")
        parts = [(name, kb.get("breakdown", key)) for name, key in
                 (("weights", "weights"), ("activation peak", "activation"), ("non-torch", "framework"))]
        known = [(n, d.value) for n, d in parts if d is not None and d.known]
        if total is None or not total.known or not known or known[0][0] != "weights":
            return "", "", None
        need, base, what = sum(v for _, v in known), total.value, "total"
        names = " + ".join(f"{n} {v}" for n, v in known)
    else:
        begin = kb.first(F.LoadWeightBegin, rank) if rank is not None else None
        end = next((e for e in kb.of(F.LoadWeightEnd, rank=rank) if e.avail_gib is not None), None) \
            if rank is not None else None
        if begin is None or end is None or not begin.avail_gib:
            return "", "", None
        need, base, what = begin.avail_gib - end.avail_gib, begin.avail_gib, "free before weights"
        names = f"weights (free before {begin.avail_gib} − after {end.avail_gib})"
    empty = need / base
    if empty >= 1 - POOL_MIN_SHARE:  # a pool of under 5% of the base, if the rest fit at all
        return None, (f"No {knob} helps: {names} = {gib(need)} GiB is {round(empty, 3)} of the {what} {base} GiB; "
                      "add tensor/pipeline parallelism or quantize the weights."), None
    suggested = round_up(empty + POOL_MIN_SHARE)
    return (f" to about {suggested}",
            f" (the pool is empty at {names} = {gib(need)} GiB / {what} {base} GiB = {round(empty, 3)}; at "
            f"{suggested} it gets about {gib((suggested - empty) * base)} GiB, less what graphs and activations take.)",
            suggested)
