"""observed-lengths (CD131)."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules._common import observed_concurrency, runtime


@rule("observed-lengths", code="CD131", severity="info",
      reads=("runtime", F.Options, F.TrafficMark, F.LengthHistogram, F.RequestLengths))
def observed_lengths(kb):
    """What it checks: the request lengths the server really served, where its own lines or
    metrics give them — SGLang's decode lines (`#token` / `#running-req`: the KV a running
    request held), a server's length histograms (`vllm:request_prompt_tokens` and
    `vllm:request_generation_tokens`, SGLang's equivalents: the mean finished request, prompt +
    generated), vLLM's request-logging lines (`Received request …: prompt: …, params:
    SamplingParams(… max_tokens=N …), prompt_token_ids: [...]`: each request's prompt and the most
    it may generate) — and how many such requests the KV pool holds at once.

    Why it matters: the concurrency table answers for the lengths it was given (`--token-lengths`,
    4096/6144/8192 by default), not for the traffic. At the observed lengths the pool may hold
    far more requests than the request limit lets run, or far fewer than the deployment assumes.

    Example: `Decode batch, #running-req: 48, #token: 393840, token usage: 0.98, …` — 8,205
    tokens per running request: a pool of 400,000 tokens holds 48 such requests.

    What to do: size the request limit and the deployment against this figure, and see the
    concurrency table at it with `--token-lengths N`. Percentiles from a histogram are known only
    to their bucket; a running request holds less KV than its final length, and one that stops
    before max_tokens less than its budget. An id list `--max-log-len` may have cut gives no length.
    """
    d = runtime(kb)
    if d is None:
        return
    observed = observed_concurrency(d.value)
    if observed is None:
        return
    holds, at = observed
    lengths, run = d.value["observed_lengths"], d.value["running_requests"]
    limit = run["limit"]
    spread = "; ".join(f"{kind} mean {h['mean']:,} tokens, p90 {_bucket(h['p90'])}"
                       for kind, h in (("prompts", lengths["prompt_length"]), ("generated", lengths["generation_length"]))
                       if h and h["mean"] is not None)
    logged = lengths["request_log"]
    if logged and not spread:
        spread = "; ".join(f"{kind} mean {t['mean']:,}, p50 {t['p50']:,}, p90 {t['p90']:,}, max {t['max']:,} tokens"
                           for kind, t in (("prompts", logged["prompt_tokens"]), ("max_tokens", logged["max_tokens"]))
                           if t["mean"] is not None) + f" over {logged['requests']:,} logged requests"
    said = (f"At {at} the KV pool holds {holds:,} requests at once"
            + (f"; the request limit lets {min(holds, limit):,} run" if limit else "")
            + f"; up to {run['peak']} ran at a time." + (f" ({spread}.)" if spread else ""))
    length = (lengths["mean_context_tokens"] if lengths["concurrency_at_mean_context"] else
              lengths["mean_request_tokens"] if lengths["concurrency_at_mean_request"] else
              lengths["mean_request_budget_tokens"])
    yield Parts((d, *kb.of(F.LengthHistogram, role=None), *kb.of(F.RequestLengths, role=None)),
                title="Concurrency at the request lengths the server served", message=said,
                action=f"Size the request limit and the deployment against this; --token-lengths {length} shows the "
                       "concurrency table at that length.",
                detail={"concurrent": holds, "request_tokens": length})


def _bucket(b) -> str:
    if b is None:
        return "unknown"
    return f"over {b['above']:,}" if b["at_most"] is None else f"{b['above']:,}–{b['at_most']:,}"
