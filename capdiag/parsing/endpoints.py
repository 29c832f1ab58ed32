"""What a running server's endpoints answer → the same typed facts its log lines give.

Each fact's Evidence names the endpoint and the field (`GET /server_info`,
`internal_states[0].memory_usage.weight = 14.99`), so the report's evidence chains end there
instead of at log lines. Only what the answer states becomes a fact: SGLang's figures are GB as
its log prints them (bytes / 2^30, so GiB), vLLM's KV usage gauge is a fraction (1 = 100 %).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Optional

import attrs

from capdiag import facts as F
from capdiag.parsing.prometheus import Sample

# /server_info keys that are not server arguments (the scheduler's figures, per-DP states)
_NOT_ARGS = {"internal_states", "version", "max_total_num_tokens", "max_req_input_len", "status", "tokenizer_info"}


@attrs.frozen
class Readings:
    """When a server's endpoints were read: a name for each reading (the UTC time it was taken,
    or a saved scrape's file name and stated time), and the seconds from the first to the last
    where known."""

    names: tuple[str, ...]
    seconds: Optional[float] = None

    def of(self, taken: list[int]) -> "Readings":
        """The readings at these indices (a rank's state missing from some scrapes)."""
        return Readings(tuple(self.names[i] for i in taken if i < len(self.names)),
                        self.seconds if len(taken) == len(self.names) else None)


def _ev(endpoint: str, text: str) -> F.Evidence:
    return F.Evidence(F.INPUT_LINE, text, 1, endpoint)


def _num(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def sglang_server_info(info: dict, endpoint: str) -> list[F.Fact]:
    """`/server_info` (newer) or `/get_server_info`: the server arguments at the top level, the
    scheduler's token capacity, and one internal state per DP rank with its `memory_usage`
    (`weight`, `kvcache`, `graph` or `cuda_graph` — a number, or one per graph kind —,
    `token_capacity`)."""
    if not isinstance(info, dict):
        raise TypeError("server info is not an object")
    args = {k: v for k, v in info.items() if k not in _NOT_ARGS}
    facts: list[F.Fact] = [F.ServerArgs(evidence=_ev(endpoint, f"server arguments ({len(args)} fields)"),
                                        fields=args, style="dict")]
    states = [s for s in info.get("internal_states") or () if isinstance(s, dict)]
    several = len(states) > 1
    for i, state in enumerate(states):
        rank = F.Rank(dp=i) if several else F.NO_RANK
        where = f"internal_states[{i}].memory_usage"
        usage = state.get("memory_usage") if isinstance(state.get("memory_usage"), dict) else {}
        weight, kv = _num(usage.get("weight")), _num(usage.get("kvcache"))
        tokens = usage.get("token_capacity")
        graph = usage.get("graph", usage.get("cuda_graph"))
        if weight is not None:
            facts.append(F.LoadWeightEnd(evidence=_ev(endpoint, f"{where}.weight = {weight}"), rank=rank,
                                         mem_usage_gib=weight))
        if kv is not None or isinstance(tokens, int):
            facts.append(F.KVCacheAllocated(
                evidence=_ev(endpoint, f"{where}.kvcache = {kv}, {where}.token_capacity = {tokens}"), rank=rank,
                tokens=tokens if isinstance(tokens, int) else None, kv_gib=kv))
        graphs = graph if isinstance(graph, dict) else {"decode": graph}
        total = [_num(v) for v in graphs.values() if _num(v) is not None]
        if total:
            facts.append(F.GraphCaptureEnd(evidence=_ev(endpoint, f"{where}.graph = {graph}"), rank=rank,
                                           graph="decode", device="cuda", mem_usage_gib=round(sum(total), 2)))
        capacity = tokens if isinstance(tokens, int) else info.get("max_total_num_tokens")
        limit = state.get("effective_max_running_requests_per_dp", info.get("max_running_requests"))
        if isinstance(capacity, int):
            facts.append(F.TokenBudget(
                evidence=_ev(endpoint, f"token capacity {capacity}, max_running_requests {limit}, "
                                       f"context_length {info.get('context_length')}"), rank=rank,
                max_total_num_tokens=capacity, max_running_requests=limit if isinstance(limit, int) else None,
                context_len=info.get("context_length") if isinstance(info.get("context_length"), int) else None,
                chunked_prefill_size=info.get("chunked_prefill_size") if isinstance(
                    info.get("chunked_prefill_size"), int) else None))
    facts.append(F.ServerReady(evidence=_ev(endpoint, "the server answers")))
    return facts


def sglang_loads(answers: list[Any], endpoint: str, capacity: Optional[int],
                 readings: Optional[Readings] = None) -> list[F.Fact]:
    """`/v1/loads` (`{"loads": [{dp_rank, num_running_reqs, num_waiting_reqs, token_usage,
    gen_throughput, …}]}`) or the older `/get_load` (a list of `{dp_rank, num_reqs,
    num_waiting_reqs, num_tokens}`, where `num_reqs` counts running and waiting requests and the
    usage is `num_tokens` over the token capacity), one answer per time it was read: per DP rank
    one sample per answer. `readings` names when each answer was read."""
    per_rank: dict[int, list] = defaultdict(list)
    several = False
    for n, loads in enumerate(answers):
        rows = loads.get("loads") if isinstance(loads, dict) else loads
        rows = [r for r in rows or () if isinstance(r, dict)]
        several = several or len(rows) > 1
        for i, row in enumerate(rows):
            waiting = int(row.get("num_waiting_reqs") or 0)
            if "num_running_reqs" in row:
                running, usage = int(row["num_running_reqs"]), _num(row.get("token_usage"))
            else:
                running = int(row.get("num_reqs") or 0) - waiting
                tokens = row.get("num_tokens")
                usage = round(tokens / capacity, 4) if isinstance(tokens, int) and capacity else None
            name = "loads" if isinstance(loads, dict) else ""
            text = (f"{name}[{i}]: running {running}, waiting {waiting}, token usage {usage}, "
                    f"gen throughput {row.get('gen_throughput')}")
            per_rank[int(row.get("dp_rank", i))].append((usage, waiting, running, _num(row.get("gen_throughput")), text, n))
    out: list[F.Fact] = []
    for dp, states in sorted(per_rank.items()):
        rank = F.Rank(dp=dp) if several else F.NO_RANK
        speeds = [s[3] for s in states if s[3] is not None]
        text = states[-1][4] + (f" ({len(states)} readings)" if len(states) > 1 else "")
        out.append(_snapshot("sglang", rank, endpoint, text, [s[:3] for s in states],
                             readings and readings.of([s[5] for s in states]),
                             throughput=(min(speeds), max(speeds)) if speeds else (None, None)))
    return out


def vllm_metrics(scrapes: list[list[Sample]], endpoint: str, *, seconds: Optional[float] = None,
                 no_rates: Optional[str] = None, max_model_len: Optional[int] = None,
                 readings: Optional[Readings] = None) -> list[F.Fact]:
    """One or more scrapes of vLLM's `/metrics` (oldest first): `cache_config_info`'s labels
    (`num_gpu_blocks`, `block_size`, `gpu_memory_utilization`, `cache_dtype`, newer
    `kv_cache_size_tokens` and `kv_cache_max_concurrency` — the requests of `max_model_len`
    tokens the pool holds, a figure only with that length) from the last, and per engine (DP
    rank) each scrape's KV usage, running and waiting requests, the counters' first and last
    readings (`seconds` apart; `no_rates` says why when that is not known) and the request
    length histograms."""
    last = scrapes[-1]
    facts: list[F.Fact] = []
    info = next((s for s in last if s.name == "cache_config_info"), None)
    if info is not None:
        said = ", ".join(f"{k}={v}" for k, v in sorted(info.labels.items()))
        fields = {"gpu_memory_utilization": _float(info.labels.get("gpu_memory_utilization")),
                  "block_size": _int(info.labels.get("block_size")),
                  "kv_cache_dtype": info.labels.get("cache_dtype")}
        facts.append(F.VllmArgs(evidence=_ev(endpoint, f"{info.read_as}{{{said}}}"),
                                fields={k: v for k, v in fields.items() if v is not None}, style=info.read_as))
        blocks, tokens = _int(info.labels.get("num_gpu_blocks")), _int(info.labels.get("kv_cache_size_tokens"))
        if blocks:
            facts.append(F.VllmGpuBlocks(evidence=_ev(endpoint, f"{info.read_as} num_gpu_blocks={blocks}"),
                                         blocks=blocks, wording="cache_config_info"))
        if tokens:
            facts.append(F.VllmKVCacheSize(evidence=_ev(endpoint, f"{info.read_as} kv_cache_size_tokens={tokens}"),
                                           tokens=tokens, device="GPU"))
        times = _float(info.labels.get("kv_cache_max_concurrency"))
        if times is not None and max_model_len:
            facts.append(F.VllmMaxConcurrency(
                evidence=_ev(endpoint, f"{info.read_as} kv_cache_max_concurrency={times:g} "
                                       f"(at max_model_len {max_model_len})"), tokens=max_model_len, x=times))
    engines = _by_label(scrapes, "engine")
    several = len(engines) > 1
    for engine, per_scrape in sorted(engines.items()):
        rank = F.Rank(dp=int(engine)) if several and engine.isdigit() else F.NO_RANK
        states, read, preempted, taken = [], [], None, []
        for n, samples in enumerate(per_scrape):
            got = {s.name: s for s in samples}
            if "running" not in got:
                continue
            taken.append(n)
            usage = got.get("kv_cache_usage")
            states.append((usage.value if usage else None, int(got["waiting"].value) if "waiting" in got else 0,
                           int(got["running"].value)))
            read = [f"{s.read_as}={s.value:g}" for s in samples if s.name in _STATE]
            if "preemptions" in got:
                preempted = int(got["preemptions"].value)
        if states:
            text = f"engine {engine or '0'}: " + ", ".join(read) + (f" ({len(states)} scrapes)" if len(states) > 1 else "")
            facts.append(_snapshot("vllm", rank, endpoint, text, states, readings and readings.of(taken),
                                   preemptions=preempted))
        facts += _counters("vllm", rank, endpoint, per_scrape, seconds, no_rates)
        facts += _histograms("vllm", rank, endpoint, per_scrape[-1])
    facts.append(F.VllmEngineReady(evidence=_ev(endpoint, "the server answers")))
    return facts


def vllm_models(models: Any, endpoint: str) -> list[F.Fact]:
    """`/v1/models`: the served model and its `max_model_len`."""
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if data and isinstance(data[0], dict) else {}
    out: list[F.Fact] = []
    if isinstance(first.get("max_model_len"), int):
        out.append(F.VllmMaxModelLen(evidence=_ev(endpoint, f"data[0].max_model_len = {first['max_model_len']}"),
                                     tokens=first["max_model_len"]))
    if isinstance(first.get("root") or first.get("id"), str):
        model = first.get("root") or first.get("id")
        out.append(F.VllmArgs(evidence=_ev(endpoint, f"data[0].root = {model!r}"), fields={"model": model},
                              style="/v1/models"))
    return out


def vllm_version(answer: Any, endpoint: str) -> list[F.Fact]:
    version = answer.get("version") if isinstance(answer, dict) else None
    return [F.VllmVersion(evidence=_ev(endpoint, f"version = {version}"), version=version)] if isinstance(
        version, str) else []


def sglang_metrics(scrapes: list[list[Sample]], endpoint: str, *, seconds: Optional[float] = None,
                   no_rates: Optional[str] = None, state: bool = True,
                   readings: Optional[Readings] = None) -> list[F.Fact]:
    """SGLang's `/metrics` (`sglang:token_usage`, `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
    `sglang:max_total_num_tokens`; before v0.4 `sglang:num_requests_running`, `…_waiting`):
    per scrape and DP rank the server's state (unless `state` is False: the load endpoint gave
    it), the counters' first and last readings, and the request length histograms."""
    ranks = _by_label(scrapes, "dp_rank")
    several = len(ranks) > 1
    out: list[F.Fact] = []
    for dp, per_scrape in sorted(ranks.items()):
        rank = F.Rank(dp=int(dp)) if several and dp.isdigit() else F.NO_RANK
        states, read, taken = [], [], []
        for n, samples in enumerate(per_scrape):
            got = {s.name: s for s in samples}
            if "running" in got:
                taken.append(n)
                states.append((got["kv_cache_usage"].value if "kv_cache_usage" in got else None,
                               int(got["waiting"].value) if "waiting" in got else 0, int(got["running"].value)))
                read = [f"{s.read_as}={s.value:g}" for s in samples if s.name in _STATE]
        capacity = next((s for s in per_scrape[-1] if s.name == "max_total_num_tokens"), None)
        if capacity is not None and state:
            limit = next((s for s in per_scrape[-1] if s.name == "max_running_requests"), None)
            out.append(F.TokenBudget(evidence=_ev(endpoint, f"{capacity.read_as} = {capacity.value:g}"), rank=rank,
                                     max_total_num_tokens=int(capacity.value),
                                     max_running_requests=int(limit.value) if limit else None))
        if states and state:
            out.append(_snapshot("sglang", rank, endpoint, f"dp_rank {dp or '0'}: " + ", ".join(read), states,
                                 readings and readings.of(taken)))
        out += _counters("sglang", rank, endpoint, per_scrape, seconds, no_rates)
        out += _histograms("sglang", rank, endpoint, per_scrape[-1])
    return out


_STATE = {"kv_cache_usage", "running", "waiting", "preemptions", "max_total_num_tokens"}
_COUNTED = ("preemptions", "retractions", "prompt_tokens", "generation_tokens", "requests", "prefix_cache_queries",
            "prefix_cache_hits", "cached_tokens")


def _by_label(scrapes: list[list[Sample]], label: str) -> dict[str, list[list[Sample]]]:
    """Each scrape's samples by the value of `label` (vLLM's `engine`, SGLang's `dp_rank`).

    SGLang can export every scheduler's figures (`--enable-metrics-for-all-schedulers`), one
    per `tp_rank`/`pp_rank` of a DP rank: they describe one pool, so only the lowest is kept
    (adding them would count each retraction once per GPU)."""
    groups: dict[str, list] = defaultdict(lambda: [[] for _ in scrapes])
    for n, scrape in enumerate(scrapes):
        lowest: dict[tuple, tuple] = {}
        for s in scrape:
            key = (s.labels.get(label, ""), s.name)
            lowest[key] = min(lowest.get(key, _scheduler(s)), _scheduler(s))
        for s in scrape:
            if _scheduler(s) == lowest[(s.labels.get(label, ""), s.name)]:
                groups[s.labels.get(label, "")][n].append(s)
    return groups


def _scheduler(s: Sample) -> tuple:
    return tuple(int(v) if str(v).isdigit() else -1 for v in (s.labels.get(k, "") for k in ("pp_rank", "tp_rank")))


def _counters(framework: str, rank: F.Rank, endpoint: str, per_scrape: list[list[Sample]],
              seconds: Optional[float], no_rates: Optional[str]) -> list[F.Fact]:
    """The counters' first and last readings (a counter split by another label, vLLM's
    `finished_reason`, summed)."""
    def totals(samples):
        sums: dict[str, list] = {}
        for s in samples:
            if s.name in _COUNTED:
                entry = sums.setdefault(s.name, [s.read_as, 0.0])
                entry[1] += s.value
        return sums

    first, last = totals(per_scrape[0]), totals(per_scrape[-1])
    readings = tuple((name, last[name][0], first[name][1] if name in first else last[name][1], last[name][1])
                     for name in _COUNTED if name in last)
    if not readings:
        return []
    many = len(per_scrape) > 1
    why = no_rates if many else (no_rates or "one scrape of /metrics: a rate needs two")
    text = ", ".join(f"{metric}={a:g}" + (f" → {b:g}" if many else "") for _, metric, a, b in readings)
    return [F.CounterReadings(evidence=_ev(endpoint, text + (f" ({seconds:g} s apart)" if many and seconds else "")),
                              rank=rank, role=F.RUNTIME_ROLE, framework=framework, scrapes=len(per_scrape),
                              seconds=seconds if many and not why else None, readings=readings,
                              unknown_reason=why)]


def _histograms(framework: str, rank: F.Rank, endpoint: str, samples: list[Sample]) -> list[F.Fact]:
    out: list[F.Fact] = []
    for kind in ("prompt", "generation"):
        name = f"{kind}_length"
        buckets = sorted((_float(s.labels.get("le")), s.value) for s in samples
                         if s.name == name + "_bucket" and _float(s.labels.get("le")) is not None)
        count = next((s for s in samples if s.name == name + "_count"), None)
        total = next((s for s in samples if s.name == name + "_sum"), None)
        if not buckets or count is None or total is None:
            continue
        metric = count.read_as[:-len("_count")]
        out.append(F.LengthHistogram(
            evidence=_ev(endpoint, f"{metric}: {count.value:g} requests, {total.value:g} tokens in all"),
            rank=rank, role=F.RUNTIME_ROLE, framework=framework, kind=kind, metric=metric,
            buckets=tuple(buckets), count=count.value, total=total.value))
    return out


def _snapshot(framework: str, rank: F.Rank, endpoint: str, text: str, states: list[tuple],
              readings: Optional[Readings] = None, throughput: tuple = (None, None),
              preemptions: Optional[int] = None) -> F.TrafficSummary:
    """Samples of a server's state (one per reading) as a traffic summary: (usage, waiting, running)."""
    counts: dict[tuple, int] = defaultdict(int)
    for usage, waiting, running in states:
        counts[(usage, waiting > 0, running)] += 1
    names = readings.names if readings and len(readings.names) == len(states) else ()
    labels = list(names) or [f"reading {n}" for n in range(1, len(states) + 1)]
    return F.TrafficSummary(
        evidence=_ev(endpoint, text), rank=rank, role=F.RUNTIME_ROLE, framework=framework, lines=len(states),
        first_time=labels[0], last_time=labels[-1], readings=len(states),
        seconds=readings.seconds if names and len(states) > 1 else None,
        samples=tuple(sorted(((u, q, r, n) for (u, q, r), n in counts.items()),
                             key=lambda s: (-1.0 if s[0] is None else s[0],) + s[1:])),
        peak_queue=max(w for _, w, _ in states), throughput=throughput, preemptions=preemptions,
        series=tuple((label, -1.0 if u is None else u, r, w) for label, (u, w, r) in zip(labels, states)))


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text not in (None, "", "None") else None
    except ValueError:
        return None


def _float(text: Optional[str]) -> Optional[float]:
    try:
        return float(text) if text not in (None, "", "None") else None
    except ValueError:
        return None
