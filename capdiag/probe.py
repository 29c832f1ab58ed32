"""`capdiag probe`: read a running server's own endpoints (or saved scrapes of its `/metrics`)
into the facts a start-up log gives, and analyse them like one.

SGLang answers `/server_info` (`/get_server_info` before it was renamed) and `/v1/loads`
(`/get_load` before); vLLM `/metrics`, `/v1/models` and `/version`. Which one the server is
shows from what answers, unless `framework` says.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from capdiag import facts as F
from capdiag.endpoints import Server
from capdiag.errors import InputError
from capdiag.parsing import endpoints as E
from capdiag.parsing.prometheus import read_metrics


def probe_server(server: Server, framework: Optional[str] = None) -> tuple[list[F.Fact], str, int]:
    """The facts a running server's endpoints give; its framework; how many endpoints answered."""
    if framework != "vllm":
        info = server.get("/server_info", "/get_server_info", required=framework == "sglang")
        if info is not None:
            facts = _read(E.sglang_server_info, info.json(), f"GET {info.path}")
            budget = next((f for f in facts if isinstance(f, F.TokenBudget)), None)
            loads = server.get("/v1/loads", "/get_load", required=False)
            answered = 1
            if loads is not None:
                facts += _read(E.sglang_loads, loads.json(), f"GET {loads.path}",
                               budget.max_total_num_tokens if budget else None)
                answered += 1
            return facts, "sglang", answered
    metrics = server.get("/metrics")
    samples = read_metrics(metrics.text, f"GET {server.url}/metrics")
    if not any(s.framework == "vllm" for s in samples):
        raise InputError(f"{server.url}: /metrics holds no vLLM metric, and /server_info does not answer: "
                         "neither an SGLang nor a vLLM server")
    facts, answered = [], 1
    # the version and the model first: they open a start-up, and the figures belong to it
    for path, reader in (("/version", E.vllm_version), ("/v1/models", E.vllm_models)):
        reply = server.get(path, required=False)
        if reply is not None:
            facts += _read(reader, reply.json(), f"GET {path}")
            answered += 1
    facts += E.vllm_metrics([[s for s in samples if s.framework == "vllm"]], "GET /metrics")
    return facts, "vllm", answered


def probe_files(paths: tuple[str, ...], framework: Optional[str] = None) -> tuple[list[F.Fact], str, int]:
    """Saved scrapes of `/metrics`, oldest first (two or more make the run-time series)."""
    scrapes = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise InputError(f"{path}: cannot be read ({exc.strerror})") from None
        scrapes.append(read_metrics(text, path))
    found = {s.framework for scrape in scrapes for s in scrape}
    chosen = framework or ("vllm" if "vllm" in found else "sglang" if "sglang" in found else None)
    if chosen is None:
        raise InputError(f"{paths[0]}: no vLLM or SGLang metric in the scrape")
    mine = [[s for s in scrape if s.framework == chosen] for scrape in scrapes]
    name = "metrics file " + ", ".join(Path(p).name for p in paths)
    reader = E.vllm_metrics if chosen == "vllm" else E.sglang_metrics
    return reader(mine, name), chosen, len(paths)


def _read(reader, payload, endpoint: str, *extra):
    """A reader over an answer; an answer of an unexpected shape is one line, not a traceback."""
    try:
        return reader(payload, endpoint, *extra)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise InputError(f"{endpoint}: an answer of an unexpected shape ({exc})") from None


def analyse_probe(url: Optional[str] = None, metrics_files: tuple[str, ...] = (), *, framework: Optional[str] = None,
                  headers: tuple[str, ...] = (), token_env: Optional[str] = None, timeout: float = 10.0,
                  verify: bool | str = True, **options):
    """The report's analysis of a running server or of saved scrapes, as `analyse` gives for a log."""
    from capdiag.analysis import analyse_facts

    if bool(url) == bool(metrics_files):
        raise InputError("give a server URL or --metrics-file (not both)")
    if metrics_files:
        facts, chosen, answered = probe_files(metrics_files, framework)
        return analyse_facts(", ".join(metrics_files), facts, chosen, answered, **options)
    token = None
    if token_env:
        token = os.environ.get(token_env)
        if not token:
            raise InputError(f"--token-env {token_env}: that environment variable is not set")
    server = Server(url, timeout=timeout, headers=headers, token=token, verify=verify)
    try:
        facts, chosen, answered = probe_server(server, framework)
    finally:
        server.close()
    return analyse_facts(url, facts, chosen, answered, **options)
