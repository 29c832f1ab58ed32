from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules._common import gib, is_vllm, runtime, target
from capdiag.vocabulary import GIB

STEP = 0.01  # the utilization step whose tokens the vLLM advice states


@rule("kv-retractions", code="CD128", worse=("retractions", "higher"), severity="warning",
      reads=("runtime", "kv_pool:bytes_per_token?", "config:mem_fraction_static?", "config:gpu_memory_utilization?",
             "breakdown:free?", "gpu:total_gib?", "target_rank", F.LoadWeightBegin, F.Options, F.TrafficMark))
def kv_retractions(kb):
    """What it checks: the running server retracted requests (SGLang `KV cache pool is full.
    Retract requests. #retracted_reqs: N`, `Decode out of memory happened` before v0.4.8, or its
    `sglang:num_retracted_requests_total` counter) or preempted them (vLLM `Sequence group … is
    preempted by PreemptionMode.RECOMPUTE mode … total_num_cumulative_preemption=N`; V1's stats
    line's `Preemptions: N`, those since the line before, summed — printed by recent releases
    (0.32) when there were any, by early V1 never; or its `vllm:num_preemptions_total` counter).

    Why it matters: a retracted or preempted request loses its KV cache and is computed again
    later: the work is done twice and its latency jumps.

    Example: `KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained:
    646, #new_token_ratio: 0.0980 -> 0.3487`.

    What to do: give the pool the tokens that were missing. Newer SGLang prints how many tokens
    a retraction freed (`#new_tokens_gained`); the largest of them, at the pool's bytes per
    token, is the memory that was short, and SGLang grows the pool by free-before-weights × Δ
    for a fraction raised by Δ — the finding gives that fraction when the start-up left the
    memory free. vLLM does not say how many tokens a preemption lacked: the finding gives what
    each 0.01 of `--gpu-memory-utilization` adds (total × 0.01 at the pool's bytes per token). Else an fp8 KV cache, more GPUs, or fewer concurrent requests
    (`--max-running-requests`, `--max-num-seqs`), or for SGLang a higher
    `--schedule-conservativeness`. Probed twice (`capdiag probe --interval`), the counters also
    say how many happened between the two reads, and how fast.
    """
    d = runtime(kb)
    if d is None:
        return
    v = d.value
    marks = d.detail["marks"]
    counted = (v.get("rates") or {}).get("counters") or {}
    if v["retractions"]:
        first, last = marks.get("first_retraction"), marks.get("last_retraction")
        said = (f"{v['retractions']} request(s) were retracted in {v['retraction_events']} event(s)"
                f"{_span(first, last)}")
        yield Parts((d, first, last),
                    title="The KV pool ran out: requests were retracted",
                    message=said + ". " + _missing(kb, v["retraction_tokens_max"]),
                    action="Give the KV pool the missing tokens (see above), use an fp8 KV cache, or raise "
                           "--schedule-conservativeness / lower --max-running-requests so fewer requests start.",
                    detail={"retractions": v["retractions"], "tokens_missing": v["retraction_tokens_max"]})
    elif counted.get("retractions", {}).get("last"):
        c = counted["retractions"]
        yield Parts((d,),
                    title="The KV pool ran out: requests were retracted",
                    message=f"SGLang counts {c['last']:,} retracted request(s) since it started ({c['metric']})"
                            f"{_between(c, v['rates'])}; the counter does not say how many KV tokens were missing "
                            "(its log's retraction lines do, from v0.5: `#new_tokens_gained`).",
                    action="Give the KV pool more memory (a higher --mem-fraction-static where the start-up left "
                           "memory free, an fp8 KV cache), or raise --schedule-conservativeness / lower "
                           "--max-running-requests so fewer requests start.",
                    detail={"retractions": c["last"], "tokens_missing": None})
    elif v["preemptions"]:
        last, c = marks.get("last_preemption"), counted.get("preemptions")
        if last is not None:
            said = (f"vLLM had preempted {v['preemptions']} request(s) by line {last.evidence.line} (it warns at every "
                    "50th, with the running total)")
        else:
            said = (f"vLLM counts {v['preemptions']} preemption(s) since it started"
                    + (f" ({c['metric']}){_between(c, v['rates'])}" if c else ""))
        yield Parts((d, last),
                    title="The KV pool ran out: requests were preempted",
                    message=said + "; it does not say how many KV tokens were missing." + _vllm_room(kb),
                    action="Raise --gpu-memory-utilization where the start-up left memory free, use an fp8 KV cache, "
                           "or lower --max-num-seqs.",
                    detail={"preemptions": v["preemptions"]})


def _span(first, last) -> str:
    if first is None:
        return ""
    if last is None or last.evidence.line == first.evidence.line:
        return f" (line {first.evidence.line})"
    return f" between line {first.evidence.line} and line {last.evidence.line}"


def _between(c: dict, rates: dict) -> str:
    """How many the counter grew between two scrapes, and how fast, as far as that is known."""
    if c["increase"] is None:
        return f" (rate unknown: {c['unknown_reason']})"
    if c["per_second"] is None:
        return f", {c['increase']:,} between the scrapes (rate unknown: {c['unknown_reason']})"
    return f", {c['increase']:,} in the {rates['seconds']:g} s between the scrapes ({c['per_second']:g}/s)"


def _missing(kb, tokens) -> str:
    """What would have stopped the retractions, as far as the inputs say."""
    if tokens is None or is_vllm(kb):
        return "The lines do not say how many KV tokens were missing."
    if tokens <= 0:
        return "The retractions freed no tokens (#new_tokens_gained: 0): the lines do not say what was missing."
    per_token = kb.value("kv_pool", "bytes_per_token")
    if per_token is None:
        return f"The largest retraction freed {tokens:,} tokens; the pool's bytes per token are unknown."
    short = tokens * per_token / GIB
    said = f"The largest retraction freed {tokens:,} tokens, about {gib(short)} GiB of KV"
    fraction, free = kb.value("config", "mem_fraction_static"), kb.value("breakdown", "free")
    rank = target(kb)
    begin = kb.first(F.LoadWeightBegin, rank) if rank is not None else None
    if fraction is None or begin is None or not begin.avail_gib:
        return said + "."
    if free is None or short >= free:
        return said + f"; the start-up left {gib(free) if free is not None else 'an unknown amount of'} GiB free, " \
                      "so a higher fraction cannot give it."
    suggested = round(fraction + short / begin.avail_gib, 3)
    if not fraction < suggested < 1:
        return said + "; no fraction below 1 gives it."
    return said + (f": mem_fraction_static {fraction} → {suggested} would add it ({fraction} + {gib(short)} / "
                   f"{begin.avail_gib} GiB free before weights; {gib(free)} GiB was free after start-up, "
                   f"{gib(free - short)} would stay free).")


def _vllm_room(kb) -> str:
    """What more --gpu-memory-utilization gives vLLM's pool: total × Δ at the pool's bytes per
    token (nothing where the inputs do not say). How far it can rise they do not say either:
    the logs that count preemptions (V0) print no free memory at start-up."""
    util, total = kb.value("config", "gpu_memory_utilization"), kb.value("gpu", "total_gib")
    per_token = kb.value("kv_pool", "bytes_per_token")
    if util is None or not total or not per_token or util + STEP >= 1:
        return ""
    return (f" Each +{STEP} of gpu_memory_utilization (now {util}) gives the pool about "
            f"{int(total * STEP * GIB / per_token):,} tokens ({gib(total * STEP)} GiB of the {gib(total)} GiB GPU), "
            "as far as the GPU has that memory free.")
