"""`capdiag probe`: read a running server's own endpoints (or saved scrapes of its `/metrics`)
into the facts a start-up log gives, and analyse them like one.

SGLang answers `/server_info` (`/get_server_info` before it was renamed) and `/v1/loads`
(`/get_load` before); vLLM `/metrics`, `/v1/models` and `/version`. Which one the server is
shows from what answers, unless `framework` says.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Optional

import attrs

from capdiag import facts as F
from capdiag.endpoints import Server
from capdiag.errors import InputError
from capdiag.parsing import endpoints as E
from capdiag.parsing.prometheus import read_metrics
from capdiag.side_input import read_text


DEFAULT_INTERVAL = 5.0  # seconds between a live server's two scrapes
MAX_INTERVAL = 300.0


Progress = Callable[[str], None]  # told what the probe waits for, and "" when the wait is over


def _waiter(progress: Optional[Progress]) -> Callable[[float, str], None]:
    def wait(seconds: float, what: str) -> None:
        if progress is not None:
            progress(f"waiting {seconds:g} s to read {what} again (--interval; 0 reads once)")
        time.sleep(seconds)
        if progress is not None:
            progress("")
    return wait


def probe_server(server: Server, framework: Optional[str] = None, interval: float = DEFAULT_INTERVAL,
                 progress: Optional[Progress] = None) -> tuple[list[F.Fact], str, int]:
    """The facts a running server's endpoints give; its framework; how many endpoints answered.
    Its load and `/metrics` are read twice, `interval` seconds apart (0: once), so its counters
    give rates; `progress` is told while it waits."""
    wait = _waiter(progress)
    if framework != "vllm":
        info = server.get("/server_info", "/get_server_info", required=framework == "sglang")
        if info is not None:
            return _sglang(server, info, interval, wait)
    metrics = _scrapes(server, interval, required=True, wait=wait)
    samples = [read_metrics(reply.text, f"GET {server.url}/metrics") for reply, *_ in metrics]
    if not any(s.framework == "vllm" for s in samples[0]):
        raise InputError(f"{server.url}: /metrics holds no vLLM metric, and /server_info does not answer: "
                         "neither an SGLang nor a vLLM server")
    facts, answered = [], 1
    # the version and the model first: they open a start-up, and the figures belong to it
    for path, reader in (("/version", E.vllm_version), ("/v1/models", E.vllm_models)):
        reply = server.get(path, required=False)
        if reply is not None:
            facts += _read(reader, reply.json(), f"GET {path}")
            answered += 1
    length = next((f.tokens for f in facts if isinstance(f, F.VllmMaxModelLen)), None)
    facts += E.vllm_metrics([[s for s in scrape if s.framework == "vllm"] for scrape in samples], "GET /metrics",
                            seconds=_apart(metrics), no_rates=_why_once(interval), max_model_len=length,
                            readings=_readings(metrics))
    return facts, "vllm", answered


def _sglang(server: Server, info, interval: float, wait) -> tuple[list[F.Fact], str, int]:
    """SGLang: its server info once; its load, and `/metrics` when it exports them
    (`--enable-metrics`), twice."""
    facts = _read(E.sglang_server_info, info.json(), f"GET {info.path}")
    budget = next((f for f in facts if isinstance(f, F.TokenBudget)), None)
    answered = 1
    first = server.get("/v1/loads", "/get_load", required=False)
    metrics = server.get("/metrics", required=False)
    loads = [_taken(first)] if first is not None else []
    scrapes = [_taken(metrics)] if metrics is not None else []
    if interval and (loads or scrapes):
        wait(interval, " and ".join(([loads[0][0].path] if loads else []) + (["/metrics"] if scrapes else [])))
        if loads:
            loads.append(_taken(server.get(loads[0][0].path)))
        if scrapes:
            scrapes.append(_taken(server.get("/metrics")))
    if loads:
        facts += _read(E.sglang_loads, [reply.json() for reply, *_ in loads], f"GET {loads[0][0].path}",
                       budget.max_total_num_tokens if budget else None, _readings(loads))
        answered += 1
    if scrapes:
        samples = [[s for s in read_metrics(reply.text, f"GET {server.url}/metrics") if s.framework == "sglang"]
                   for reply, *_ in scrapes]
        facts += E.sglang_metrics(samples, "GET /metrics", seconds=_apart(scrapes), no_rates=_why_once(interval),
                                  state=not loads, readings=_readings(scrapes))
        answered += 1
    return facts, "sglang", answered


def _scrapes(server: Server, interval: float, required: bool, wait) -> list[tuple]:
    """`/metrics` once, or twice `interval` seconds apart: (reply, monotonic time, wall time) each."""
    first = server.get("/metrics", required=required)
    if first is None:
        return []
    taken = [_taken(first)]
    if interval:
        wait(interval, "/metrics")
        taken.append(_taken(server.get("/metrics")))
    return taken


def _taken(reply) -> tuple:
    """An answer with when it came: the monotonic clock for the interval, the wall clock to name it."""
    return reply, time.monotonic(), time.time()


def _apart(scrapes: list[tuple]) -> Optional[float]:
    return round(scrapes[-1][1] - scrapes[0][1], 3) if len(scrapes) > 1 else None


def _utc(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))


def _readings(taken: list[tuple]) -> E.Readings:
    """The readings of a live server, named by the UTC time each answer came."""
    return E.Readings(tuple(_utc(wall) for _, _, wall in taken), _apart(taken))


def _why_once(interval: float) -> Optional[str]:
    return None if interval else "one scrape (--interval 0): a rate needs two"


def probe_files(paths: tuple[str, ...], framework: Optional[str] = None,
                interval: Optional[float] = None) -> tuple[list[F.Fact], str, int]:
    """Saved scrapes of `/metrics`, oldest first (two or more make the run-time series, and the
    rates: over the time the scrapes state, else `interval` seconds between consecutive ones)."""
    scrapes = []
    for path in paths:
        # bounded as a live answer is (/dev/zero, a runaway file), gzip read as such
        scrapes.append(read_metrics(read_text(path, "metrics"), path))
    found = {s.framework for scrape in scrapes for s in scrape}
    chosen = framework or ("vllm" if "vllm" in found else "sglang" if "sglang" in found else None)
    if chosen is None:
        raise InputError(f"{paths[0]}: no vLLM or SGLang metric in the scrape")
    mine = [[s for s in scrape if s.framework == chosen] for scrape in scrapes]
    name = "metrics file " + ", ".join(Path(p).name for p in paths)
    stamps = [max((s.timestamp for s in scrape if s.timestamp is not None), default=None) for scrape in mine]
    seconds, why = None, None
    if len(mine) > 1:
        if all(t is not None for t in stamps):
            seconds = round(stamps[-1] - stamps[0], 3)
        elif interval:
            seconds = interval * (len(mine) - 1)
        else:
            why = "the saved scrapes carry no time: give --interval, the seconds between them"
        if seconds is not None and seconds <= 0:
            seconds, why = None, f"the scrapes' times do not increase ({seconds:g} s from the first to the last)"
    # each saved scrape is named by its file, and by the time it states where it states one
    readings = E.Readings(tuple(Path(p).name + ("" if t is None else f" ({_utc(t)})") for p, t in zip(paths, stamps)),
                          seconds)
    if chosen == "vllm":
        return E.vllm_metrics(mine, name, seconds=seconds, no_rates=why, readings=readings), chosen, len(paths)
    return E.sglang_metrics(mine, name, seconds=seconds, no_rates=why, readings=readings), chosen, len(paths)


def _read(reader, payload, endpoint: str, *extra):
    """A reader over an answer; an answer of an unexpected shape is one line, not a traceback."""
    try:
        return reader(payload, endpoint, *extra)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
        raise InputError(f"{endpoint}: an answer of an unexpected shape ({exc})") from None


def analyse_probe(url: Optional[str] = None, metrics_files: tuple[str, ...] = (), *, framework: Optional[str] = None,
                  headers: tuple[str, ...] = (), token_env: Optional[str] = None, timeout: float = 10.0,
                  verify: bool | str = True, interval: Optional[float] = None, progress: Optional[Progress] = None,
                  **options):
    """The report's analysis of a running server or of saved scrapes, as `analyse` gives for a log;
    a server's analysis names every endpoint asked and what it answered."""
    from capdiag.analysis import analyse_facts

    if bool(url) == bool(metrics_files):
        raise InputError("give a server URL or --metrics-file (not both)")
    if interval is not None and not 0 <= interval <= MAX_INTERVAL:
        raise InputError(f"--interval {interval:g}: give 0 to {MAX_INTERVAL:g} seconds")
    if metrics_files:
        facts, chosen, answered = probe_files(metrics_files, framework, interval)
        return analyse_facts(", ".join(metrics_files), facts, chosen, answered, **options)
    token = None
    if token_env:
        token = os.environ.get(token_env)
        if not token:
            raise InputError(f"--token-env {token_env}: that environment variable is not set")
    server = Server(url, timeout=timeout, headers=headers, token=token, verify=verify)
    try:
        facts, chosen, answered = probe_server(server, framework, DEFAULT_INTERVAL if interval is None else interval,
                                               progress)
    finally:
        server.close()
    asked = tuple(dict.fromkeys(server.asked))  # a path read twice is one endpoint
    return attrs.evolve(analyse_facts(server.url, facts, chosen, answered, **options), endpoints=asked)
