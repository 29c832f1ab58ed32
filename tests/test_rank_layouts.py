"""Rank layouts where the target rank printed nothing: vLLM worker-only excerpts (V0
`VllmWorkerProcess`), Ray clusters (`(EngineCore_0 …) (RayWorkerWrapper pid=…, ip=…)`), and
`--target-rank` given a process label. Fixtures are written in the real formats."""
from __future__ import annotations

import json

from click.testing import CliRunner

from capdiag.cli import main
from capdiag.errors import InputError
from helpers import corpus_report, fixture, lines_of, row, write_log


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
    assert lines_of(weights) and all(line in (4, 5, 6) for line in lines_of(weights))
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
    # pid=2390's own line places it at TP0: its `Model loading took` is the target's, no stand-in
    assert report["target_rank"] == "DP0 PP0 TP0 (RayWorkerWrapper pid=2390)"
    assert row(report, "weights")["gib"] == 32.8892 and "`Model loading took`" not in stand_ins(report)
    kv = stand_ins(report)["`Available KV cache memory`"]["derivation"]
    assert "DP0 PP0 TP1 (RayWorkerWrapper pid=714, ip=10.0.3.17)'s (line 8) stands in" in kv
    assert "Ray folded 3 more such line(s)" in kv and "may differ" in kv
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


def test_ray_workers_are_placed_by_their_own_rank_lines_and_never_guessed():
    """`rank 1 in world size 4 is assigned as … TP rank 1` places the worker that printed it; the
    line Ray folded ([repeated 3x across cluster]) stood for three workers whose ranks are not in
    the log: pid=716 keeps no rank, with the reason."""
    report = corpus_report(fixture("vllm_ray_workers.log"))
    placed = {w["process"]: w for w in report["worker_ranks"]}
    assert placed["RayWorkerWrapper pid=2390"]["rank"] == "DP0 PP0 TP0"
    assert placed["RayWorkerWrapper pid=714, ip=10.0.3.17"]["rank"] == "DP0 PP0 TP1"
    assert "line 4" in placed["RayWorkerWrapper pid=714, ip=10.0.3.17"]["derivation"]
    unplaced = placed["RayWorkerWrapper pid=716, ip=10.0.3.18"]
    assert unplaced["rank"] is None and "Ray folded 3 assignment line(s)" in unplaced["derivation"]
    tp1 = next(r for r in report["ranks"] if r["rank"]["process"] == "RayWorkerWrapper pid=714, ip=10.0.3.17")
    assert tp1["rank"]["tp"] == 1


def test_ray_dedup_mark_and_its_first_time_explanation_are_removed_and_counted():
    from capdiag.source import clean, ray_repeats
    line = ("(RayWorkerWrapper pid=7, ip=10.0.0.2) INFO 05-16 09:49:32 [parallel_state.py:1004] rank 15 in world "
            "size 16 is assigned as DP rank 0, PP rank 1, TP rank 7 [repeated 14x across cluster] (Ray deduplicates "
            "logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or see https://docs.ray.io/en/master/"
            "ray-observability/user-guides/configure-logging.html#log-deduplication for more options.)")
    assert clean(line) == [line.split(" [repeated")[0]] and ray_repeats(line) == 14
    assert ray_repeats("INFO x Model loading took 1.0 GiB") == 0


def test_a_scheduler_tagged_dp_minus_one_is_tp0_with_no_dp_rank():
    """Late-2024 SGLang (v0.3.6) tags a scheduler that has no data-parallel rank `DP-1 TP0`. The
    tag names TP 0 and no DP rank; until it did, every memory line went unread (weights, pool,
    token budget) and the traffic lines had no time."""
    report = corpus_report(fixture("sglang_v036_dp_minus_one.log"))
    assert report["target_rank"] == "TP0" and [r["label"] for r in report["ranks"]] == ["TP0"]
    assert report["ranks"][0]["rank"]["dp"] is None
    assert row(report, "weights")["gib"] == 14.4  # 78.60 − 64.20
    assert report["kv_pool"]["tokens"] == 1025100
    assert (report["config"]["context_len"], report["config"]["max_running_requests"]) == (131072, 4004)
    runtime = report["runtime"]
    assert (runtime["first_time"], runtime["last_time"]) == ("2024-11-20 09:02:39", "2024-11-20 09:03:02")
    assert (runtime["running_requests"]["peak"], runtime["queued_requests"]["peak"], runtime["lines"]) == (6, 3, 3)


def test_a_crash_under_a_dp_minus_one_tag_is_the_schedulers_of_tp0(tmp_path):
    crash = open(fixture("sglang_v036_dp_minus_one.log")).read() + (
        "[2024-11-20 09:03:05 DP-1 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.10/dist-packages/sglang/srt/managers/scheduler.py", line 1492, in run_scheduler_process\n'
        "    scheduler.event_loop_normal()\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    report = corpus_report(write_log(tmp_path, crash))
    finding = next(f for f in report["findings"] if f["code"] == "CD125")
    assert "failed after it was ready on TP0" in finding["message"]
