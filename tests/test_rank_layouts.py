"""Rank layouts where the target rank printed nothing: vLLM worker-only excerpts (V0
`VllmWorkerProcess`), Ray clusters (`(EngineCore_0 …) (RayWorkerWrapper pid=…, ip=…)`), and
`--target-rank` given a process label. Fixtures are written in the real formats."""
from __future__ import annotations

import json

from click.testing import CliRunner

from capdiag.cli import main
from capdiag.errors import InputError
from helpers import corpus_report, fixture, row


def stand_ins(report: dict) -> dict:
    return {s["kind"]: s for s in report["stand_ins"]}


def test_worker_only_v0_excerpt_reads_the_workers_that_agree():
    report = corpus_report(fixture("vllm_v0_workers_only.log"))
    assert report["target_rank"] == "TP0"
    # the three workers print the same weights: the first in rank order stands in
    assert row(report, "weights")["gib"] == 9.7402
    assert "VllmWorkerProcess pid=4411" in row(report, "weights")["derivation"]
    # the profiling record: two workers print it, pid=4413 the fuller one (with the total)
    assert stand_ins(report)["memory-profiling"]["rank"] == "VllmWorkerProcess pid=4413"
    assert "the 2 ranks that printed one agree" in stand_ins(report)["memory-profiling"]["derivation"]
    assert row(report, "kv_cache")["gib"] == 31.32 and row(report, "framework")["gib"] == 0.61
    assert row(report, "cuda_graph")["gib"] == 0.38
    observed = report["observed"]
    assert observed["model_loading_gib"] == 9.7402 and observed["total_gpu_memory_gib"] == 47.41
    assert observed["available_kv_cache_gib"] == 31.32
    # each worker's own row still shows only what it printed
    by_process = {r["rank"]["process"]: r["observed"] for r in report["ranks"]}
    assert by_process["VllmWorkerProcess pid=4412"]["total_gpu_memory_gib"] is None
    # the evidence of a stand-in figure reaches the worker's line and the stand-in conclusion
    weights = row(report, "weights")
    assert [e["line"] for e in weights["evidence"]] and all(e["line"] in (4, 5, 6) for e in weights["evidence"])
    # the model from the runner's line
    assert report["config"]["model"] == "Qwen/Qwen2.5-72B-Instruct-AWQ"
    assert "Starting to load model" in report["config_sources"]["model"]


def test_workers_that_disagree_leave_the_figure_unknown_with_the_spread():
    report = corpus_report(fixture("vllm_v0_workers_disagree.log"))
    weights = row(report, "weights")
    assert weights["gib"] is None
    assert "19.271 vs 20.6613" in weights["derivation"] and "--target-rank" in weights["derivation"]
    assert report["observed"]["model_loading_gib"] is None
    # one worker alone printed the profiling record: it stands in (nothing to disagree with)
    assert report["observed"]["total_gpu_memory_gib"] == 23.65
    assert "the only rank that printed one" in stand_ins(report)["memory-profiling"]["derivation"]


def test_ray_cluster_lines_with_nested_prefixes_and_repeat_notes():
    report = corpus_report(fixture("vllm_ray_workers.log"))
    assert row(report, "weights")["gib"] == 32.8892
    assert "the 3 ranks that printed one agree" in stand_ins(report)["`Model loading took`"]["derivation"]
    assert row(report, "kv_cache")["gib"] == 36.07 and row(report, "cuda_graph")["gib"] == 1.12
    # the engine core's own lines are TP0's: no stand-in for them
    assert report["observed"]["kv_cache_tokens"] == 472768
    labels = {r["rank"]["process"] for r in report["ranks"]}
    assert {"RayWorkerWrapper pid=2390", "RayWorkerWrapper pid=714, ip=10.0.3.17",
            "RayWorkerWrapper pid=716, ip=10.0.3.18"} <= labels


def test_target_rank_takes_a_process_label():
    runner = CliRunner()
    log = fixture("vllm_v0_workers_disagree.log")
    result = runner.invoke(main, ["explain", log, "--format", "json", "--target-rank", "VllmWorkerProcess pid=809"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["target_rank"] == "(VllmWorkerProcess pid=809)"
    assert row(report, "weights")["gib"] == 19.271  # its own line: no stand-in
    # a part of the label, blanks and case ignored
    result = runner.invoke(main, ["explain", log, "--format", "json", "--target-rank", "PID=812"])
    assert result.exit_code == 0 and row(json.loads(result.output), "weights")["gib"] == 20.6613
    # a label no process has is an input error listing the ones there are (the entry point
    # prints it as one line and exits 2)
    result = runner.invoke(main, ["explain", log, "--target-rank", "pid=81"], standalone_mode=False)
    assert isinstance(result.exception, InputError)
    assert "VllmWorkerProcess pid=809, VllmWorkerProcess pid=812, VllmWorkerProcess pid=813" in str(result.exception)


def test_a_target_that_printed_its_own_line_keeps_it():
    # every worker printed weights; TP0 (rank=0) its own: nothing stands in
    report = corpus_report(fixture("vllm_v092_tp2.log"))
    assert report["stand_ins"] == [] and row(report, "kv_cache")["gib"] == 34.48
