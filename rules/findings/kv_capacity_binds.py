from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules._common import knob, observed_concurrency, runtime


@rule("kv-capacity-binds", code="CD126", worse=("queued_while_kv_full", "higher"), severity="warning", thresholds={"min_share_full": 0.05},
      reads=("runtime", F.Options))
def kv_capacity_binds(kb, t):
    """What it checks: under real traffic the KV pool was at or above 90 % full while requests
    waited, in at least `min_share_full` of the traffic lines.

    Why it matters: the pool, not the request limit or the GPU's speed, is what keeps those
    requests waiting; they queue (and SGLang retracts, vLLM preempts, running ones) until tokens
    free up. More requests allowed would only queue longer.

    Example: `Decode batch, #running-req: 64, #token: 90000, token usage: 0.95, cuda graph: True,
    gen throughput (token/s): 2500.00, #queue-req: 12`.

    What to do: give the pool more memory (a higher static fraction where the start-up left
    memory free, an fp8 KV cache, more GPUs or TP), or send shorter requests; the start-up
    sections above say how much each would add. Where the inputs show the real request lengths
    (SGLang's decode lines, a server's length histograms) the finding says how many requests of
    that length the pool holds.
    """
    d = runtime(kb)
    if d is None:
        return
    q = d.value["queued_requests"]
    lines = d.value["lines"]
    if not lines or q["queued_while_kv_full"] / lines < t["min_share_full"]:
        return
    usage = d.value["kv_usage"]
    observed = observed_concurrency(d.value)
    yield Parts((d,),
                title="KV capacity binds under real traffic",
                message=f"In {q['queued_while_kv_full']} of {lines} traffic lines requests waited while the KV pool "
                        f"was at or above 90 % (peak {round(100 * usage['peak'])} %, p90 {round(100 * usage['p90'])} "
                        f"%, at 100 % in {round(100 * usage['share_at_100'], 1)} % of lines; up to {q['peak']} "
                        "requests queued)."
                        + (f" At {observed[1]} the pool holds {observed[0]:,} requests at once; up to "
                           f"{d.value['running_requests']['peak']} ran." if observed else ""),
                action=f"Give the KV pool more memory ({knob(kb)} where the start-up left memory free, an fp8 KV "
                       f"cache, more GPUs), or expect requests to wait at this load.",
                detail={"queued_while_kv_full": q["queued_while_kv_full"], "lines": lines})
