"""kv-retractions (CD128)."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import rule
from capdiag.rules._common import finding, gib, is_vllm, runtime, target
from capdiag.vocabulary import GIB


@rule("kv-retractions", code="CD128", severity="warning",
      reads=("runtime", "kv_pool:bytes_per_token?", "config:mem_fraction_static?", "breakdown:free?",
             "target_rank", F.LoadWeightBegin, F.Options, F.TrafficMark),  # the marks come with the runtime summary
      concludes=("finding:kv-retractions",))
def kv_retractions(kb):
    """What it checks: the running server retracted requests (SGLang `KV cache pool is full.
    Retract requests. #retracted_reqs: N`, `Decode out of memory happened` before v0.4.8) or
    preempted them (vLLM `Sequence group … is preempted by PreemptionMode.RECOMPUTE mode …
    total_num_cumulative_preemption=N`).

    Why it matters: a retracted or preempted request loses its KV cache and is computed again
    later: the work is done twice and its latency jumps.

    Example: `KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained:
    646, #new_token_ratio: 0.0980 -> 0.3487`.

    What to do: give the pool the tokens that were missing. Newer SGLang prints how many tokens
    a retraction freed (`#new_tokens_gained`); the largest of them, at the pool's bytes per
    token, is the memory that was short, and SGLang grows the pool by free-before-weights × Δ
    for a fraction raised by Δ — the finding gives that fraction when the start-up left the
    memory free. Else an fp8 KV cache, more GPUs, or fewer concurrent requests
    (`--max-running-requests`, `--max-num-seqs`), or for SGLang a higher
    `--schedule-conservativeness`.
    """
    d = runtime(kb)
    if d is None:
        return
    v = d.value
    marks = d.detail["marks"]
    if v["retractions"]:
        first, last = marks.get("first_retraction"), marks.get("last_retraction")
        said = (f"{v['retractions']} request(s) were retracted in {v['retraction_events']} event(s)"
                f"{_span(first, last)}")
        yield finding("kv-retractions", (d, first, last), said + ". " + _missing(kb, v["retraction_tokens_max"]),
                      severity="warning", title="The KV pool ran out: requests were retracted",
                      action="Give the KV pool the missing tokens (see above), use an fp8 KV cache, or raise "
                             "--schedule-conservativeness / lower --max-running-requests so fewer requests start.",
                      detail={"retractions": v["retractions"], "tokens_missing": v["retraction_tokens_max"]})
    elif v["preemptions"]:
        last = marks.get("last_preemption")
        said = (f"vLLM had preempted {v['preemptions']} request(s) by line {last.evidence.line} (it warns at every "
                "50th, with the running total)" if last is not None else
                f"vLLM counts {v['preemptions']} preemption(s) since it started")
        yield finding("kv-retractions", (d, last),
                      said + "; it does not say how many KV tokens were missing.",
                      severity="warning", title="The KV pool ran out: requests were preempted",
                      action="Raise --gpu-memory-utilization where the start-up left memory free, use an fp8 KV cache, "
                             "or lower --max-num-seqs.",
                      detail={"preemptions": v["preemptions"]})


def _span(first, last) -> str:
    if first is None:
        return ""
    if last is None or last.evidence.line == first.evidence.line:
        return f" (line {first.evidence.line})"
    return f" between line {first.evidence.line} and line {last.evidence.line}"


def _missing(kb, tokens) -> str:
    """What would have stopped the retractions, as far as the inputs say."""
    if tokens is None or is_vllm(kb):
        return "The lines do not say how many KV tokens were missing."
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
    if suggested >= 1:
        return said + "; no fraction below 1 gives it."
    return said + f": mem_fraction_static {fraction} → {suggested} would add it ({gib(free)} GiB was free after start-up)."
