"""A Prometheus scrape (`GET /metrics`, or a saved `--metrics-file`) → the serving figures, under
one name each whatever the exporter and version called them.

The text format is read by prometheus-client's own parser. Names are normalised across the
prefixes vLLM and SGLang use (`vllm:`, `vllm_` — the multiprocess and Ray exporters —,
`ray_vllm_`, `sglang:`, `sglang_`) and across renames between versions; every value keeps the
name it was read under, so the report can say which one it was.
"""
from __future__ import annotations

from typing import Optional

import attrs
from prometheus_client.parser import text_string_to_metric_families

from capdiag.errors import InputError

PREFIXES = ("ray_vllm:", "ray_vllm_", "vllm:", "vllm_", "sglang:", "sglang_")
# canonical name <- the names it has had, newest first
ALIASES = {
    "kv_cache_usage": ("kv_cache_usage_perc", "gpu_cache_usage_perc", "token_usage"),  # fractions 0–1
    "running": ("num_requests_running", "num_running_reqs"),
    "waiting": ("num_requests_waiting", "num_queue_reqs"),
    "swapped": ("num_requests_swapped",),
    "preemptions": ("num_preemptions_total", "num_preemption_total"),
    "generation_tokens": ("generation_tokens_total",),
    "prompt_tokens": ("prompt_tokens_total",),
    "cache_config_info": ("cache_config_info",),
    "max_total_num_tokens": ("max_total_num_tokens",),
    "max_running_requests": ("max_running_requests",),
    "gen_throughput": ("gen_throughput",),
}
_CANONICAL = {old: new for new, olds in ALIASES.items() for old in olds}


@attrs.frozen
class Sample:
    name: str  # canonical
    read_as: str  # the metric name in the scrape
    labels: dict
    value: float
    framework: str  # "vllm" | "sglang"


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
        raise InputError(f"{source}: not the Prometheus text format ({str(exc).splitlines()[0][:100]})") from None
    out = []
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
            canonical = _CANONICAL.get(bare)
            if canonical is not None:
                out.append(Sample(canonical, s.name, dict(s.labels), float(s.value), framework))
    return out
