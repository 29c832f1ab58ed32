"""What the running server's own traffic lines say, per rank (the report's `runtime`)."""
from __future__ import annotations

import bisect
import functools
import math
from itertools import accumulate
from typing import Any, Optional, Sequence

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


@functools.lru_cache(maxsize=16)
def _tally(samples: tuple) -> dict[str, Any]:
    """A rank's samples counted once (summarize() runs for every projection of a report): the
    (usage, lines) pairs by usage; lines with a state; queued lines, those with no usage printed
    and those at usage >= FULL_AT; the running counts printed, ascending, and for each the lines
    printing at least it, and of them those queued below FULL_AT with a usage."""
    with_usage: dict[float, int] = {}
    by_running: dict[int, list[int]] = {}
    queued = queued_full = queued_unknown = lines = 0
    for usage, is_queued, running, n in samples:
        lines += n
        if usage is not None:
            with_usage[usage] = with_usage.get(usage, 0) + n
        counts = by_running.setdefault(running, [0, 0])
        counts[0] += n
        if is_queued:
            queued += n
            if usage is None:
                queued_unknown += n
            elif usage >= FULL_AT:
                queued_full += n
            else:
                counts[1] += n
    running = sorted(by_running)
    # suffix sums: the lines at or above each running count
    at_least = list(accumulate(reversed([by_running[r] for r in running]), lambda a, b: [a[0] + b[0], a[1] + b[1]],
                               initial=[0, 0]))[::-1]
    return {"usage": sorted(with_usage.items()), "lines": lines, "queued": queued, "queued_unknown": queued_unknown,
            "queued_full": queued_full, "peak_running": running[-1] if running else None, "running": running,
            "at_least": at_least}


def summarize(s: F.TrafficSummary, limit: Optional[int], pool_tokens: Optional[int],
              counters: Sequence[F.CounterReadings] = (), histograms: Sequence[F.LengthHistogram] = (),
              chunk: Optional[int] = None, page: Optional[int] = None,
              requests: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The runtime summary of one rank's traffic (the JSON `runtime.ranks[]` entry, without
    evidence); from a probe also its counters' rates and the request lengths its histograms hold;
    `requests` what vLLM's request-logging lines show (request_log())."""
    tally = _tally(s.samples)
    at_limit, queued_limit = tally["at_least"][bisect.bisect_left(tally["running"], limit)] if limit else (0, 0)
    queued, queued_full, queued_unknown = tally["queued"], tally["queued_full"], tally["queued_unknown"]
    ordered, lines_with_state = tally["usage"], tally["lines"]
    counted = sum(n for _, n in ordered)
    causes = {"memory": queued_full, "request_limit": queued_limit,
              "other": queued - queued_full - queued_limit - queued_unknown}
    mean_context = round(s.context_tokens / s.context_requests) if s.context_requests else None
    return {
        "lines": s.lines, "first_time": s.first_time or None, "last_time": s.last_time or None,
        "readings": s.readings, "seconds": s.seconds,
        "kv_usage": None if not counted else {
            "peak": ordered[-1][0], "p50": percentile(ordered, 0.5), "p90": percentile(ordered, 0.9),
            "p99": percentile(ordered, 0.99),
            "share_at_or_above_90": _share(sum(n for u, n in ordered if u >= FULL_AT), counted),
            "share_at_100": _share(sum(n for u, n in ordered if u >= AT_100), counted)},
        "running_requests": {"peak": tally["peak_running"], "limit": limit,
                             "share_at_limit": _share(at_limit, lines_with_state) if limit else None},
        # no line printed a queue (retraction lines alone): its peak is not known to be 0
        "queued_requests": {"peak": s.peak_queue if lines_with_state else None, "lines_queued": queued, "queued_while_kv_full": queued_full,
                            "queued_at_request_limit": queued_limit,
                            "queued_other": causes["other"], "queued_kv_unknown": queued_unknown},
        "queueing_bound_by": max(causes, key=causes.get) if any(causes.values()) else None,
        "retractions": s.retractions if s.framework == "sglang" else None,
        "retraction_events": s.retraction_events if s.framework == "sglang" else None,
        "retraction_tokens_max": s.retraction_tokens_max,
        "preemptions": s.preemptions,
        "preemptions_unknown_reason": _no_preemption_count(s),
        "throughput": {"min": s.throughput[0], "max": s.throughput[1]},
        "observed_lengths": observed_lengths(s, pool_tokens, histograms, chunk, page, requests),
        "rates": rates(counters),
        "series": [{"time": t, "kv_usage": u if u >= 0 else None, "running": r, "queued": q}
                   for t, u, r, q in s.series],
    }


