"""`capdiag probe` against servers these tests start on 127.0.0.1, answering as SGLang (old and
new endpoints) and vLLM (metrics of two versions) do: tests/endpoint_cases holds the answers,
written for these tests in the frameworks' formats."""
from __future__ import annotations

import base64
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from capdiag.cli import main
from capdiag.errors import InputError
from capdiag.parsing.prometheus import read_metrics
from capdiag.probe import analyse_probe
from capdiag.render import render
from capdiag.report import build
from capdiag.rows import plain
from helpers import run_entry

CASES = Path(__file__).resolve().parent / "endpoint_cases"


class _Handler(BaseHTTPRequestHandler):
    routes: dict = {}
    seen: list = []

    def do_GET(self):  # noqa: N802 (the standard library's name)
        self.seen.append((self.path, self.headers.get("Authorization"), self.headers.get("X-Team")))
        name = self.routes.get(self.path)
        if isinstance(name, list):  # answers in turn, the last one from then on
            name = name.pop(0) if len(name) > 1 else name[0]
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
    report = build(analyse_probe(url, interval=0))
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
    # one reading (--interval 0), named by the UTC time its answer came
    assert rt["readings"] == 1 and rt["seconds"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", rt["first_time"])
    for fmt in ("text", "markdown", "html"):
        assert f"1 reading of the server's endpoints: {rt['first_time']}" in render(report, fmt)
    finding = next(f for f in report["findings"] if f["name"] == "request-limit-binds-traffic")
    assert any(e["where"] == "GET /v1/loads" for e in finding["evidence"])


def test_sglang_old_endpoints_fall_back(serve):
    url = serve({"/get_server_info": "sglang-v043.get_server_info.json", "/get_load": "sglang-v043.get_load.json"})
    report = build(analyse_probe(url, interval=0))
    assert serve.seen[0][0] == "/server_info" and serve.seen[1][0] == "/get_server_info"
    assert _row(report, "kv_cache")["gib"] == 53.12 and _row(report, "weights")["gib"] is None
    assert report["kv_pool"]["tokens"] == 435130
    rt = report["runtime"]
    # /get_load: num_reqs counts running and waiting; the usage is num_tokens over the capacity
    assert rt["running_requests"]["peak"] == 5 and rt["queued_requests"]["peak"] == 2
    assert rt["kv_usage"]["peak"] == round(417725 / 435130, 4)
    assert report["source"]["lines"] == 2 and report["source"]["read_from"] == "endpoints"  # endpoints that answered
    assert "http://127.0.0.1:" in render(report, "text").splitlines()[1]
    assert "read GET /get_server_info, GET /get_load; not answered: /server_info (404), /v1/loads (404), /metrics (404)" \
        in " ".join(render(report, "text").split())
    assert "RUN TIME" in render(report, "text")


def test_sglang_graph_memory_per_kind(serve):
    url = serve({"/server_info": "sglang-v059.server_info.json"})
    report = build(analyse_probe(url, interval=0))
    assert _row(report, "cuda_graph")["gib"] == 1.26  # 0.91 decode + 0.35 piecewise
    assert report["runtime"] is None  # no load endpoint answered


@pytest.mark.parametrize("version, usage_name, preemptions", [("0101", "vllm:gpu_cache_usage_perc", 118),
                                                              ("0110", "vllm:kv_cache_usage_perc", 0)])
def test_vllm_metrics_of_two_versions(serve, version, usage_name, preemptions):
    url = serve({"/metrics": f"vllm-v{version}.metrics.txt", "/v1/models": f"vllm-v{version}.models.json",
                 "/version": f"vllm-v{version}.version.json"})
    report = build(analyse_probe(url, interval=0))
    assert report["framework"] == "vllm"
    blocks = {"0101": 28048, "0110": 2434}[version]
    assert report["kv_pool"]["tokens"] == (blocks * 16 if version == "0101" else 38944)
    assert report["config"]["gpu_memory_utilization"] == 0.9
    assert report["config"]["max_model_len"] == {"0101": 131072, "0110": 32000}[version]
    assert report["config"]["framework_version"] == {"0101": "0.10.1.1", "0110": "0.11.0"}[version]
    rt = report["runtime"]
    assert rt["preemptions"] == (preemptions or None) or rt["preemptions"] == preemptions
    summary = next(e for f in report["findings"] for e in f["evidence"]) if report["findings"] else None
    assert usage_name in json.dumps(report, default=plain)
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
                                       "--format", "json", "--interval", "0"], standalone_mode=False, catch_exceptions=False)
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
        analyse_probe(url, interval=0)


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


