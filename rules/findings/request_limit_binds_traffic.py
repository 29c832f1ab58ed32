from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules._common import is_vllm, observed_concurrency, runtime


@rule("request-limit-binds-traffic", code="CD127", worse=("queued_at_request_limit", "higher"), severity="warning", thresholds={"min_share_queued": 0.2},
      reads=("runtime", F.Options))
def request_limit_binds_traffic(kb, t):
    """What it checks: under real traffic requests waited while the running requests were at the
    request limit (`max_running_requests`, vLLM `max_num_seqs`) and the KV pool had room (below
    90 %), in at least `min_share_queued` of the lines with requests waiting.

    Why it matters: memory for more requests was there; the limit kept them waiting.

    Example: `Decode batch, #running-req: 48, #token: 61000, token usage: 0.15, cuda graph: True,
    gen throughput (token/s): 3100.00, #queue-req: 30` with `max_running_requests=48`.

    What to do: raise `--max-running-requests` (vLLM `--max-num-seqs`) — towards the number of
    requests the pool holds at the observed lengths when the inputs show them (SGLang's decode
    lines, a server's length histograms) — and watch
    activation memory and latency.
    """
    d = runtime(kb)
    if d is None:
        return
    q, run = d.value["queued_requests"], d.value["running_requests"]
    if not run["limit"] or not q["lines_queued"] or q["queued_at_request_limit"] / q["lines_queued"] < t["min_share_queued"]:
        return
    flag = "--max-num-seqs" if is_vllm(kb) else "--max-running-requests"
    usage = d.value["kv_usage"]
    seen = f"KV usage p50 {round(100 * usage['p50'])} %, peak {round(100 * usage['peak'])} %" if usage else "KV usage not printed"
    observed = observed_concurrency(d.value)
    toward = (f" toward {observed[0]}, the requests the pool holds at {observed[1]},"
              if observed and observed[0] > run["limit"] else "")
    yield Parts((d,),
                title="The request limit, not KV memory, keeps requests waiting",
                message=f"In {q['queued_at_request_limit']} of {q['lines_queued']} lines with requests waiting, "
                        f"{run['limit']} requests were running (the limit) while the KV pool was below 90 % ({seen}).",
                action=f"Raise {flag}{toward} and watch activation memory and latency.",
                detail={"queued_at_request_limit": q["queued_at_request_limit"], "limit": run["limit"]})