def observed_lengths(s: F.TrafficSummary, pool_tokens: Optional[int], histograms: Sequence[F.LengthHistogram],
                     chunk: Optional[int] = None, page: Optional[int] = None,
                     requests: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The request lengths the inputs show: SGLang's prefill lines (new + cached tokens per new
    sequence, `chunk` and `page` the chunked-prefill budget and page size in effect) and decode
    lines (tokens per running request), a server's length histograms (one observation per
    finished request: mean exact, percentiles to the bucket), or vLLM's request-logging lines
    (each request's prompt ids and max_tokens: `requests`)."""
    mean_context = round(s.context_tokens / s.context_requests) if s.context_requests else None
    prompt, generation = (distribution([h for h in histograms if h.kind == kind]) for kind in ("prompt", "generation"))
    per_entry = round(s.prompt_tokens / s.prompt_requests) if s.prompt_requests else None
    mean_prompt, why = prefill_mean(s, per_entry, chunk, page)
    if mean_prompt is None and prompt is not None:
        mean_prompt, why = prompt["mean"], None
    logged = requests["prompt_tokens"] if requests else None
    if mean_prompt is None and logged is not None and logged["requests"]:
        mean_prompt, why = logged["mean"], logged["unknown_reason"]
    budget = requests["mean_budget_tokens"] if requests else None
    # both histograms observe each finished request once: the means add up to the mean request
    same = prompt is not None and generation is not None and prompt["requests"] == generation["requests"]
    request = prompt["mean"] + generation["mean"] if same and prompt["mean"] is not None else None
    return {
        "mean_prompt_tokens": mean_prompt,
        "prompt_tokens_per_prefill_entry": per_entry,
        "mean_prompt_unknown_reason": why,
        "mean_context_tokens": mean_context,
        "concurrency_at_mean_context": pool_tokens // mean_context if pool_tokens and mean_context else None,
        "prompt_length": prompt, "generation_length": generation,
        "mean_request_tokens": request,
        "concurrency_at_mean_request": pool_tokens // request if pool_tokens and request else None,
        "request_log": requests,
        "mean_request_budget_tokens": budget,
        "concurrency_at_request_budget": pool_tokens // budget if pool_tokens and budget else None}


def request_log(logged: Sequence[F.RequestLengths], max_log_len: tuple[bool, Optional[int], str]) -> Optional[dict[str, Any]]:
    """What vLLM's request-logging lines show: each request's prompt (its token ids counted) and
    max_tokens. `max_log_len` is (stated, value, where): vLLM cuts a printed id list to
    max_log_len ids without a mark, so a list of that many ids is only a lower bound, and where
    the setting is not stated no list can be taken whole."""
    if not logged:
        return None
    exact, bounded, budgets = _Tally(), _Tally(), _Tally()
    stated, cut_to, where = max_log_len
    truncated = line_cut = 0
    for r in logged:
        for ids, n in r.prompt_lengths:
            whole = not stated or cut_to is None or ids < cut_to
            (exact if whole else bounded).add(ids, n)
            truncated += 0 if whole else n
        for ids, n in r.prompt_cut:
            bounded.add(ids, n)
            line_cut += n
        for tokens, n in r.max_tokens:
            budgets.add(tokens, n)
    requests = sum(r.requests for r in logged)
    not_printed = sum(r.prompt_not_printed for r in logged)
    printed = exact.count + bounded.count
    why = None
    if printed and not stated:
        why = ("the log does not state max_log_len: vLLM cuts each printed id list to it without a mark, so no "
               "list can be taken whole")
        for ids, n in exact.values.items():
            bounded.add(ids, n)
        exact = _Tally()
    elif bounded.count:
        why = "; ".join(part for part in (
            f"{truncated} of {printed} id lists hold max_log_len={cut_to} ids ({where}), as many as vLLM prints"
            if truncated else "",
            f"{line_cut} request line(s) were cut before their id list ended" if line_cut else "") if part) + (
            ": those prompts are known only to be at least that long")
    elif not printed:
        why = ("the request lines print no prompt token ids (vLLM 0.10.2+ prints them only at DEBUG level: "
               "VLLM_LOGGING_LEVEL=DEBUG)" if not not_printed else "the request lines print no prompt token ids")
    floor = min(bounded.values) if bounded.count else None
    prompt = {"requests": printed, "exact": exact.count, "not_printed": not_printed, "at_least": floor,
              "mean": exact.mean() if printed and not bounded.count else None,
              "mean_at_least": (exact.total + bounded.total) // printed if printed and bounded.count else None,
              **{name: exact.at(share, printed, floor) for name, share in _SHARES},
              "max": exact.top() if printed and not bounded.count else None, "unknown_reason": why}
    set_tokens = {"requests": budgets.count, "not_set": sum(r.max_tokens_not_set for r in logged),
                  "mean": budgets.mean(), **{name: budgets.at(share, budgets.count, None) for name, share in _SHARES},
                  "max": budgets.top()}
    # prompt + max_tokens is the most KV a request can come to hold: both known for every request
    whole = prompt["mean"] is not None and set_tokens["mean"] is not None and printed == budgets.count == requests
    return {"lines": sum(r.lines for r in logged), "requests": requests, "unread": sum(r.unread for r in logged),
            "max_log_len": cut_to if stated else None, "max_log_len_stated": stated,
            "prompt_tokens": prompt, "max_tokens": set_tokens,
            "mean_budget_tokens": prompt["mean"] + set_tokens["mean"] if whole else None}


_SHARES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


class _Tally:
    """Counts of token lengths: exact percentiles over (length, requests) pairs."""

    def __init__(self, values: Optional[dict[int, int]] = None) -> None:
        self.values: dict[int, int] = dict(values or {})

    def add(self, length: int, n: int) -> None:
        self.values[length] = self.values.get(length, 0) + n

    @property
    def count(self) -> int:
        return sum(self.values.values())

    @property
    def total(self) -> int:
        return sum(k * n for k, n in self.values.items())

    def mean(self) -> Optional[int]:
        return round(self.total / self.count) if self.count else None

    def top(self) -> Optional[int]:
        return max(self.values) if self.values else None

    def at(self, share: float, of: int, floor: Optional[int]) -> Optional[int]:
        """The nearest-rank percentile among `of` requests of which these are the exact ones and
        the rest are at least `floor` long: known while it falls below every such one."""
        if not of:
            return None
        wanted, seen = max(1, math.ceil(share * of - 1e-9)), 0
        for length in sorted(self.values):
            seen += self.values[length]
            if seen >= wanted:
                return length if floor is None or length < floor else None
        return None


def prefill_mean(s: F.TrafficSummary, per_entry: Optional[int], chunk: Optional[int],
                 page: Optional[int]) -> tuple[Optional[int], Optional[str]]:
    """Whether SGLang's prefill lines give the mean prompt. Σ (#new-token + #cached-token) counts
    each prompt token once, but #new-seq counts a request once per prefill batch it is in: a
    prompt split by chunked prefill (one chunk per batch) counts once per chunk, a retracted
    request again when it is prefilled anew. A split starts only where a batch's new tokens
    reach the chunk budget (to within a page), so lines that never come that close split
    nothing. Else only tokens per prefill entry are known, at most the mean prompt."""
    if per_entry is None:
        return None, None
    if s.retractions:
        return None, "retracted requests are prefilled again and counted again"
    if chunk is not None and chunk <= 0:
        return per_entry, None  # chunked prefill off
    if chunk is None:
        return None, "chunked_prefill_size is not stated: a prompt split into chunks counts once per chunk"
    if page and s.prefill_max_new_tokens is not None and s.prefill_max_new_tokens <= chunk - page:
        return per_entry, None
    reached = ("these lines do not show whether any prompt was split" if s.prefill_max_new_tokens is None else
               "page_size is not stated" if not page else
               f"a prefill batch reached the chunk budget ({s.prefill_max_new_tokens} new tokens)")
    return None, f"chunked prefill (chunked_prefill_size={chunk}) counts a split prompt once per chunk, and {reached}"


def distribution(histograms: Sequence[F.LengthHistogram]) -> Optional[dict[str, Any]]:
    """One length histogram (several ranks' added where their buckets agree): the requests, the
    mean, and p50/p90/p99 as the bucket each falls in (`above` < length ≤ `at_most`)."""
    if not histograms or any(h.buckets and [b for b, _ in h.buckets] != [b for b, _ in histograms[0].buckets]
                             for h in histograms):
        return None
    count = sum(h.count for h in histograms)
    total = sum(h.total for h in histograms)
    cumulative = [(bound, sum(h.buckets[i][1] for h in histograms)) for i, (bound, _) in enumerate(histograms[0].buckets)]

    def at(share: float) -> Optional[dict[str, Optional[float]]]:
        if not count:
            return None
        wanted, below = max(1, math.ceil(share * count - 1e-9)), 0.0
        for bound, seen in cumulative:
            if seen >= wanted:
                return {"above": _whole(below), "at_most": None if math.isinf(bound) else _whole(bound)}
            below = bound
        return None

    longest, before = None, 0.0
    for bound, seen in cumulative:
        longest, before = (bound if seen > before else longest), seen
    return {"metric": histograms[0].metric, "requests": _whole(count),
            "mean": round(total / count) if count else None,
            "p50": at(0.5), "p90": at(0.9), "p99": at(0.99),
            "longest_at_most": None if longest is None or math.isinf(longest) else _whole(longest)}


def rates(counters: Sequence[F.CounterReadings]) -> Optional[dict[str, Any]]:
    """The counters' increase from the first scrape to the last, per second (several ranks'
    added); None without counters (a log). A counter that went down was reset: the server
    restarted between the scrapes."""
    if not counters:
        return None
    seconds, why = counters[0].seconds, counters[0].unknown_reason
    sums: dict[str, list] = {}
    for c in counters:
        for name, metric, first, last in c.readings:
            entry = sums.setdefault(name, [metric, 0.0, 0.0])
            entry[1] += first
            entry[2] += last
    out: dict[str, Any] = {}
    for name, (metric, first, last) in sums.items():
        grew = last - first
        reason = ("the counter went down between the scrapes: the server restarted" if grew < 0 else
                  None if seconds else why)
        out[name] = {"metric": metric, "first": _whole(first), "last": _whole(last),
                     "increase": _whole(grew) if grew >= 0 and counters[0].scrapes > 1 else None,
                     "per_second": round(grew / seconds, 3) if seconds and grew >= 0 else None,
                     "unknown_reason": reason}
    # vLLM counts queried and hit tokens; SGLang prompt tokens and those its radix cache served
    queries, hits = ((out.get("prefix_cache_queries"), out.get("prefix_cache_hits")) if "prefix_cache_queries" in out
                     else (out.get("prompt_tokens"), out.get("cached_tokens")))
    hit_rate = (round(hits["increase"] / queries["increase"], 4) if queries and hits and queries["increase"]
                and hits["increase"] is not None else None)
    return {"scrapes": counters[0].scrapes, "seconds": seconds, "unknown_reason": why, "counters": out,
            "prefix_cache_hit_rate": hit_rate}


def _no_preemption_count(s: F.TrafficSummary) -> Optional[str]:
    if s.framework != "vllm" or s.preemptions is not None:
        return None
    if s.evidence.line == F.INPUT_LINE:
        return "the scrape holds no vllm:num_preemptions_total"
    return ("vLLM's log states the count only at every 50th preemption (V0) or not at all (V1); its /metrics "
            "counts them (capdiag probe)")


def _whole(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def _most(a, b):
    """The larger of two figures, either of which may be unprinted (None): an engine of a
    scrape may give no KV gauge while another does."""
    return b if a is None else a if b is None else max(a, b)


def _sample_order(sample: tuple) -> tuple:
    usage = sample[0]
    return (usage is not None, usage or 0.0, *sample[1:])


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
            points[t] = (t, u, r, q) if old is None else (t, _most(old[1], u), _most(old[2], r), _most(old[3], q))
    lows = [s.throughput[0] for s in summaries if s.throughput[0] is not None]
    highs = [s.throughput[1] for s in summaries if s.throughput[1] is not None]
    preempted = [s.preemptions for s in summaries if s.preemptions is not None]
    tokens = [s.retraction_tokens_max for s in summaries if s.retraction_tokens_max is not None]
    first = min(summaries, key=lambda s: s.evidence.line)
    # a probe's readings are named (a file name need not sort in time): the fullest rank's names
    named = max((s for s in summaries if s.readings), key=lambda s: s.readings, default=None)
    return F.TrafficSummary(
        evidence=first.evidence, framework=first.framework, lines=sum(s.lines for s in summaries),
        first_time=named.first_time if named else min((s.first_time for s in summaries if s.first_time), default=""),
        last_time=named.last_time if named else max((s.last_time for s in summaries if s.last_time), default=""),
        samples=tuple(sorted(((*k, n) for k, n in samples.items()), key=_sample_order)),
        peak_queue=max(s.peak_queue for s in summaries),
        throughput=(min(lows) if lows else None, max(highs) if highs else None),
        context_tokens=sum(s.context_tokens for s in summaries), context_requests=sum(s.context_requests for s in summaries),
        prompt_tokens=sum(s.prompt_tokens for s in summaries), prompt_requests=sum(s.prompt_requests for s in summaries),
        prefill_max_new_tokens=max((s.prefill_max_new_tokens for s in summaries if s.prefill_max_new_tokens is not None),
                                   default=None),
        retractions=sum(s.retractions for s in summaries), retraction_events=sum(s.retraction_events for s in summaries),
        retraction_tokens_max=max(tokens) if tokens else None, preemptions=sum(preempted) if preempted else None,
        series=tuple(points[t] for t in sorted(points)),
        readings=max((s.readings for s in summaries if s.readings is not None), default=None),
        seconds=max((s.seconds for s in summaries if s.seconds is not None), default=None))


@rule("runtime.summary", reads=(F.TrafficSummary, F.TrafficMark, F.CounterReadings, F.LengthHistogram, F.TokenBudget,
                                F.ServerArgs, F.RequestLengths, F.VllmArgs,
                                "concurrency?", "config:max_running_requests?", "config:chunked_prefill_size?",
                                "config:page_size?", "kv_pool:tokens?"),
      concludes=("runtime",))
def summary(kb):
    """What it concludes: `runtime.<rank>` and `runtime.all`: the request-time traffic of each rank,
    summed.

    How: Sums each rank's request-time lines (SGLang `Prefill batch` / `Decode batch` and
    retractions, vLLM's periodic `Avg prompt throughput` metrics and preemptions): the span, KV
    usage peak and percentiles (fractions 0–1; vLLM's percent / 100), the share of lines at or above
    90 % and at 100 %, peak running requests against the request limit, why requests queued (the
    pool ≥ 90 % full: memory; running at the limit with room: the request limit; else scheduling or
    compute), retractions or preemptions, the throughput range, and the request lengths the lines
    show. Shares are of traffic lines, not of wall time: SGLang prints a line per batch logged, vLLM
    one every 10 s.

    Example: `Decode batch, #running-req: 1, #token: 552, token usage: 0.00, cuda graph: True, gen
    throughput (token/s): 168.12, #queue-req: 0`."""
    # the request limit as the concurrency table applies it (per DP worker), else as configured
    rows = [c for c in kb.topic("concurrency") if c.detail.get("request_limit") is not None]
    limit_d = rows[0] if rows else kb.get("config", "max_running_requests")
    tokens_d = kb.get("kv_pool", "tokens")
    limit = (rows[0].detail["request_limit"] if rows else limit_d.value if limit_d is not None and limit_d.known
             else None)
    pool = tokens_d.value if tokens_d is not None and tokens_d.known else None
    # the chunk budget in effect: the max_total_num_tokens line prints it after SGLang chose it
    budget = next((b for b in kb.of(F.TokenBudget, role=None) if b.chunked_prefill_size is not None), None)
    chunk_d, page_d = kb.get("config", "chunked_prefill_size"), kb.get("config", "page_size")
    chunk = budget.chunked_prefill_size if budget else chunk_d.value if chunk_d is not None and chunk_d.known else None
    page = page_d.value if page_d is not None and page_d.known and isinstance(page_d.value, int) else _unpaged(kb)
    chunk = chunk if isinstance(chunk, int) else None
    marks = kb.of(F.TrafficMark, role=None)
    used = tuple(d for d in (limit_d, tokens_d, chunk_d, page_d) if d is not None and d.known) + (
        (budget,) if budget is not None else ()) + (
        (kb.first(F.ServerArgs, role=None),) if page is not None and (page_d is None or not page_d.known) else ())
    summaries = kb.of(F.TrafficSummary, role=None)
    counters, histograms = kb.of(F.CounterReadings, role=None), kb.of(F.LengthHistogram, role=None)
    logged = kb.of(F.RequestLengths, role=None)
    setting = _max_log_len(kb) if logged else None
    requests = request_log(logged, setting[:3]) if setting else None
    groups = [(s.rank.key(), s, [s]) for s in summaries]
    if len(summaries) > 1:
        groups.append(("all", merged(summaries), summaries))
    if logged and not summaries:  # request lines without metrics lines: a section of those alone
        groups.append((F.NO_RANK.key(), F.TrafficSummary(evidence=logged[0].evidence, role=F.RUNTIME_ROLE,
                                                          framework="vllm", lines=0, first_time="", last_time="",
                                                          samples=(), peak_queue=0, throughput=(None, None)), logged))
    for key, s, parts in groups:
        # SGLang's tokenizer counts for all DP ranks together (no rank label): those go with all, as
        # do vLLM's request lines (its API server serves every engine)
        together = key == "all" or len(groups) == 1
        cited = list(parts) + ([r for r in logged if r not in parts] if together else [])
        mine = [m for m in marks if any(m.summary_line == p.evidence.line and m.rank == p.rank for p in cited)]
        ranks = {p.rank for p in parts}
        read = ([c for c in counters if together or c.rank in ranks],
                [h for h in histograms if together or h.rank in ranks])
        value = summarize(s, limit, pool, *read, chunk=chunk, page=page, requests=requests if together else None)
        usage = value["kv_usage"]
        span = (f"{s.readings} readings of {line_ref(s)} ({s.first_time} to {s.last_time})" if s.readings else
                f"{s.lines} traffic lines from {s.first_time or '?'} to {s.last_time or '?'} ({line_ref(s)} on)")
        formula = (span + (f"; KV usage peak {usage['peak']}, p50 {usage['p50']}" if usage else "; no KV usage printed")
                   + (f"; {requests['requests']} request lines ({line_ref(logged[0])} on)" if together and requests
                      else ""))
        premises = (*cited, *mine, *read[0], *read[1]) + used + ((setting[3],) if together and setting and setting[3]
                                                                else ())
        yield Derived("runtime", key, value, "runtime.summary", premises, formula,
                      detail={"marks": _marks(mine), "rank": None if key == "all" else s.rank, "parts": parts})


def _max_log_len(kb) -> tuple[bool, Optional[int], str, Optional[F.Fact]]:
    """vLLM's `--max-log-len` as the start-up states it: (stated, value, where, the fact). The
    `args: Namespace(…)` line prints every argument; `non-default args: {…}`, read whole, prints
    every one not at its default, which for max_log_len is None (no cut) in every version. `where`
    is the line that says so."""
    for args in kb.of(F.VllmArgs, role=None):
        if "max_log_len" in args.fields:
            value = args.fields["max_log_len"]
            return True, value if isinstance(value, int) else None, line_ref(args), args
    whole = next((a for a in kb.of(F.VllmArgs, role=None) if a.style == "non-default" and a.truncated_at is None), None)
    if whole is not None:
        return True, None, line_ref(whole), whole
    return False, None, "the log does not state max_log_len", None


def _unpaged(kb) -> Optional[int]:
    """1 where the whole `server_args` repr has no page_size field: that SGLang allocated the KV
    pool token by token (it had no pages); else None."""
    args = kb.first(F.ServerArgs, role=None)
    if args is None or args.style != "repr" or args.truncated_at is not None or args.elided:
        return None
    return None if "page_size" in args.fields else 1


def _marks(marks: list[F.TrafficMark]) -> dict[str, F.TrafficMark]:
    """One line per mark: across ranks, the earliest first_*, the latest last_*, the largest peak_*."""
    chosen: dict[str, F.TrafficMark] = {}
    for m in sorted(marks, key=lambda m: m.evidence.line):
        old = chosen.get(m.mark)
        if old is None or m.mark.startswith("last") or (m.mark.startswith("peak") and m.value > old.value):
            chosen[m.mark] = m
    return chosen