DP2 = ["vllm-v1-dp2.metrics-1.txt", "vllm-v1-dp2.metrics-2.txt"]


def test_two_scrapes_of_a_live_server_give_rates(serve):
    """/metrics is read twice, --interval apart: the counters' increase over the measured time."""
    url = serve({"/metrics": list(DP2), "/v1/models": "vllm-v1-dp2.models.json"})
    started = time.monotonic()
    report = build(analyse_probe(url, interval=0.3))
    assert time.monotonic() - started < 5
    assert [p for p, *_ in serve.seen].count("/metrics") == 2
    rates = report["runtime"]["rates"]
    assert rates["scrapes"] == 2 and 0.3 <= rates["seconds"] < 5
    preempted = rates["counters"]["preemptions"]
    assert (preempted["metric"], preempted["first"], preempted["last"], preempted["increase"]) == (
        "vllm:num_preemptions_total", 10, 35, 25)
    assert preempted["per_second"] == round(25 / rates["seconds"], 3)
    # vllm:request_success_total is one counter per finished_reason: added
    assert rates["counters"]["requests"]["increase"] == 65
    # kv_cache_max_concurrency is the pool's requests at max_model_len: checked against the pool
    check = report["kv_pool"]["concurrency_check"] if "concurrency_check" in report["kv_pool"] else None
    text = json.dumps(report, default=plain)
    assert "kv_cache_max_concurrency=13.87 (at max_model_len 32768)" in text
    assert check is None or check["agree"]
    finding = next(f for f in report["findings"] if f["name"] == "kv-retractions")
    assert "25 in the" in finding["message"] and "2 scrapes" not in finding["message"]
    # the header names the two scrapes by the UTC time each came, and the measured time between
    rt = report["runtime"]
    assert rt["readings"] == 2 and rt["seconds"] == rates["seconds"] and rt["first_time"].endswith(" UTC")
    header = " ".join(render(report, "text").split())
    assert (f"RUN TIME (2 readings of the server's endpoints: {rt['first_time']} and {rt['last_time']}, "
            f"{rates['seconds']:g} s apart, 2 ranks together)") in header


def test_one_scrape_leaves_rates_unknown_with_the_reason(serve):
    url = serve({"/metrics": list(DP2)})
    rates = build(analyse_probe(url, interval=0))["runtime"]["rates"]
    assert rates["scrapes"] == 1 and rates["seconds"] is None
    assert rates["unknown_reason"] == "one scrape (--interval 0): a rate needs two"
    assert all(c["per_second"] is None and c["increase"] is None for c in rates["counters"].values())


def test_saved_scrapes_need_their_interval():
    files = tuple(str(CASES / name) for name in DP2)
    rates = build(analyse_probe(metrics_files=files))["runtime"]["rates"]
    assert rates["seconds"] is None and "give --interval" in rates["unknown_reason"]
    assert rates["counters"]["preemptions"]["increase"] == 25  # the increase is known, the rate is not
    report = build(analyse_probe(metrics_files=files, interval=10))
    rates = report["runtime"]["rates"]
    assert rates["seconds"] == 10 and rates["counters"]["generation_tokens"]["per_second"] == 3000.0
    # the scrapes are named by their files, and the interval is the one given
    header = " ".join(render(report, "text").split())
    assert ("RUN TIME (2 readings of the server's endpoints: vllm-v1-dp2.metrics-1.txt and "
            "vllm-v1-dp2.metrics-2.txt, 10 s apart, 2 ranks together)") in header
    header = " ".join(render(build(analyse_probe(metrics_files=files)), "text").split())
    assert "vllm-v1-dp2.metrics-2.txt, the time between them unknown" in header
    # queries and hits as vLLM 0.9–0.10 export them under both names are counted once
    assert rates["counters"]["prefix_cache_queries"]["increase"] == 90000 and rates["prefix_cache_hit_rate"] == 0.4444


def test_a_counter_that_went_down_means_a_restart(tmp_path):
    older, newer = (CASES / name for name in DP2)
    files = (str(newer), str(older))  # the "later" scrape has the smaller counters
    rates = build(analyse_probe(metrics_files=files, interval=10))["runtime"]["rates"]
    assert rates["counters"]["preemptions"]["per_second"] is None
    assert "restarted" in rates["counters"]["preemptions"]["unknown_reason"]


