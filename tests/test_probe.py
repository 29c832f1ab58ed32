"""`capdiag probe` against servers these tests start on 127.0.0.1, answering as SGLang (old and
new endpoints) and vLLM (metrics of two versions) do: tests/endpoint_cases holds the answers,
written for these tests in the frameworks' formats."""
from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from capdiag.cli import main
from capdiag.errors import InputError
from capdiag.probe import analyse_probe
from capdiag.render import render
from capdiag.report import build

CASES = Path(__file__).resolve().parent / "endpoint_cases"


class _Handler(BaseHTTPRequestHandler):
    routes: dict = {}
    seen: list = []

    def do_GET(self):  # noqa: N802 (the standard library's name)
        self.seen.append((self.path, self.headers.get("Authorization"), self.headers.get("X-Team")))
        name = self.routes.get(self.path)
        if name is None:
            self.send_response(404)
            self.end_headers()
            return
        body = name.encode() if name.startswith(("{", "not json")) else (CASES / name).read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain" if name.endswith(".txt") else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    """Start a server on 127.0.0.1 answering `routes` (path -> file in endpoint_cases); its URL."""
    servers = []

    def start(routes: dict) -> str:
        handler = type("Handler", (_Handler,), {"routes": routes, "seen": []})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.timeout = 5
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        start.seen = handler.seen
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _row(report, category):
    return next(r for r in report["breakdown"] if r["category"] == category)


def test_sglang_new_endpoints(serve):
    url = serve({"/server_info": "sglang-v054.server_info.json", "/v1/loads": "sglang-v054.v1_loads.json"})
    report = build(analyse_probe(url))
    assert report["framework"] == "sglang" and report["source"]["ready"]
    assert report["config"]["mem_fraction_static"] == 0.838 and report["config"]["tp_size"] == 2
    weights, kv, graph = _row(report, "weights"), _row(report, "kv_cache"), _row(report, "cuda_graph")
    assert (weights["gib"], kv["gib"], graph["gib"]) == (14.99, 50.74, 0.58)
    assert weights["evidence"][0]["where"] == "GET /server_info"
    assert weights["evidence"][0]["text"] == "internal_states[0].memory_usage.weight = 14.99"
    assert report["kv_pool"]["tokens"] == 415615
    at_4096 = next(c for c in report["concurrency"] if c["request_tokens"] == 4096)
    assert at_4096["max_concurrent"] == 101 and at_4096["request_limit"] == 2048
    rt = report["runtime"]
    assert [r["rank"] for r in rt["ranks"]] == ["DP0", "DP1"]
    assert rt["kv_usage"]["peak"] == 0.96 and rt["queued_requests"]["queued_at_request_limit"] == 1
    assert {f["name"] for f in report["findings"]} >= {"request-limit-binds-traffic"}
    for fmt in ("text", "markdown", "html"):
        assert "traffic lines" in render(report, fmt)
    finding = next(f for f in report["findings"] if f["name"] == "request-limit-binds-traffic")
    assert any(e["where"] == "GET /v1/loads" for e in finding["evidence"])


def test_sglang_old_endpoints_fall_back(serve):
    url = serve({"/get_server_info": "sglang-v043.get_server_info.json", "/get_load": "sglang-v043.get_load.json"})
    report = build(analyse_probe(url))
    assert serve.seen[0][0] == "/server_info" and serve.seen[1][0] == "/get_server_info"
    assert _row(report, "kv_cache")["gib"] == 53.12 and _row(report, "weights")["gib"] is None
    assert report["kv_pool"]["tokens"] == 435130
    rt = report["runtime"]
    # /get_load: num_reqs counts running and waiting; the usage is num_tokens over the capacity
    assert rt["running_requests"]["peak"] == 5 and rt["queued_requests"]["peak"] == 2
    assert rt["kv_usage"]["peak"] == round(417725 / 435130, 4)
    assert report["source"]["lines"] == 2  # endpoints that answered
    assert "RUN TIME" in render(report, "text")


def test_sglang_graph_memory_per_kind(serve):
    url = serve({"/server_info": "sglang-v059.server_info.json"})
    report = build(analyse_probe(url))
    assert _row(report, "cuda_graph")["gib"] == 1.26  # 0.91 decode + 0.35 piecewise
    assert report["runtime"] is None  # no load endpoint answered


@pytest.mark.parametrize("version, usage_name, preemptions", [("0101", "vllm:gpu_cache_usage_perc", 118),
                                                              ("0110", "vllm:kv_cache_usage_perc", 0)])
def test_vllm_metrics_of_two_versions(serve, version, usage_name, preemptions):
    url = serve({"/metrics": f"vllm-v{version}.metrics.txt", "/v1/models": f"vllm-v{version}.models.json",
                 "/version": f"vllm-v{version}.version.json"})
    report = build(analyse_probe(url))
    assert report["framework"] == "vllm"
    blocks = {"0101": 28048, "0110": 2434}[version]
    assert report["kv_pool"]["tokens"] == (blocks * 16 if version == "0101" else 38944)
    assert report["config"]["gpu_memory_utilization"] == 0.9
    assert report["config"]["max_model_len"] == {"0101": 131072, "0110": 32000}[version]
    assert report["config"]["framework_version"] == {"0101": "0.10.1.1", "0110": "0.11.0"}[version]
    rt = report["runtime"]
    assert rt["preemptions"] == (preemptions or None) or rt["preemptions"] == preemptions
    summary = next(e for f in report["findings"] for e in f["evidence"]) if report["findings"] else None
    assert usage_name in json.dumps(report)
    for fmt in ("text", "markdown", "html"):
        assert "Run time" in render(report, fmt) or "RUN TIME" in render(report, fmt)
    if version == "0101":
        assert "preemptions   118 (vLLM's running total, GET /metrics)" in render(report, "text")
        assert rt["kv_usage"]["peak"] == 0.987
        names = {f["name"] for f in report["findings"]}
        assert {"kv-capacity-binds", "kv-retractions"} <= names
        assert summary is not None


def test_two_metrics_files_make_a_series():
    later = CASES / "vllm-v0110.metrics-later.txt"
    report = build(analyse_probe(metrics_files=(str(CASES / "vllm-v0110.metrics.txt"), str(later))))
    rt = report["runtime"]
    assert rt["lines"] == 2 and [p["kv_usage"] for p in rt["series"]] == [0.214, 0.961]
    assert rt["running_requests"]["peak"] == 30 and rt["queued_requests"]["queued_while_kv_full"] == 1


def test_sglang_metrics_file():
    report = build(analyse_probe(metrics_files=(str(CASES / "sglang.metrics.txt"),)))
    assert report["framework"] == "sglang" and report["kv_pool"]["tokens"] == 415615
    assert report["runtime"]["kv_usage"]["peak"] == 0.93 and report["runtime"]["queued_requests"]["peak"] == 22


def test_header_and_token_from_the_environment(serve, monkeypatch):
    url = serve({"/server_info": "sglang-v059.server_info.json"})
    monkeypatch.setenv("SGL_TOKEN", "s3cret")
    result = CliRunner().invoke(main, ["probe", url, "--token-env", "SGL_TOKEN", "--header", "X-Team: infra",
                                       "--format", "json"], standalone_mode=False, catch_exceptions=False)
    assert json.loads(result.output)["framework"] == "sglang"
    assert serve.seen[0] == ("/server_info", "Bearer s3cret", "infra")


def test_explain_accepts_a_url(serve):
    url = serve({"/server_info": "sglang-v059.server_info.json"})
    result = CliRunner().invoke(main, ["explain", url, "--format", "json"], standalone_mode=False,
                                catch_exceptions=False)
    assert json.loads(result.output)["source"]["path"] == url


@pytest.mark.parametrize("routes, message", [
    ({}, "none of /metrics answers (404)"),
    ({"/server_info": "not json at all"}, "GET /server_info: the answer is not JSON"),
    ({"/metrics": "vllm-v0110.version.json"}, "not the Prometheus text format"),
])
def test_one_line_errors(serve, routes, message):
    url = serve(routes)
    with pytest.raises(InputError, match=re.escape(message)):
        analyse_probe(url)


class _Slow(_Handler):
    def do_GET(self):  # noqa: N802
        time.sleep(1.5)
        super().do_GET()


def test_a_server_that_does_not_answer_in_time():
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Slow,), {"routes": {}, "seen": []}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(InputError, match="no answer within 0.3 s"):
            analyse_probe(f"http://127.0.0.1:{server.server_address[1]}", timeout=0.3)
    finally:
        server.shutdown()
        server.server_close()


def test_refused_and_timeout_are_one_line(serve):
    with pytest.raises(InputError, match="cannot connect"):
        analyse_probe("http://127.0.0.1:9", timeout=2)
    with pytest.raises(InputError, match="starts with http"):
        analyse_probe("ftp://example")
    with pytest.raises(InputError, match="SGL_NOT_SET"):
        analyse_probe("http://127.0.0.1:9", token_env="SGL_NOT_SET")
