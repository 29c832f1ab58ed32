"""The shared corpus of real vLLM logs, scored against hand-checked truth the way
../shared/tools/corpus_check.py scores `capdiag explain --format json` (same keys, same
tolerances), one log per test so a regression names its log. Also: framework detection on
both corpora, the vLLM start-up evidence section, and the two-attempt log. Skipped without
../shared.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capdiag.analysis import analyse, read_log
from capdiag.parsing.sglang import parse_sglang_line
from capdiag.parsing.vllm import parse_vllm_line
from capdiag.render import render
from capdiag.report import build
from capdiag.source import candidate_lines, physical_lines
from helpers import (SGLANG_CORPUS, SHARED, breakdown_gib, check_breakdown_row, close, corpus_id,
                     corpus_report, max_concurrent, truth_same)

VLLM_CORPUS = SHARED / "corpus" / "vllm"

# as in corpus_check.py
VLLM_CONFIG = {"version": "framework_version", "tp_size": "tp_size", "model": "model",
               "gpu_memory_utilization": "gpu_memory_utilization", "kv_cache_dtype": "kv_cache_dtype",
               "max_model_len": "max_model_len"}
VLLM_OBSERVED = ["model_loading_gib", "available_kv_cache_gib", "kv_cache_tokens", "graph_capture_gib",
                 "gpu_blocks", "total_gpu_memory_gib"]


def _logs(folder: Path, with_truth: bool) -> list[Path]:
    if not folder.is_dir():
        return []
    logs = sorted(folder.glob("*.log"))
    return [p for p in logs if not with_truth or truth_path(p).exists()]


def truth_path(log: Path) -> Path:
    return log.with_name(log.name[: -len(".log")] + ".truth.json")


LOGS = _logs(VLLM_CORPUS, True)
ALL_VLLM = _logs(VLLM_CORPUS, False)
ALL_SGLANG = _logs(SGLANG_CORPUS, False)
if not LOGS:
    pytestmark = pytest.mark.skip(reason="shared vLLM corpus (../shared) is absent")


def by_id(prefix: str) -> Path:
    return next(p for p in ALL_VLLM if p.name.startswith(prefix + "-"))


def truth_for(log: Path) -> dict:
    return json.loads(truth_path(log).read_text())


# Where capdiag and the truth file differ on purpose: (log id, key) -> capdiag's value.
KNOWN_DIFFERENCES = {
    # ≤0.11.0 prints one `GPU KV cache size` per worker and the engine runs with the least;
    # capdiag takes that minimum (1,590,736 // 4096 = 388) where the truth file takes the
    # first printed line (1,594,928 // 4096 = 389).
    ("018", "concurrency@4096"): 388,
}


@pytest.mark.parametrize("log", LOGS, ids=corpus_id)
def test_framework_and_schema(log):
    truth, report = truth_for(log), corpus_report(str(log))
    assert truth["framework"] == "vllm"
    assert report["framework"] == "vllm" and report["schema"] == "capdiag.report/1"
    for key in ("source", "config", "gpu", "observed", "ranks", "breakdown", "concurrency", "findings",
                "framework_evidence"):
        assert key in report


@pytest.mark.parametrize("log", LOGS, ids=corpus_id)
def test_config(log):
    truth, config = truth_for(log), corpus_report(str(log))["config"]
    scored = [(tk, rk) for tk, rk in VLLM_CONFIG.items() if truth.get(tk) is not None]
    bad = [f"{rk}: want {truth[tk]!r}, got {config.get(rk)!r}" for tk, rk in scored
           if not truth_same(truth[tk], config.get(rk))]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("log", LOGS, ids=corpus_id)
def test_observed_rank0(log):
    truth, report = truth_for(log), corpus_report(str(log))
    got = report.get("observed") or {}
    bad = []
    for key in VLLM_OBSERVED:
        known = KNOWN_DIFFERENCES.get((corpus_id(log), key), "-")
        if known != "-":
            if got.get(key) != known:
                bad.append(f"{key}: capdiag's known value is {known!r}, got {got.get(key)!r}")
        elif truth.get(key) is None:
            if got.get(key) is not None:
                bad.append(f"{key}: invented {got.get(key)!r} (the log shows no value for rank 0)")
        elif not truth_same(truth[key], got.get(key)):
            bad.append(f"{key}: want {truth[key]!r}, got {got.get(key)!r}")
    mc = truth.get("max_concurrency") or {}
    for key, want in (("max_concurrency_tokens", mc.get("tokens")), ("max_concurrency_x", mc.get("x"))):
        if want is not None and not truth_same(want, got.get(key)):
            bad.append(f"{key}: want {want!r}, got {got.get(key)!r}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("log", LOGS, ids=corpus_id)
def test_derived(log):
    truth, report = truth_for(log), corpus_report(str(log))
    bad = []
    weights = truth.get("model_loading_gib")
    if weights is not None and not close(weights, breakdown_gib(report, "weights")):
        bad.append(f"breakdown.weights: want {weights}, got {breakdown_gib(report, 'weights')}")
    kv = truth.get("available_kv_cache_gib")
    if kv is not None and kv >= 0 and not close(kv, breakdown_gib(report, "kv_cache")):
        bad.append(f"breakdown.kv_cache: want {kv}, got {breakdown_gib(report, 'kv_cache')}")
    graphs = truth.get("graph_capture_gib")
    if graphs is not None and graphs >= 0 and not close(graphs, breakdown_gib(report, "cuda_graph")):
        bad.append(f"breakdown.cuda_graph: want {graphs}, got {breakdown_gib(report, 'cuda_graph')}")
    if truth.get("kv_cache_tokens") is not None and truth.get("attempts") is None:
        want = truth["kv_cache_tokens"] // 4096
        if truth.get("max_num_seqs") is not None:  # as the scorer: the scheduler runs at most max_num_seqs
            want = min(want, truth["max_num_seqs"])
        want = KNOWN_DIFFERENCES.get((corpus_id(log), "concurrency@4096"), want)
        if max_concurrent(report, 4096) != want:
            bad.append(f"concurrency@4096: want {want}, got {max_concurrent(report, 4096)}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("log", LOGS, ids=corpus_id)
def test_breakdown_rows_are_consistent(log):
    """Every row is measured/derived with a number and cited lines, or unknown with a reason."""
    for row in corpus_report(str(log))["breakdown"]:
        check_breakdown_row(row)


# ---- the two known differences, spelled out ---------------------------------------------------

def test_018_takes_the_least_of_the_per_worker_kv_sizes():
    truth, report = truth_for(by_id("018")), corpus_report(str(by_id("018")))
    printed = truth["kv_cache_tokens_all_printed"]
    assert report["kv_pool"]["tokens"] == min(printed) == 1590736
    assert "least of 8 per-worker lines" in report["kv_pool"]["derivation"]["tokens"]
    assert max_concurrent(report, 4096) == 1590736 // 4096 == 388
    assert truth["kv_cache_tokens"] // 4096 == 389  # the truth file's figure, from the first line printed
    # the observed value stays the first line printed, as the truth has it
    assert report["observed"]["kv_cache_tokens"] == truth["kv_cache_tokens"] == 1594928


def test_407_total_is_printed_by_a_worker_only():
    """No driver line: the one worker that printed the profiling record stands in for TP0, and the
    workers' weight figures disagree, so TP0's weights stay unknown with the spread named."""
    truth, report = truth_for(by_id("407")), corpus_report(str(by_id("407")))
    assert truth["total_gpu_memory_gib"] == 23.58
    assert report["observed"]["total_gpu_memory_gib"] == 23.58
    assert report["observed"]["model_loading_gib"] is None
    worker = next(r for r in report["ranks"] if r["rank"]["process"] == "VllmWorkerProcess pid=280")
    assert worker["observed"]["total_gpu_memory_gib"] == 23.58
    stand = {s["kind"]: s for s in report["stand_ins"]}
    assert stand["memory-profiling"]["rank"] == "VllmWorkerProcess pid=280"
    assert stand["`Model loading took`"]["rank"] is None
    assert "18.3843 vs 19.5904" in stand["`Model loading took`"]["derivation"]
    weights = next(r for r in report["breakdown"] if r["category"] == "weights")
    assert weights["gib"] is None and "disagree" in weights["derivation"]
    # the GPU total still comes from that line
    assert report["gpu"]["total_gib"] == 23.58 and report["gpu"]["total_source"] == "log"


# ---- framework detection on both corpora ------------------------------------------------------

@pytest.mark.parametrize("log", ALL_VLLM, ids=corpus_id)
def test_vllm_logs_are_detected_as_vllm(log):
    _, framework, _ = read_log(str(log))
    assert framework == "vllm"


@pytest.mark.parametrize("log", ALL_SGLANG, ids=corpus_id)
def test_sglang_logs_are_detected_as_sglang(log):
    _, framework, _ = read_log(str(log))
    assert framework == "sglang"


# ---- the vLLM start-up evidence section -------------------------------------------------------

def _vllm_statements(path: str, first: int, last: int) -> list[tuple[int, str]]:
    """(line, kind) of every vLLM-only statement between two lines, read independently of the
    analysis: candidate lines that the SGLang grammar rejects and the vLLM grammar reads."""
    out = []
    with open(path, "rb") as fh:
        for line in candidate_lines(physical_lines(fh)):
            if not first <= line.number <= last or parse_sglang_line(line.text) is not None:
                continue
            for parsed in parse_vllm_line(line.text):
                if parsed.cls.__module__.endswith(".vllm"):
                    out.append((line.number, parsed.cls.__name__))
    return out


@pytest.mark.parametrize("log", LOGS, ids=corpus_id)
def test_startup_evidence_lists_every_statement_in_line_order(log):
    report = corpus_report(str(log))
    evidence = report["framework_evidence"]
    assert evidence, "a vLLM log recognised with no vLLM statement"
    got = [(e["line"], e["kind"]) for e in evidence]
    assert got == sorted(got, key=lambda x: x[0])
    source = report["source"]
    assert got == _vllm_statements(str(log), source["first_line"], source["last_line"])
    assert all(e["kind"].startswith("Vllm") and e["text"] for e in evidence)


@pytest.mark.parametrize("log", [pytest.param(p, id=corpus_id(p)) for p in LOGS if corpus_id(p) in ("001", "015", "019", "411")])
def test_startup_evidence_is_rendered(log):
    report = build(analyse(str(log)))
    text = render(report, "text")
    assert "vLLM STARTUP EVIDENCE" in text and "MEMORY BREAKDOWN" in text
    section = text.split("vLLM STARTUP EVIDENCE", 1)[1]
    for e in report["framework_evidence"]:
        assert f"line {e['line']:<6d} {e['kind']}" in section


def test_sglang_report_has_no_vllm_evidence():
    if not ALL_SGLANG:
        pytest.skip("no SGLang corpus")
    report = build(analyse(str(ALL_SGLANG[0])))
    assert report["framework"] == "sglang"
    assert all(framework_of_kind(e["kind"]) != "vllm" for e in report["framework_evidence"])
    assert "vLLM STARTUP EVIDENCE" not in render(report, "text")


def framework_of_kind(kind: str) -> str:
    return "vllm" if kind.startswith("Vllm") else "other"


# ---- 019: a failed start-up, then a retry -----------------------------------------------------

def test_019_analyses_the_retry_and_lists_the_failed_attempt():
    truth, report = truth_for(by_id("019")), corpus_report(str(by_id("019")))
    source = report["source"]
    assert truth["attempts"] == 2 == source["launches"]
    assert source["analyzed_launch"] == 2 and source["ready"] is True
    first, second = source["all_launches"]
    assert first["launch"] == 1 and first["failure"] is not None
    assert first["failure"]["text"].endswith(truth["error"])  # the ValueError line, prefix and all
    assert "Free memory on device (13.58/15.99 GiB)" in first["failure"]["text"]
    assert second["failure"] is None and second["first_line"] > first["last_line"]
    # the retry's own figures, not the failed attempt's
    assert report["observed"]["free_memory_on_startup_gib"] == truth["extra_values"]["free_memory_on_startup_gib_attempt2"]
    assert report["observed"]["kv_cache_in_use_gib"] == round(truth["extra_values"]["kv_cache_memory_in_use_bytes"] / (1 << 30), 2)
    # the failed attempt raised no finding about the retry, which fit
    assert "utilization-too-high" not in [f["rule"] for f in report["findings"]]
    text = render(build(analyse(str(by_id("019")))), "text")
    assert "launch 1:" in text and "failed at line" in text


def test_019_first_attempt_alone_is_utilization_too_high():
    report = build(analyse(str(by_id("019")), launch=1))
    assert report["source"]["analyzed_launch"] == 1 and report["source"]["ready"] is False
    found = next(f for f in report["findings"] if f["rule"] == "utilization-too-high")
    # ceiling: free / total = 13.58 / 15.99 = 0.8493 → 0.84 (rounded down)
    assert found["detail"]["ceiling"] == 0.84 and "≤ 0.84" in found["action"]
