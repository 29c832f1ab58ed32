from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules.findings._advice import POOL_MIN_SHARE, round_up
from capdiag.rules._common import gib, is_vllm, target
from capdiag.vocabulary import GIB


@rule("weights-exceed-budget", code="CD129", severity="error",
      reads=(F.LoadWeightBegin, F.LoadWeightEnd, "breakdown:weights?", "breakdown:budget?", "breakdown:activation?",
             "breakdown:framework?", "gpu:total_gib?", "config:mem_fraction_static?", "target_rank?",
             "config:max_model_len?", "kv_pool:theoretical_bytes_per_token?", F.OutOfMemory, F.Options))
def weights_exceed_budget(kb):
    """What it checks: the weights alone are larger than the memory the static fraction grants —
    vLLM: `Model loading took W GiB` above total × gpu_memory_utilization; SGLang: the weights
    above free-before-weights × mem_fraction_static (then the KV pool would be negative).

    Why it matters: no KV cache can be sized, so the start-up fails ("No available memory for
    the cache blocks", "Not enough memory") or profiling runs out; lowering anything else does
    not help.

    Example: `Model loading took 14.19 GiB` on a 15.47 GiB GPU with gpu_memory_utilization 0.7
    (a budget of 10.83 GiB).

    What to do: raise the fraction to at least what the weights (plus, for vLLM, the printed
    activation peak and non-torch memory — or, where profiling died before printing its peak,
    the allocation that ran out, a floor of it — and the KV cache of one request of
    `max_model_len`, which vLLM needs to start, where the bytes a token takes are known) need,
    when that leaves at least 5% for the KV cache; otherwise no fraction fits: more
    tensor/pipeline parallelism or quantized weights.
    """
    rank = target(kb)
    if rank is None:
        return
    if is_vllm(kb):
        weights, budget, total = kb.get("breakdown", "weights"), kb.get("breakdown", "budget"), kb.get("gpu", "total_gib")
        if not all(d is not None and d.known for d in (weights, budget, total)) or weights.value <= budget.value:
            return
        extras = [d for d in (kb.get("breakdown", "activation"), kb.get("breakdown", "framework")) if d is not None and d.known]
        need = weights.value + sum(d.value for d in extras)
        names = ["weights"] + [("activation peak" if d.key == "activation" else "non-torch") for d in extras]
        premises = (weights, budget, total, *extras)
        asked = [o for o in kb.of(F.OutOfMemory, role=None) if o.tried_to_allocate_mib]
        if not any(d.key == "activation" for d in extras) and asked:
            # profiling died before printing its peak: what it asked for is the least that peak is
            floor = max(asked, key=lambda o: o.tried_to_allocate_mib)
            need += floor.tried_to_allocate_mib / 1024
            names.append("the allocation that ran out")
            premises += (floor,)
        length, cell = kb.get("config", "max_model_len"), kb.get("kv_pool", "theoretical_bytes_per_token")
        if length is not None and cell is not None and length.known and cell.known and isinstance(length.value, int):
            need += length.value * cell.value / GIB
            names.append(f"one {length.value:,}-token request's KV")
            premises += (length, cell)
        knob, base = "gpu_memory_utilization", total.value
        arithmetic = f"({' + '.join(names)} {gib(need)} GiB) / total {base} GiB"
    else:
        begin, mfs = kb.first(F.LoadWeightBegin, rank), kb.get("config", "mem_fraction_static")
        end = next((e for e in kb.of(F.LoadWeightEnd, rank=rank) if e.avail_gib is not None), None)
        if begin is None or end is None or begin.avail_gib is None or mfs is None or not mfs.known:
            return
        used = gib(begin.avail_gib - end.avail_gib)
        allowed = gib(begin.avail_gib * mfs.value)
        if used <= allowed:
            return
        weights, budget, need, base = used, allowed, used, begin.avail_gib
        knob, premises = "mem_fraction_static", (begin, end, mfs)
        arithmetic = f"weights {used} GiB / free before weights {base} GiB"
    if base <= 0:  # no fraction of nothing: a zero total or free memory says nothing to raise
        return
    w = weights if isinstance(weights, float) else weights.value
    b = budget if isinstance(budget, float) else budget.value
    least = round_up(need / base)
    if least < 1 - POOL_MIN_SHARE:
        action = (f"Raise {knob} to at least {least} ({arithmetic} = {round(need / base, 3)}; leave room for the KV "
                  f"cache above that), or use more tensor/pipeline parallelism or quantized weights.")
    else:
        action = (f"No {knob} fits: {arithmetic} = {round(need / base, 3)}, which leaves under {POOL_MIN_SHARE:.0%} "
                  "for the KV cache. Use more tensor/pipeline parallelism, quantized weights, or a larger GPU.")
    yield Parts(premises,
                title="The weights alone exceed the memory budget",
                message=f"The weights alone ({gib(w)} GiB) exceed the {gib(b)} GiB that {knob} grants; no memory is "
                        "left for the KV cache.",
                action=action,
                detail={"weights_gib": gib(w), "budget_gib": gib(b),
                        "least": least if least < 1 - POOL_MIN_SHARE else None})