def test_request_lengths_from_the_histograms():
    files = tuple(str(CASES / name) for name in DP2)
    report = build(analyse_probe(metrics_files=files, interval=10))
    lengths = report["runtime"]["observed_lengths"]
    prompt, generated = lengths["prompt_length"], lengths["generation_length"]
    # both engines' histograms added: (1254000 + 572000) / (1045 + 520) tokens per prompt
    assert (prompt["requests"], prompt["mean"]) == (1565, round(1826000 / 1565))
    assert prompt["p50"] == {"above": 500, "at_most": 1000} and prompt["p90"] == {"above": 2000, "at_most": 5000}
    assert generated["mean"] == round(615600 / 1565) and generated["longest_at_most"] == 2000
    assert lengths["mean_request_tokens"] == prompt["mean"] + generated["mean"]
    assert lengths["concurrency_at_mean_request"] == 454464 // lengths["mean_request_tokens"]
    binds = next(f for f in report["findings"] if f["name"] == "kv-capacity-binds")
    assert "At the observed mean finished request of 1,560 tokens (prompt + generated) the pool holds 291" in binds["message"]
    lengths_finding = next(f for f in report["findings"] if f["name"] == "observed-lengths")
    assert "mean finished request of 1,560 tokens (prompt + generated) the KV pool holds 291" in lengths_finding["message"]
    assert "prompts mean 1,167 tokens, p90 2,000–5,000" in lengths_finding["message"]
    assert any(e["where"].startswith("metrics file") and "vllm:request_prompt_tokens" in e["text"]
               for e in lengths_finding["evidence"])
    engine0 = report["runtime"]["ranks"][0]["observed_lengths"]["prompt_length"]
    assert engine0["requests"] == 1045 and engine0["mean"] == 1200
    text = " ".join(render(report, "text").split())
    assert "the pool holds 291 such requests at once" in text and "p90 2000–5000" in text


def test_sglang_counters_and_histograms_with_its_load(serve):
    """SGLang with --enable-metrics: the load endpoint gives the state, /metrics the counters
    (retractions) and the token histograms; one scheduler per DP rank is read even when every
    TP rank exports."""
    url = serve({"/server_info": "sglang-v054.server_info.json", "/v1/loads": "sglang-v054.v1_loads.json",
                 "/metrics": ["sglang-v05x.metrics-1.txt", "sglang-v05x.metrics-2.txt"]})
    report = build(analyse_probe(url, interval=0.2))
    rt = report["runtime"]
    assert rt["lines"] == 4  # two loads answers, two DP ranks
    retracted = rt["rates"]["counters"]["retractions"]
    assert (retracted["metric"], retracted["increase"]) == ("sglang:num_retracted_requests_total", 6)
    assert rt["observed_lengths"]["prompt_length"]["metric"] == "sglang:prompt_tokens_histogram"
    # the radix cache served 100000 of the 250000 prompt tokens between the two reads
    assert rt["rates"]["prefix_cache_hit_rate"] == 0.4 and rt["rates"]["counters"]["cached_tokens"]["increase"] == 100000
    # SGLang's tokenizer counts for all DP ranks (no rank label): with all of them, not with one
    assert "cached_tokens" not in rt["ranks"][0]["rates"]["counters"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('vllm:sgang_ #{}="le,+Inf0123456789.e-\n TYPEHELPcountertotalbucket')),
               max_size=300))
def test_any_scrape_text_is_read_or_refused_in_one_line(text):
    try:
        samples = read_metrics(text, "scrape.txt")
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    assert all(s.framework in ("vllm", "sglang") for s in samples)


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats() | st.sampled_from([float("inf")])
                     | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                         st.sampled_from(["loads", "dp_rank", "num_running_reqs", "num_waiting_reqs", "num_reqs",
                                          "num_tokens", "token_usage", "gen_throughput", "internal_states",
                                          "memory_usage", "weight", "kvcache", "token_capacity", "graph"]),
                         inner, max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(answer=_JSON)
def test_any_answer_shape_is_read_or_refused_in_one_line(answer):
    from capdiag.parsing import endpoints as E
    from capdiag.probe import _read

    for reader, args in ((E.sglang_loads, ([answer, answer], "GET /v1/loads", 1000)),
                         (E.sglang_server_info, (answer, "GET /server_info"))):
        try:
            _read(reader, *args)
        except InputError as exc:
            assert "\n" not in str(exc)


