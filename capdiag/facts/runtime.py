"""Facts about a running server: what its request-time traffic lines add up to.

Traffic lines are most of a long log, so there is no fact per line: the source's traffic
aggregator sums them in constant memory into one `TrafficSummary` per rank and start-up, and a
few `TrafficMark`s — the lines a finding cites (first, last, the peak, the first retraction).
"""
from __future__ import annotations

from typing import Any, Optional

import attrs

from capdiag.facts.base import Fact

# The role of these facts: not a start-up line, so no start-up rule, rank table or launch
# phase counts them (Knowledge.of looks at role "target" unless told otherwise).
RUNTIME_ROLE = "runtime"


@attrs.frozen(kw_only=True)
class TrafficSummary(Fact):
    """One rank's request-time lines of one start-up, summed. Evidence: its first such line.

    KV usage is a fraction 0–1 (vLLM's percent / 100) as printed; `samples` counts lines that
    print it, keyed by (usage, queued, running) so any request limit can be applied later.
    """

    framework: str  # "sglang" | "vllm"
    lines: int  # traffic lines read
    first_time: str
    last_time: str
    samples: tuple[tuple[Optional[float], bool, int, int], ...]  # (usage or None, queue > 0, running, count)
    peak_queue: int
    throughput: tuple[Optional[float], Optional[float]]  # min, max decode/generation token/s
    context_tokens: int = 0  # Σ #token over decode lines (SGLang)
    context_requests: int = 0  # Σ #running-req over the same lines
    prompt_tokens: int = 0  # Σ (#new-token + #cached-token) over prefill lines (SGLang)
    prompt_requests: int = 0  # Σ #new-seq over the same lines
    prefill_max_new_tokens: Optional[int] = None  # the largest #new-token of one prefill line
    retractions: int = 0  # requests retracted (SGLang) — Σ #retracted_reqs
    retraction_events: int = 0
    retraction_tokens_max: Optional[int] = None  # largest #new_tokens_gained of one retraction
    preemptions: Optional[int] = None  # vLLM V0: the last total_num_cumulative_preemption
    series: tuple[tuple[str, float, int, int], ...] = ()  # (time, max usage, max running, max queue)
    # from a probe: how many times its endpoints were read, and the seconds from the first
    # reading to the last where known (first_time / last_time then name the readings)
    readings: Optional[int] = None
    seconds: Optional[float] = None


@attrs.frozen(kw_only=True)
class RequestLengths(Fact):
    """vLLM's request-logging lines of one start-up, summed (capdiag.request_log). Evidence: the
    first such line, cut to its head (a request line may hold a whole prompt).

    `prompt_lengths` counts requests by the number of token ids their line printed in a closed
    list — exact unless `--max-log-len` cut the list to that many (the rule reading this knows
    the start-up's setting); `prompt_cut` by the ids counted before the line itself was cut (a
    lower bound); `max_tokens` by the sampling parameters' `max_tokens=`.
    """

    framework: str
    lines: int  # request lines read (Received request, and DEBUG details lines)
    requests: int  # `Received request` lines
    unread: int = 0  # request lines whose fields could not be told apart
    prompt_lengths: tuple[tuple[int, int], ...] = ()  # (ids, requests)
    prompt_cut: tuple[tuple[int, int], ...] = ()  # (ids before the cut, requests)
    prompt_not_printed: int = 0  # lines that print `prompt_token_ids: None`, or no list
    max_tokens: tuple[tuple[int, int], ...] = ()  # (max_tokens, requests)
    max_tokens_not_set: int = 0  # `max_tokens=None`, or parameters without it (pooling)


@attrs.frozen(kw_only=True)
class TrafficMark(Fact):
    """A traffic line worth citing: `mark` is first | last | peak_usage | peak_running |
    peak_queue | first_full | first_retraction | last_retraction | last_preemption, or of the
    request lines (`summary_line` then a RequestLengths' line) first_request | longest_prompt |
    last_request."""

    framework: str
    mark: str
    value: Any = None
    summary_line: int = 0  # the evidence line of the TrafficSummary it belongs to



@attrs.frozen(kw_only=True)
class CounterReadings(Fact):
    """A running server's cumulative counters (preemptions, retractions, prompt and generation
    tokens, finished requests, prefix-cache queries and hits) as the scrapes of its `/metrics`
    read them, per rank. Evidence: the endpoint and the names read.

    `readings` holds (counter, metric name, first value, last value); `seconds` the time between
    the first and the last scrape — None when it is not known (one scrape, or saved scrapes that
    carry no time), and then `unknown_reason` says why there are no rates.
    """

    framework: str
    scrapes: int
    seconds: Optional[float]
    readings: tuple[tuple[str, str, float, float], ...]
    unknown_reason: Optional[str] = None


@attrs.frozen(kw_only=True)
class LengthHistogram(Fact):
    """A histogram of request lengths in tokens as the last scrape holds it (`vllm:request_prompt_tokens`,
    `vllm:request_generation_tokens`, SGLang's equivalents): one observation per finished request
    since the server started. `buckets` are (upper bound, cumulative count), ascending, the
    last one +inf; `total` is the histogram's `_sum`."""

    framework: str
    kind: str  # "prompt" | "generation"
    metric: str
    buckets: tuple[tuple[float, float], ...]
    count: float
    total: float
