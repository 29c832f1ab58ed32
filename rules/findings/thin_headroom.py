from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, cannot_judge, rule
from capdiag.rules._common import is_vllm, knob


@rule("thin-headroom", code="CD110", worse=("free_gib", "lower"), severity="warning", thresholds={"min_free_gib": 1.0},
      reads=(F.Options, "breakdown:budget?", "breakdown:free?", "gpu:total_gib"))
def thin_headroom(kb, t):
    """What it checks: the memory left free at the end of start-up (SGLang: free after graph
    capture; vLLM: total − total × gpu_memory_utilization) is below `min_free_gib` GiB.

    Why it matters: prefill of a long prompt, a burst of requests or a sampler workspace needs
    transient memory beyond the static pool. With little left, the server OOMs at run time,
    not at start-up — the failure users report as "it started fine, then crashed".

    Example: `max_total_num_tokens=…, available_gpu_mem=0.81 GB`.

    What to do: lower the static fraction (SGLang `--mem-fraction-static`, vLLM
    `--gpu-memory-utilization`) a few hundredths, or lower `--chunked-prefill-size` /
    `--max-num-batched-tokens`.
    """
    if is_vllm(kb):
        budget = kb.get("breakdown", "budget")
        total = kb.get("gpu", "total_gib")
        if budget is None or total is None or not budget.known or not total.known:
            yield cannot_judge(("vLLM's memory budget", budget), ("the GPU total", total))
            return
        free, premises, what = round(total.value - budget.value, 2), (budget, total), "outside vLLM's budget"
    else:
        row = kb.get("breakdown", "free")
        if row is None or not row.known:
            yield cannot_judge(("the memory free at the end of start-up", row))
            return
        free, premises, what = row.value, (row,), "free after start-up"
    if free >= t["min_free_gib"]:
        return
    yield Parts(premises,
                title=f"Only {free} GiB of headroom after start-up",
                message=f"Only {free} GiB is {what} (threshold {t['min_free_gib']} GiB): long prefills and bursts will "
                        "run out of memory at run time.",
                action=f"Lower {knob(kb)} by a few hundredths, or lower the chunked-prefill / batched-token size.",
                detail={"free_gib": free})