def test_saved_scrapes_with_timestamps_are_named_by_them(tmp_path):
    """A scrape whose samples carry Prometheus timestamps (milliseconds) names its reading by
    the file and that time, and the time between the scrapes is theirs."""
    files = []
    for n, (stamp, running) in enumerate(((1764601200000, 40), (1764601230000, 44)), start=1):
        path = tmp_path / f"scrape-{n}.txt"
        path.write_text("# TYPE vllm:num_requests_running gauge\n"
                        f'vllm:num_requests_running{{engine="0"}} {running} {stamp}\n'
                        "# TYPE vllm:num_requests_waiting gauge\n"
                        f'vllm:num_requests_waiting{{engine="0"}} 0 {stamp}\n')
        files.append(str(path))
    rt = build(analyse_probe(metrics_files=tuple(files)))["runtime"]
    assert (rt["first_time"], rt["last_time"], rt["seconds"]) == (
        "scrape-1.txt (2025-12-01 15:00:00 UTC)", "scrape-2.txt (2025-12-01 15:00:30 UTC)", 30.0)
    assert rt["running_requests"]["peak"] == 44


def test_credentials_in_the_url_are_sent_never_shown(serve):
    url = serve({"/server_info": "sglang-v059.server_info.json"})
    secret = url.replace("http://", "http://admin:pa55word@")
    result = CliRunner().invoke(main, ["probe", secret, "--format", "json", "--interval", "0"], standalone_mode=False,
                                catch_exceptions=False)
    assert "pa55word" not in result.output and json.loads(result.output)["source"]["path"] == url
    assert serve.seen[0][1] == "Basic " + base64.b64encode(b"admin:pa55word").decode()
    text = CliRunner().invoke(main, ["probe", secret, "--interval", "0"], standalone_mode=False).output
    assert "pa55word" not in text and url in text
    with pytest.raises(InputError) as refused:  # and in no error either
        analyse_probe(serve({}).replace("http://", "http://admin:pa55word@"), interval=0)
    assert "pa55word" not in str(refused.value) and "none of /metrics answers" in str(refused.value)


@pytest.mark.parametrize("url", ["http://admin:pa/ss@127.0.0.1:18399", "http://admin:pass word@[::1",
                                 "http://admin:s3cr3t@[::1", "https://u:p@ss@host:9x"])
def test_a_password_that_breaks_the_url_is_shown_in_no_error(url):
    """A password with `/`, a space or `@` the user did not percent-encode makes the URL one the
    parser refuses — and its reason quotes the piece it choked on (`Invalid port: 'pa'`)."""
    with pytest.raises(InputError) as refused:
        analyse_probe(url, interval=0)
    said = str(refused.value)
    password = url.split("://", 1)[1].rsplit("@", 1)[0].split(":", 1)[1]
    pieces = password.replace("/", " ").replace("@", " ").split()
    assert "***@" in said and password not in said and not any(f"'{piece}" in said for piece in pieces), said


class _Redirect(_Handler):
    target = ""

    def do_GET(self):  # noqa: N802
        self.send_response(302)
        self.send_header("Location", self.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_headers_stay_with_the_servers_own_origin(serve):
    elsewhere = serve({"/server_info": "sglang-v059.server_info.json"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Redirect,), {"routes": {}, "seen": [],
                                                                                  "target": elsewhere}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        analyse_probe(f"http://127.0.0.1:{server.server_address[1]}", headers=("X-Team: infra",), interval=0)
    finally:
        server.shutdown()
        server.server_close()
    assert serve.seen[0] == ("/server_info", None, None)  # the other origin got neither header


class _Dribble(_Handler):
    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        for _ in range(200):
            self.wfile.write(b"#")
            self.wfile.flush()
            time.sleep(0.05)


def test_a_server_that_sends_slowly_is_stopped_at_the_deadline():
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Dribble,), {"routes": {}, "seen": []}))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    began = time.monotonic()
    try:
        with pytest.raises(InputError, match="the answer did not end within 1 s"):
            analyse_probe(f"http://127.0.0.1:{server.server_address[1]}", timeout=1, interval=0)
    finally:
        server.shutdown()
        server.server_close()
    assert time.monotonic() - began < 5


