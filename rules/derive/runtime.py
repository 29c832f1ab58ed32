"""What the running server's own traffic lines say, per rank (the report's `runtime`)."""
from __future__ import annotations

import math
from typing import Any, Optional

from capdiag import facts as F
from capdiag.engine import Derived, rule
from capdiag.rules._common import line_ref

FULL_AT = 0.9  # usage from which the pool counts as full for queueing
AT_100 = 1.0  # printed as 1.00 (SGLang) or 100.0% (vLLM)


def percentile(samples: list[tuple[float, int]], share: float) -> Optional[float]:
    """Nearest-rank percentile of (value, count) pairs sorted by value."""
    total = sum(n for _, n in samples)
    if not total:
        return None
    rank, seen = max(1, math.ceil(share * total - 1e-9)), 0
    for value, n in samples:
        seen += n
        if seen >= rank:
            return value
    return samples[-1][0]


def _share(part: int, whole: int) -> Optional[float]:
    return round(part / whole, 4) if whole else None


def summarize(s: F.TrafficSummary, limit: Optional[int], pool_tokens: Optional[int]) -> dict[str, Any]:
    """The runtime summary of one rank's traffic (the JSON `runtime.ranks[]` entry, without evidence)."""
    with_usage: dict[float, int] = {}
    queued = queued_full = queued_limit = queued_unknown = at_limit = 0
    for usage, is_queued, running, n in s.samples:
        if usage is not None:
            with_usage[usage] = with_usage.get(usage, 0) + n
        at_limit += n if limit and running >= limit else 0
        if is_queued:
            queued += n
            if usage is None:
                queued_unknown += n
            elif usage >= FULL_AT:
                queued_full += n
            elif limit and running >= limit:
                queued_limit += n
    counted = sum(with_usage.values())
    ordered = sorted(with_usage.items())
    lines_with_state = sum(n for *_, n in s.samples)
    causes = {"memory": queued_full, "request_limit": queued_limit,
              "other": queued - queued_full - queued_limit - queued_unknown}
    mean_context = round(s.context_tokens / s.context_requests) if s.context_requests else None
    return {
        "lines": s.lines, "first_time": s.first_time or None, "last_time": s.last_time or None,
        "kv_usage": None if not counted else {
            "peak": ordered[-1][0], "p50": percentile(ordered, 0.5), "p90": percentile(ordered, 0.9),
            "p99": percentile(ordered, 0.99),
            "share_at_or_above_90": _share(sum(n for u, n in ordered if u >= FULL_AT), counted),
            "share_at_100": _share(sum(n for u, n in ordered if u >= AT_100), counted)},
        "running_requests": {"peak": max((r for _, _, r, _ in s.samples), default=None), "limit": limit,
                             "share_at_limit": _share(at_limit, lines_with_state) if limit else None},
        "queued_requests": {"peak": s.peak_queue, "lines_queued": queued, "queued_while_kv_full": queued_full,
                            "queued_at_request_limit": queued_limit,
                            "queued_other": causes["other"], "queued_kv_unknown": queued_unknown},
        "queueing_bound_by": max(causes, key=causes.get) if any(causes.values()) else None,
        "retractions": s.retractions if s.framework == "sglang" else None,
        "retraction_events": s.retraction_events if s.framework == "sglang" else None,
        "retraction_tokens_max": s.retraction_tokens_max,
        "preemptions": s.preemptions,
        "throughput": {"min": s.throughput[0], "max": s.throughput[1]},
        "observed_lengths": {
            "mean_prompt_tokens": round(s.prompt_tokens / s.prompt_requests) if s.prompt_requests else None,
            "mean_context_tokens": mean_context,
            "concurrency_at_mean_context": pool_tokens // mean_context if pool_tokens and mean_context else None},
        "series": [{"time": t, "kv_usage": u if u >= 0 else None, "running": r, "queued": q}
                   for t, u, r, q in s.series],
    }


def merged(summaries: list[F.TrafficSummary]) -> F.TrafficSummary:
    """All ranks' lines as one summary: counts add, peaks and ranges take the extremes, the
    series joins by time (a point's figures are the largest any rank printed then)."""
    samples: dict[tuple, int] = {}
    for s in summaries:
        for usage, queued, running, n in s.samples:
            samples[(usage, queued, running)] = samples.get((usage, queued, running), 0) + n
    points: dict[str, tuple] = {}
    for s in summaries:
        for t, u, r, q in s.series:
            old = points.get(t)
            points[t] = (t, u, r, q) if old is None else (t, max(old[1], u), max(old[2], r), max(old[3], q))
    lows = [s.throughput[0] for s in summaries if s.throughput[0] is not None]
    highs = [s.throughput[1] for s in summaries if s.throughput[1] is not None]
    preempted = [s.preemptions for s in summaries if s.preemptions is not None]
    tokens = [s.retraction_tokens_max for s in summaries if s.retraction_tokens_max is not None]
    first = min(summaries, key=lambda s: s.evidence.line)
    return F.TrafficSummary(
        evidence=first.evidence, framework=first.framework, lines=sum(s.lines for s in summaries),
        first_time=min((s.first_time for s in summaries if s.first_time), default=""),
        last_time=max((s.last_time for s in summaries if s.last_time), default=""),
        samples=tuple(sorted((*k, n) for k, n in samples.items())), peak_queue=max(s.peak_queue for s in summaries),
        throughput=(min(lows) if lows else None, max(highs) if highs else None),
        context_tokens=sum(s.context_tokens for s in summaries), context_requests=sum(s.context_requests for s in summaries),
        prompt_tokens=sum(s.prompt_tokens for s in summaries), prompt_requests=sum(s.prompt_requests for s in summaries),
        retractions=sum(s.retractions for s in summaries), retraction_events=sum(s.retraction_events for s in summaries),
        retraction_tokens_max=max(tokens) if tokens else None, preemptions=sum(preempted) if preempted else None,
        series=tuple(points[t] for t in sorted(points)))


@rule("runtime.summary", reads=(F.TrafficSummary, F.TrafficMark, "concurrency?", "config:max_running_requests?",
                                "kv_pool:tokens?"),
      concludes=("runtime",))
def summary(kb):
    """Sums each rank's request-time lines (SGLang `Prefill batch` / `Decode batch` and
    retractions, vLLM's periodic `Avg prompt throughput` metrics and preemptions): the span, KV
    usage peak and percentiles (fractions 0–1; vLLM's percent / 100), the share of lines at or
    above 90 % and at 100 %, peak running requests against the request limit, why requests
    queued (the pool ≥ 90 % full: memory; running at the limit with room: the request limit;
    else scheduling or compute), retractions or preemptions, the throughput range, and the
    request lengths the lines show. Shares are of traffic lines, not of wall time: SGLang prints
    a line per batch logged, vLLM one every 10 s."""
    # the request limit as the concurrency table applies it (per DP worker), else as configured
    rows = [c for c in kb.topic("concurrency") if c.detail.get("request_limit") is not None]
    limit_d = rows[0] if rows else kb.get("config", "max_running_requests")
    tokens_d = kb.get("kv_pool", "tokens")
    limit = (rows[0].detail["request_limit"] if rows else limit_d.value if limit_d is not None and limit_d.known
             else None)
    pool = tokens_d.value if tokens_d is not None and tokens_d.known else None
    marks = kb.of(F.TrafficMark, role=None)
    used = tuple(d for d in (limit_d, tokens_d) if d is not None and d.known)
    summaries = kb.of(F.TrafficSummary, role=None)
    groups = [(s.rank.key(), s, [s]) for s in summaries]
    if len(summaries) > 1:
        groups.append(("all", merged(summaries), summaries))
    for key, s, parts in groups:
        mine = [m for m in marks if any(m.summary_line == p.evidence.line and m.rank == p.rank for p in parts)]
        value = summarize(s, limit, pool)
        usage = value["kv_usage"]
        formula = (f"{s.lines} traffic lines from {s.first_time or '?'} to {s.last_time or '?'} ({line_ref(s)} on)"
                   + (f"; KV usage peak {usage['peak']}, p50 {usage['p50']}" if usage else "; no KV usage printed"))
        yield Derived("runtime", key, value, "runtime.summary", (*parts, *mine) + used, formula,
                      detail={"marks": _marks(mine), "rank": None if key == "all" else s.rank, "parts": parts})


def _marks(marks: list[F.TrafficMark]) -> dict[str, F.TrafficMark]:
    """One line per mark: across ranks, the earliest first_*, the latest last_*, the largest peak_*."""
    chosen: dict[str, F.TrafficMark] = {}
    for m in sorted(marks, key=lambda m: m.evidence.line):
        old = chosen.get(m.mark)
        if old is None or m.mark.startswith("last") or (m.mark.startswith("peak") and m.value > old.value):
            chosen[m.mark] = m
    return chosen
