"""A Prometheus scrape (`GET /metrics`, or a saved `--metrics-file`) → the serving figures, under
one name each whatever the exporter and version called them.

The text format is read by prometheus-client's own parser. Names are normalised across the
prefixes vLLM and SGLang use (`vllm:`, `vllm_` — the multiprocess and Ray exporters —,
`ray_vllm_`, `sglang:`, `sglang_`) and across renames between versions; every value keeps the
name it was read under, so the report can say which one it was.
"""
from __future__ import annotations

from typing import Optional

from prometheus_client.parser import text_string_to_metric_families

from capdiag.errors import InputError
from capdiag.frozen import frozen

PREFIXES = ("ray_vllm:", "ray_vllm_", "vllm:", "vllm_", "sglang:", "sglang_")
# canonical name <- the names it has had, newest first. A scrape may export an old name beside
# its successor (vLLM 0.9–0.10 keep `gpu_cache_usage_perc` and `gpu_prefix_cache_*`): its
# samples are read under the newest name it holds, so nothing is counted twice.
GAUGES = {
    # fractions 0–1: vLLM's gauge says "1 means 100 percent", SGLang's token_usage is used / capacity
    "kv_cache_usage": ("kv_cache_usage_perc", "gpu_cache_usage_perc", "token_usage"),
    # SGLang before v0.4 exported vLLM's names (`num_requests_running`) and `queue_req`
    "running": ("num_requests_running", "num_running_reqs"),
    "waiting": ("num_requests_waiting", "num_queue_reqs", "queue_req"),
    "swapped": ("num_requests_swapped",),
    "cache_config_info": ("cache_config_info",),
    "max_total_num_tokens": ("max_total_num_tokens",),
    "max_running_requests": ("max_running_requests",),
    "context_len": ("context_len",),
    "gen_throughput": ("gen_throughput",),
}
# Cumulative counters (prometheus-client exports a counter `x` as `x_total`); their increase
# between two scrapes is a rate.
COUNTERS = {
    "preemptions": ("num_preemptions_total", "num_preemption_total"),  # vLLM V1 / V0
    "retractions": ("num_retracted_requests_total",),  # SGLang since its retraction counters
    "prompt_tokens": ("prompt_tokens_total",),
    "generation_tokens": ("generation_tokens_total",),
    # vLLM counts finished requests per `finished_reason` (summed); SGLang all requests
    "requests": ("request_success_total", "num_requests_total"),
    "prefix_cache_queries": ("prefix_cache_queries_total", "gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("prefix_cache_hits_total", "gpu_prefix_cache_hits_total"),
    # SGLang's prompt tokens served from its radix cache. Its `cache_hit_rate` gauge is not read:
    # a percent before v0.4, a fraction after, and only of the last prefill batch.
    "cached_tokens": ("cached_tokens_total",),
}
# Histograms of request lengths in tokens, one observation per finished request: vLLM (and
# SGLang before v0.4) `request_prompt_tokens` / `request_generation_tokens`; newer SGLang
# `prompt_tokens_histogram` / `generation_tokens_histogram` (with --collect-tokens-histogram).
HISTOGRAMS = {
    "prompt_length": ("request_prompt_tokens", "prompt_tokens_histogram"),
    "generation_length": ("request_generation_tokens", "generation_tokens_histogram"),
}
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")
# Every serving figure is a finite number from 0 to the largest whole number a float holds
# exactly (counts, tokens, seconds); the usage gauges are fractions, at most 1. A sample outside
# (NaN for "no value yet", a negative or absurd figure from a broken exporter) is left out, as a
# value the scrape does not give: reported, it would be "-2 requests fit" or KV usage of 750 %.
MOST = float(2 ** 53)
BOUNDS = {"kv_cache_usage": 1.0}

_CANONICAL: dict[str, tuple[str, int]] = {}  # exported name -> (canonical, rank among its names)
for _table in (GAUGES, COUNTERS):
    for _new, _olds in _table.items():
        _CANONICAL.update({old: (_new, rank) for rank, old in enumerate(_olds)})
for _new, _olds in HISTOGRAMS.items():
    _CANONICAL.update({old + part: (_new + part, rank) for rank, old in enumerate(_olds) for part in HISTOGRAM_PARTS})


@frozen
class Sample:
    name: str  # canonical
    read_as: str  # the metric name in the scrape
    labels: dict
    value: float
    framework: str  # "vllm" | "sglang"
    timestamp: Optional[float] = None  # seconds, when the scrape states one


def framework_of_name(name: str) -> Optional[str]:
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return "sglang" if prefix.startswith("sglang") else "vllm"
    return None


def read_metrics(text: str, source: str) -> list[Sample]:
    """The serving samples of a scrape (other metrics are left out); InputError if it is not one."""
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        said = (str(exc).splitlines() or [type(exc).__name__])[0][:100]
        raise InputError(f"{source}: not the Prometheus text format ({said})") from None
    found: list[tuple[int, Sample]] = []
    for family in families:
        for s in family.samples:
            framework = framework_of_name(s.name)
            if framework is None:
                continue
            bare = s.name
            for prefix in PREFIXES:
                if bare.startswith(prefix):
                    bare = bare[len(prefix):]
                    break
            known = _CANONICAL.get(bare)
            if known is not None and 0.0 <= s.value <= BOUNDS.get(known[0], MOST):  # NaN fails both
                found.append((known[1], Sample(known[0], s.name, dict(s.labels), float(s.value), framework,
                                               s.timestamp)))
    newest: dict[str, int] = {}
    for rank, s in found:
        newest[s.name] = min(rank, newest.get(s.name, rank))
    return [s for rank, s in found if rank == newest[s.name]]