@pytest.mark.parametrize("url, headers, token, message", [
    ("http://[::1", (), None, "http://[::1: not a valid URL"),
    ("http://127.0.0.1:9/\r\nX: y", (), None, "not a valid URL"),
    ("http://127.0.0.1:9", ("X-Key: s3cr\u00e9t",), None, "--header 'X-Key': a header holds printable ASCII only"),
    ("http://127.0.0.1:9", ("Authorization Bearer s3cret",), None, "--header: write it as 'Name: value'"),
    ("http://127.0.0.1:9", (), "s3cret\r", "the token holds a control or non-ASCII character"),
])
def test_bad_urls_headers_and_tokens_are_one_line_without_the_secret(url, headers, token, message, monkeypatch):
    if token:
        monkeypatch.setenv("CAPDIAG_TEST_TOKEN", token)
    with pytest.raises(InputError) as refused:
        analyse_probe(url, headers=headers, token_env="CAPDIAG_TEST_TOKEN" if token else None, timeout=1, interval=0)
    said = str(refused.value)
    assert message in said and "s3cr" not in said and "\n" not in said and "\r" not in said


# ---- a probe's report speaks of the server, not of a log (issue 32) -----------------------------

def test_a_probe_report_speaks_of_the_server_and_names_what_did_not_answer(serve):
    url = serve({"/server_info": "sglang-v054.server_info.json", "/v1/loads": "sglang-v054.v1_loads.json"})
    report = build(analyse_probe(url, interval=0))
    assert report["source"]["endpoints"] == [{"path": "/server_info", "status": 200},
                                             {"path": "/v1/loads", "status": 200}, {"path": "/metrics", "status": 404}]
    text = render(report, "text")
    head = text.splitlines()
    assert head[0] == "capdiag — SGLang server memory report, from its endpoints"
    assert head[1] == f"{url}: read GET /server_info, GET /v1/loads; not answered: /metrics (404)"
    assert "SERVING CONFIGURATION (as the server states it)" in text and "as the log states it" not in text
    assert "the log has no" not in text and "the log prints no" not in text
    framework = _row(report, "framework")["derivation"]
    assert framework == ("the free memory before the weights load is not stated for this rank (the start-up "
                         "log's `Load weight begin` line)")
    assert "WHAT THE ENDPOINTS ANSWERED" in text and "STARTUP EVIDENCE" not in text and "\n  line 0 " not in text
    assert "\n  GET /server_info " in text and "PER RANK (as the server reports it)" in text
    for fmt in ("markdown", "html"):
        page = render(report, fmt)
        assert "not answered: /metrics (404)" in page and "as the log states it" not in page


def test_a_probe_without_memory_figures_draws_no_empty_bars(serve):
    url = serve({"/metrics": "vllm-v0110.metrics.txt", "/v1/models": "vllm-v0110.models.json",
                 "/version": "vllm-v0110.version.json"})
    report = build(analyse_probe(url, interval=0, gpu="h200"))
    text = render(report, "text")
    assert "MEMORY PER RANK" not in text and "no memory figure printed" not in text
    # the rest of the GPU is not claimed while the rows it is the rest of are unknown
    unstated = _row(report, "unstated")
    assert unstated["gib"] is None and unstated["derivation"].startswith("needs the weights and the KV cache")
    assert "read GET /metrics, GET /version, GET /v1/models; not answered: /server_info (404)" in " ".join(text.split())


def test_figures_beyond_the_gpu_named_are_a_finding(serve):
    """--gpu l4 (22.49 GiB) for a server whose KV pool alone is 50.74 GiB: the GPU named is wrong."""
    url = serve({"/server_info": "sglang-v054.server_info.json", "/v1/loads": "sglang-v054.v1_loads.json"})
    report = build(analyse_probe(url, interval=0, gpu="l4"))
    finding = next(f for f in report["findings"] if f["code"] == "CD132")
    assert finding["severity"] == "warning"
    assert "sum to 66.31 GiB (weights 14.99 + kv_cache 50.74 + cuda_graph 0.58)" in finding["message"]
    assert "kv_cache alone is 225.6% of it" in finding["message"]
    assert build(analyse_probe(url, interval=0, gpu="h200"))["findings"] and not any(
        f["code"] == "CD132" for f in build(analyse_probe(url, interval=0, gpu="h200"))["findings"])


def test_the_probe_says_what_it_waits_for(serve):
    import capdiag
    said = []
    url = serve({"/server_info": "sglang-v054.server_info.json", "/v1/loads": "sglang-v054.v1_loads.json"})
    capdiag.api.probe(url, interval=0.2, progress=said.append)
    assert said == ["waiting 0.2 s to read /v1/loads again (--interval; 0 reads once)", ""]


def test_the_progress_line_is_drawn_on_a_terminal_only():
    from capdiag.terminal import progress_line

    class Terminal(list):
        def isatty(self):
            return True

        def write(self, text):
            self.append(text)

        def flush(self):
            pass

    screen = Terminal()
    show = progress_line(screen)
    show("waiting 5 s")
    show("")
    assert screen == ["\r\x1b[Kwaiting 5 s", "\r\x1b[K"]
    import io
    assert progress_line(io.StringIO()) is None  # a pipe or a CI log gets no line drawn over itself


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-2", "7.5", "1e309", "1" + "0" * 308])
def test_a_gauge_that_is_no_figure_is_left_out(value, tmp_path, monkeypatch, capsys):
    """NaN, infinities, negatives, a usage above 1 and counts past what a float holds exactly are
    values the scrape does not give: left out, never a finding, a traceback or bare NaN in JSON."""
    text = (CASES / "vllm-v0110.metrics.txt").read_text()
    text = re.sub(r"^(vllm:kv_cache_usage_perc\{[^}]*\}) .*$", rf"\1 {value}", text, flags=re.M)
    text = re.sub(r"^(vllm:num_preemptions_total\{[^}]*\}) .*$", rf"\1 {value}", text, flags=re.M)
    scrape = tmp_path / "metrics.txt"
    scrape.write_text(text)
    code, out, err = run_entry(monkeypatch, capsys, "probe", "--metrics-file", str(scrape), "--format", "json")
    assert code == 0 and "Traceback" not in err

    def refuse(constant):
        raise AssertionError(f"{constant} in the JSON report")
    report = json.loads(out, parse_constant=refuse)
    usage = (report["runtime"] or {}).get("kv_usage")
    assert usage is None or all(0 <= usage[k] <= 1 for k in ("peak", "p50", "p90", "p99") if usage.get(k) is not None)
    assert not any(f["code"] in ("CD126", "CD128") and value in f["message"] for f in report["findings"])
    code, out, err = run_entry(monkeypatch, capsys, "probe", "--metrics-file", str(scrape))
    assert code == 0 and "Traceback" not in err and " nan" not in out.lower() and "inf %" not in out.lower()


@pytest.mark.parametrize("body, words", [
    ('{"a": ' + "[" * 100000 + "]" * 100000 + "}", "the answer is not JSON"),  # past Python's recursion limit
    ('{"a": ' * 200 + "1" + "}" * 200, "nests deeper than"),
    ('{"max_total_num_tokens": NaN}', "holds a number that is not finite"),
    ('{"x": ' + "9" * 5001 + "}", "the answer is not JSON"),
])
def test_an_answer_too_deep_or_not_finite_is_one_line(body, words, serve, monkeypatch, capsys):
    url = serve({"/server_info": body})
    code, _, err = run_entry(monkeypatch, capsys, "probe", url, "--interval", "0")
    assert code == 2 and words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_metrics_file_is_read_bounded(tmp_path, monkeypatch, capsys):
    """/dev/zero, or a runaway file, is refused at the bound a live answer has; a gzipped scrape
    is read as the scrape it holds."""
    import gzip
    code, _, err = run_entry(monkeypatch, capsys, "probe", "--metrics-file", "/dev/zero")
    assert code == 2 and "/dev/zero: larger than 64 MiB, not a metrics file" in err
    packed = tmp_path / "metrics.txt.gz"
    packed.write_bytes(gzip.compress((CASES / "vllm-v0110.metrics.txt").read_bytes()))
    code, out, _ = run_entry(monkeypatch, capsys, "probe", "--metrics-file", str(packed), "--format", "json")
    assert code == 0 and json.loads(out)["kv_pool"]["tokens"] == 38944


@pytest.mark.parametrize("change", ["drop", "NaN"])
def test_an_engine_without_a_kv_gauge_beside_one_with_it(change, tmp_path):
    """A data-parallel scrape where engine 1 gives no KV usage (the gauge missing, or NaN, which
    is left out): the engines' lines merge with that figure unprinted — it was a TypeError."""
    lines = []
    for line in (CASES / "vllm-v1-dp2.metrics-1.txt").read_text().splitlines():
        if line.startswith('vllm:kv_cache_usage_perc{') and 'engine="1"' in line:
            if change == "drop":
                continue
            line = line.rsplit(" ", 1)[0] + " NaN"
        lines.append(line)
    scrape = tmp_path / "scrape.txt"
    scrape.write_text("\n".join(lines) + "\n")
    runtime = build(analyse_probe(metrics_files=(str(scrape),)))["runtime"]
    assert runtime["kv_usage"]["peak"] == 0.72 and runtime["lines"] == 2
