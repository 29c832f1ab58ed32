"""Each rule on small fixture logs (tests/fixtures/*.log, real-format lines).

The expected figures are worked out by hand from the fixture lines (the arithmetic is in
the comments), never copied from the tool's output.
"""
from __future__ import annotations

from functools import lru_cache

import pytest

from capdiag.analysis import analyse
from capdiag.errors import InputError
from capdiag.report import build
from helpers import FIXTURES as FIXTURE_DIR, conc, finding, fixture, lines_of, row, write_log

GIB = 1 << 30


@lru_cache(maxsize=None)
def _analysis(name: str, **kw):
    return analyse(fixture(name), **kw)


def report(name: str, **kw) -> dict:
    return build(_analysis(name, **{k: v for k, v in kw.items()}))


# ---- weights ---------------------------------------------------------------------------------

def test_weights_measured_from_mem_usage():
    r = row(report("single_gpu_ready.log"), "weights")
    assert (r["gib"], r["status"], r["mib"]) == (15.1, "measured", round(15.1 * 1024))
    assert lines_of(r) == [4]


def test_weights_derived_from_free_memory_before_and_after():
    r = row(report("weights_derived_v040.log"), "weights")
    assert (r["gib"], r["status"]) == (13.81, "derived")  # 23.50 − 9.69
    assert "23.5" in r["derivation"] and "9.69" in r["derivation"]
    assert lines_of(r) == [1, 2]


def test_weights_unknown_in_overlap_mode():
    rep = report("weights_overlap.log")
    r = row(rep, "weights")
    assert r["gib"] is None and r["status"] == "unknown" and "overlap" in r["derivation"]
    assert lines_of(r) == [8]  # the `Committed real weights` line
    # nothing downstream pretends to know it
    assert row(rep, "unattributed")["gib"] is None
    assert rep["observed"]["weight_mem_usage_gib"] is None


# ---- KV cache --------------------------------------------------------------------------------

def test_kv_cache_from_k_plus_v():
    r = row(report("single_gpu_ready.log"), "kv_cache")
    assert (r["gib"], r["status"]) == (48.82, "measured")  # 24.41 + 24.41
    assert lines_of(r) == [5]


def test_kv_cache_from_mla_kv_size():
    r = row(report("mla_tp2.log"), "kv_cache")
    assert (r["gib"], r["status"]) == (45.0, "measured") and lines_of(r) == [6]


def test_kv_cache_full_plus_swa_lines_never_adds_the_swa_pool_summary():
    rep = report("kv_swa_labels.log")
    r = row(rep, "kv_cache")
    assert r["gib"] == 49.42  # 13.73×2 + 10.98×2; the SWAKVPool line (49.42) is their sum, not extra
    assert lines_of(r) == [5, 6]
    assert rep["observed"]["kv_tokens"] == 3198415  # the Full pool's line is the main one
    assert rep["observed"]["swa_kv_pool_mem_usage_gib"] == 49.42
    assert rep["kv_pool"]["tokens"] == 3198415


def test_kv_pool_tokens_is_the_full_pool_for_unlabeled_swa_lines():
    rep = report("kv_swa_unlabeled_v056.log")
    assert row(rep, "kv_cache")["gib"] == 10.0  # 2+2 (SWA) + 3+3 (full); the SWAKVPool line is their sum
    assert rep["kv_pool"]["tokens"] == 100000


def test_kv_cache_for_unlabeled_swa_lines_is_their_sum():
    rep = report("kv_swa_unlabeled_v056.log")
    r = row(rep, "kv_cache")
    assert (r["gib"], r["status"]) == (10.0, "measured") and lines_of(r) == [5, 6]


def test_kv_cache_from_swa_pool_when_no_kv_line():
    r = row(report("kv_swa_pool_only.log"), "kv_cache")
    assert (r["gib"], r["status"]) == (79.94, "measured") and lines_of(r) == [3]


def test_kv_cache_from_dsv4_available_bytes():
    rep = report("kv_dsv4.log")
    r = row(rep, "kv_cache")
    assert (r["gib"], r["status"]) == (45.78, "derived") and lines_of(r) == [4]
    assert rep["kv_pool"]["tokens"] == 3044864
    assert rep["kv_pool"]["bytes_per_token"] == 15955.85
    assert rep["observed"]["dsv4_available_bytes_gib"] == 45.78 and rep["observed"]["dsv4_full_token"] == 3044864


def test_kv_cache_of_dsv4_pools_a_limit_cut_is_what_they_were_built_with():
    """A second `DSV4 pool sizes` line: the pools were built for fewer tokens than the memory
    bought (here 8 requests × 65,536), so the row is that count's bytes, not available_bytes."""
    rep = report("kv_dsv4_cut.log")
    r = row(rep, "kv_cache")
    assert (r["gib"], r["status"]) == (8.32, "derived") and lines_of(r) == [4, 5, 6]  # 524288 × 15955.85 B + 0.53
    assert "built for 524,288" in r["derivation"] and "3,044,864" in r["derivation"]
    assert rep["kv_pool"]["tokens"] == 524288
    assert abs(r["gib"] - (57.01 - 48.70)) < 0.05  # the drop across the pools' allocation: what was allocated


def test_kv_cache_from_pool_delta():
    r = row(report("weights_derived_v040.log"), "kv_cache")
    assert (r["gib"], r["status"]) == (7.59, "derived")  # 9.69 − 2.10
    assert lines_of(r) == [2, 3]


def test_kv_cache_pool_delta_minus_mamba_state():
    rep = report("kv_pool_delta_mamba.log")
    assert (row(rep, "kv_cache")["gib"], row(rep, "kv_cache")["status"]) == (10.0, "derived")  # 20 − 6 − (1 + 3)
    m = row(rep, "mamba_state")
    assert (m["gib"], m["status"]) == (4.0, "measured") and lines_of(m) == [3]
    assert rep["observed"]["mamba_conv_state_gib"] == 1.0 and rep["observed"]["mamba_ssm_state_gib"] == 3.0


def test_kv_cache_post_capture_supersedes_the_va_reservation():
    rep = report("post_capture.log")
    r = row(rep, "kv_cache")
    assert (r["gib"], r["status"]) == (114.2, "measured") and lines_of(r) == [9]
    # the VA upper bound (58.04 + 58.04) is a reservation, never reported as an allocation
    assert rep["observed"]["k_size_gib"] is None and rep["observed"]["kv_size_gib"] is None
    assert rep["observed"]["post_capture_kv_size_gib"] == 114.2
    assert rep["observed"]["post_capture_kv_tokens"] == 2993664


def test_bytes_per_token_follows_from_printed_figures():
    rep = report("single_gpu_ready.log")
    assert rep["kv_pool"]["tokens"] == 400000
    assert rep["kv_pool"]["bytes_per_token"] == round(48.82 * GIB / 400000)


# ---- CUDA graphs -----------------------------------------------------------------------------

def test_cuda_graph_sums_decode_and_piecewise():
    rep = report("single_gpu_ready.log")
    r = row(rep, "cuda_graph")
    assert (r["gib"], r["status"]) == (1.6, "measured")  # piecewise 0.58 + decode 1.02
    assert lines_of(r) == [8, 10]
    assert rep["observed"]["cuda_graph_mem_usage_gib"] == 1.02  # the main decode graph only
    assert rep["observed"]["piecewise_cuda_graph_mem_usage_gib"] == 0.58


def test_cuda_graph_excludes_draft_graphs_v0513():
    rep = report("eagle_v0513.log")
    assert row(rep, "cuda_graph")["gib"] == 1.2 and lines_of(row(rep, "cuda_graph")) == [7]
    d = row(rep, "draft_cuda_graph")
    assert (d["gib"], d["status"]) == (0.8, "measured") and lines_of(d) == [13, 15]  # 0.60 + 0.20


def test_cuda_graph_excludes_draft_graphs_v0514():
    rep = report("eagle_v0514.log")
    assert row(rep, "cuda_graph")["gib"] == 1.2  # target verify only
    assert row(rep, "draft_cuda_graph")["gib"] == 0.55  # draft decode 0.38 + draft extend 0.17
    assert rep["observed"]["cuda_graph_mem_usage_gib"] == 1.2
    assert rep["observed"]["draft_cuda_graph_mem_usage_gib"] == 0.55


def test_cuda_graph_unknown_without_figures_or_end():
    old = row(report("weights_derived_v040.log"), "cuda_graph")
    assert old["gib"] is None and old["status"] == "unknown" and "v0.4.3" in old["derivation"]
    crashed = row(report("crash_capture.log"), "cuda_graph")
    assert crashed["gib"] is None and "began" in crashed["derivation"]


def test_cuda_graph_zero_when_disabled(tmp_path):
    path = write_log(tmp_path, "\n".join([
        "[2025-06-17 10:00:00] server_args=ServerArgs(model_path='m', mem_fraction_static=0.7, tp_size=1, "
        "disable_cuda_graph=True)",
        "[2025-06-17 10:00:02] Load weight begin. avail mem=63.55 GB",
        "[2025-06-17 10:00:09] Load weight end. type=LlamaForCausalLM, dtype=torch.float16, avail mem=33.90 GB, "
        "mem usage=29.65 GB.",
        "[2025-06-17 10:00:09] KV Cache is allocated. #tokens: 20480, K size: 5.00 GB, V size: 5.00 GB",
        "[2025-06-17 10:00:09] Memory pool end. avail mem=23.70 GB",
        "[2025-06-17 10:00:10] max_total_num_tokens=20480, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=200, context_len=4096, available_gpu_mem=23.70 GB",
        "[2025-06-17 10:00:12] The server is fired up and ready to roll!"]) + "\n")
    r = row(build(analyse(path)), "cuda_graph")
    assert (r["gib"], r["status"]) == (0.0, "derived") and "disable_cuda_graph" in r["derivation"]


# ---- speculative decoding: draft rows and roles ------------------------------------------------

def test_draft_rows_with_eagle_v0513():
    rep = report("eagle_v0513.log")
    assert (row(rep, "draft_weights")["gib"], row(rep, "draft_weights")["status"]) == (1.0, "measured")
    assert row(rep, "draft_kv_cache")["gib"] == 1.14  # 0.57 + 0.57
    assert row(rep, "weights")["gib"] == 15.1 and row(rep, "kv_cache")["gib"] == 36.62
    o = rep["observed"]
    assert (o["draft_load_weight_begin_avail_gib"], o["draft_load_weight_end_avail_gib"]) == (25.1, 24.1)
    assert (o["draft_weight_mem_usage_gib"], o["draft_kv_tokens"], o["draft_k_size_gib"]) == (1.0, 300000, 0.57)
    assert o["draft_memory_pool_end_avail_gib"] == 22.9
    assert (o["weight_mem_usage_gib"], o["memory_pool_end_avail_gib"], o["k_size_gib"]) == (15.1, 26.5, 18.31)
    # 78.50 − 22.10 − 15.10 − 36.62 − 1.20 − 1.00 − 1.14 − 0.80
    assert row(rep, "unattributed")["gib"] == 0.54


def test_no_draft_rows_without_speculative_decoding():
    cats = {r["category"] for r in report("single_gpu_ready.log")["breakdown"]}
    assert not cats & {"draft_weights", "draft_kv_cache", "draft_cuda_graph"}
    assert not any(k.startswith("draft_") for k in report("single_gpu_ready.log")["observed"])


def roles(name: str) -> dict[int, str]:
    return {f.evidence.line: f.role for f in _analysis(name).launch.facts}


def test_draft_roles_v0513_order():
    """≤ v0.5.13: target load → pool → graphs, then the draft worker does all three."""
    r = roles("eagle_v0513.log")
    assert all(r[n] == "target" for n in range(2, 8))
    assert all(r[n] == "draft" for n in range(8, 16))
    assert r[16] == "target"


def test_draft_roles_v0514_order():
    """v0.5.14+: target then draft weights, target then draft pools, then the graphs (which say
    their role)."""
    r = roles("eagle_v0514.log")
    assert [r[n] for n in range(2, 10)] == ["target"] * 4 + ["draft"] * 4
    assert [r[n] for n in range(10, 18)] == ["target"] * 4 + ["draft"] * 4
    assert [r[n] for n in range(18, 22)] == ["target"] * 4
    assert [r[n] for n in range(22, 26)] == ["draft"] * 4


def test_unstated_graph_role_after_the_draft_pool_is_draft():
    r = roles("eagle_v043_unstated.log")
    assert (r[5], r[6]) == ("target", "target")
    assert (r[11], r[12]) == ("draft", "draft")
    rep = report("eagle_v043_unstated.log")
    assert row(rep, "cuda_graph")["gib"] == 1.2 and row(rep, "draft_cuda_graph")["gib"] == 0.8


def test_draft_rows_on_a_rank_without_draft_graph_lines():
    rep = report("eagle_v0514.log", target_rank=1)
    assert rep["target_rank"] == "TP1"
    assert row(rep, "draft_weights")["gib"] == 0.5 and row(rep, "draft_kv_cache")["gib"] == 1.9
    assert row(rep, "cuda_graph")["gib"] == 1.25
    assert row(rep, "draft_cuda_graph") is None  # v0.5.14+ prints draft captures on TP0 only


# ---- framework, free, unattributed ------------------------------------------------------------

def test_framework_unknown_without_gpu_total():
    r = row(report("single_gpu_ready.log"), "framework")
    assert r["gib"] is None and r["status"] == "unknown" and "--gpu" in r["derivation"]
    assert all(x["percent"] is None for x in report("single_gpu_ready.log")["breakdown"])


def test_framework_derived_with_gpu_total_gib():
    rep = report("single_gpu_ready.log", gpu_total_gib=79.65)
    r = row(rep, "framework")
    assert (r["gib"], r["status"]) == (1.15, "derived")  # 79.65 − 78.50
    assert rep["gpu"]["total_gib"] == 79.65
    assert rep["gpu"]["total_source"] and "reference" not in rep["gpu"]["total_source"]  # the stated figure
    assert row(rep, "weights")["percent"] == round(100 * 15.1 / 79.65, 1)


def test_framework_derived_with_gpu_alias_uses_the_measured_total():
    rep = report("single_gpu_ready.log", gpu="h100_sxm")
    assert rep["gpu"]["total_gib"] == round(81559 / 1024, 2)  # nvidia-smi MiB, not the nominal 80 GB
    assert row(rep, "framework")["gib"] == round(round(81559 / 1024, 2) - 78.5, 2)


def test_free_and_unattributed():
    rep = report("single_gpu_ready.log")
    assert (row(rep, "free")["gib"], row(rep, "free")["status"]) == (12.4, "measured")
    u = row(rep, "unattributed")
    assert (u["gib"], u["status"]) == (0.58, "derived")  # 78.50 − 12.40 − 15.10 − 48.82 − 1.60
    assert row(rep, "other")["gib"] is None and row(rep, "other")["status"] == "unknown"


# ---- concurrency -----------------------------------------------------------------------------

def test_concurrency_is_min_of_token_and_request_limits():
    rep = report("single_gpu_ready.log")
    assert [c["request_tokens"] for c in rep["concurrency"]] == [4096, 6144, 8192]
    c = conc(rep, 4096)
    assert (c["token_limit"], c["request_limit"], c["max_concurrent"], c["binding"]) == (97, 48, 48, "requests")
    assert (conc(rep, 6144)["token_limit"], conc(rep, 6144)["max_concurrent"]) == (65, 48)
    assert (conc(rep, 8192)["max_concurrent"], conc(rep, 8192)["binding"]) == (48, "both")  # 400000 // 8192 = 48


def test_concurrency_token_bound():
    rep = report("mla_tp2.log")
    assert (conc(rep, 4096)["max_concurrent"], conc(rep, 4096)["binding"]) == (900000 // 4096, "tokens")


def test_concurrency_custom_lengths():
    rep = report("single_gpu_ready.log", token_lengths=(100000, 1000))
    assert [c["request_tokens"] for c in rep["concurrency"]] == [1000, 100000]
    assert (conc(rep, 100000)["max_concurrent"], conc(rep, 100000)["binding"]) == (4, "tokens")
    assert conc(rep, 1000)["max_concurrent"] == 48


def test_concurrency_with_unknown_request_limit():
    rep = report("bench_one_batch.log")  # bare `max_total_num_tokens=90000`
    c = conc(rep, 4096)
    assert c["request_limit"] is None and c["token_limit"] == 90000 // 4096
    assert c["max_concurrent"] == 90000 // 4096 and "upper bound" in c["derivation"]
    assert "max_running_requests" in c["derivation"]


def test_concurrency_unknown_without_budget_line():
    rep = report("excerpt_pool.log")
    assert all(c["max_concurrent"] is None and c["token_limit"] is None for c in rep["concurrency"])
    assert "max_total_num_tokens" in rep["concurrency"][0]["derivation"]


def test_concurrency_is_per_dp_worker(tmp_path):
    path = write_log(tmp_path, "\n".join([
        "[2025-09-11 10:00:00] server_args=ServerArgs(model_path='m', mem_fraction_static=0.8, tp_size=8, "
        "dp_size=8, enable_dp_attention=True)",
        "[2025-09-11 10:04:55 DP0 TP0 EP0] max_total_num_tokens=852992, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=256, context_len=163840, available_gpu_mem=23.40 GB"]) + "\n")
    rep = build(analyse(path))
    c = conc(rep, 8192)
    assert c["per_dp_worker"] is True and (c["token_limit"], c["max_concurrent"]) == (104, 104)


# ---- mem_fraction_static --------------------------------------------------------------------------

def test_mem_fraction_stated_by_server_args():
    rep = report("single_gpu_ready.log")
    assert rep["config"]["mem_fraction_static"] == 0.86
    assert "server_args" in rep["config_sources"]["mem_fraction_static"]
    assert rep["kv_pool"]["headroom_gib"] == 10.99  # 78.50 × (1 − 0.86)
    assert rep["kv_pool"]["budget_gib"] == 52.41  # 63.40 − 10.99
    assert finding(rep, "mem-fraction-unstated") is None


def test_mem_fraction_from_launch_command_and_memory_profiling():
    assert report("bench_one_batch.log")["config"]["mem_fraction_static"] == 0.7
    assert report("memory_profiling_dsv4.log")["config"]["mem_fraction_static"] == 0.6


def test_kv_budget_counts_the_draft_weights_loaded_before_the_pool():
    assert report("eagle_v0514.log")["kv_pool"]["budget_gib"] == 54.7  # 70.40 (after draft) − 78.50 × 0.2
    assert report("eagle_v0513.log")["kv_pool"]["budget_gib"] == 47.7  # 63.40 (draft loads later) − 15.70


@pytest.mark.parametrize("name, why", [("weights_derived_v040.log", "no server_args line"),
                                       ("mfs_unstated_elided.log", "cut or elided")])
def test_mem_fraction_unknown_is_never_a_default(name, why):
    a = _analysis(name)
    d = a.knowledge.get("config", "mem_fraction_static")
    assert d is not None and not d.known and why in d.value.reason
    rep = build(a)
    assert rep["config"]["mem_fraction_static"] is None
    assert 0.88 not in rep["config"].values()
    assert rep["kv_pool"]["budget_gib"] is None and rep["kv_pool"]["headroom_gib"] is None
    assert "mem_fraction_static" in rep["kv_pool"]["derivation"]["budget_gib"]
    f = finding(rep, "mem-fraction-unstated")
    assert f["code"] == "CD103" and f["severity"] == "info"
    assert f["detail"]["not_computed"] == ["kv_pool.budget_gib", "kv_pool.headroom_gib"]
    assert "kv_pool.budget_gib" in f["message"] and "kv_pool.headroom_gib" in f["message"]


# ---- startup-incomplete ---------------------------------------------------------------------------

def test_startup_crash_is_an_error_named_by_its_root_cause():
    rep = report("crash_capture.log")
    assert finding(rep, "startup-incomplete") is None  # startup-failed names it
    f = finding(rep, "startup-failed")
    assert (f["code"], f["severity"]) == ("CD125", "error")
    assert f["detail"] == {"cause": "moe-kernel-config-incomplete", "phase": None, "line": 15, "rank": "TP1"}
    assert f["main_evidence"]["line"] == 15 and 12 in [e["line"] for e in f["evidence"]]
    assert rep["source"]["ready"] is False and rep["source"]["phase_reached"] == "graph_capture"
    assert rep["source"]["stopped_at"]["line"] == 15
    assert rep["source"]["all_launches"][0]["failure"]["line"] == 15
    assert finding(rep, "out-of-memory") is None


def test_startup_excerpt_is_a_warning():
    rep = report("excerpt_pool.log")
    f = finding(rep, "startup-incomplete")
    assert f["severity"] == "warning" and rep["source"]["phase_reached"] == "kv_pool"


def test_startup_bench_tool_is_info():
    f = finding(report("bench_one_batch.log"), "startup-incomplete")
    assert f["severity"] == "info" and 6 in [e["line"] for e in f["evidence"]]


@pytest.mark.parametrize("name", ["single_gpu_ready.log", "eagle_v0514.log", "post_capture.log"])
def test_ready_logs_have_no_startup_finding(name):
    rep = report(name)
    assert rep["source"]["ready"] is True and rep["source"]["phase_reached"] == "ready"
    assert finding(rep, "startup-incomplete") is None and rep["source"]["stopped_at"] is None


# ---- out-of-memory --------------------------------------------------------------------------------

def test_oom_before_the_pool_says_raise():
    rep = report("oom_weights.log")
    f = finding(rep, "out-of-memory")
    assert (f["code"], f["severity"]) == ("CD102", "error")
    assert f["detail"] == {"direction": "raise", "phase": "weights", "suggested": None,
                           "cause": "cuda-out-of-memory", "line": 6, "rank": None, "failure_phase": None}
    # the weights take 0.953 of the free memory: no fraction leaves a pool, so none is suggested
    assert f["action"].startswith("No mem_fraction_static helps: weights (free before 23.2 − after 1.1) = 22.1 GiB")
    assert 6 in [e["line"] for e in f["evidence"]]
    o = rep["observed"]
    assert (o["oom_tried_to_allocate_mib"], o["oom_free_mib"], o["oom_total_capacity_gib"]) == (2048.0, 1044.48, 23.56)


def test_not_enough_memory_says_raise():
    f = finding(report("not_enough_memory.log"), "out-of-memory")
    assert f["detail"]["direction"] == "raise" and f["action"].startswith("Raise")
    assert lines_of(f)[-1] == 4


def test_oom_during_capture_says_lower():
    rep = report("oom_capture.log")
    f = finding(rep, "out-of-memory")
    assert f["detail"] == {"direction": "lower", "phase": "graph_capture", "suggested": None,  # fraction unstated
                           "cause": "cuda-out-of-memory", "line": 12, "rank": "TP0", "failure_phase": None}
    assert f["action"].startswith("Lower --mem-fraction-static")
    # the untagged PyTorch message names GPU 0: it is TP0's
    assert rep["observed"]["oom_tried_to_allocate_mib"] == 384.0
    assert rep["observed"]["oom_reserved_unallocated_mib"] == 210.78


def test_not_enough_memory_in_a_traceback_says_raise(tmp_path):
    path = write_log(tmp_path, "\n".join([
        "[2025-03-12 10:00:02 TP0] Load weight begin. avail mem=44.30 GB",
        "[2025-03-12 10:00:30 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=29.10 GB, "
        "mem usage=15.20 GB.",
        "[2025-03-12 10:00:31 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 900, in init_memory_pool',
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."]) + "\n")
    f = finding(build(analyse(path)), "out-of-memory")
    assert f is not None and f["detail"]["direction"] == "raise"


# ---- binding rank, target rank --------------------------------------------------------------------------

def test_binding_rank_is_least_free_after_weights():
    b = report("mla_tp2.log")["binding_rank"]
    assert (b["label"], b["gib"], b["spread_gib"], b["reading"]) == ("TP1", 61.25, 0.75, "free after weights")


def test_binding_rank_falls_back_to_free_after_pools(tmp_path):
    path = write_log(tmp_path, "\n".join([
        "[2025-10-16 10:00:00 TP1] Memory pool end. avail mem=9.50 GB",
        "[2025-10-16 10:00:00 TP3] Memory pool end. avail mem=8.75 GB",
        "[2025-10-16 10:00:00 TP5] Memory pool end. avail mem=9.00 GB"]) + "\n")
    b = build(analyse(path))["binding_rank"]
    assert (b["label"], b["gib"], b["spread_gib"], b["reading"]) == ("TP3", 8.75, 0.75, "free after pools")


def test_no_binding_rank_for_one_rank():
    assert report("single_gpu_ready.log")["binding_rank"] is None


def test_target_rank_selects_that_ranks_lines():
    rep = report("mla_tp2.log", target_rank=1)
    assert rep["target_rank"] == "TP1"
    assert row(rep, "weights")["gib"] == 16.25 and row(rep, "cuda_graph")["gib"] == 2.45
    assert row(rep, "free")["gib"] == 13.2  # TP1 prints no max_total line: its last reading
    assert rep["observed"]["load_weight_begin_avail_gib"] == 77.5
    assert rep["kv_pool"]["headroom_gib"] == 15.5  # 77.50 × 0.2


def test_unknown_target_rank_is_an_input_error():
    with pytest.raises(InputError, match="--target-rank 5"):
        analyse(fixture("mla_tp2.log"), target_rank=5)


def test_ranks_table_lists_every_rank():
    rep = report("mla_tp2.log")
    assert [r["label"] for r in rep["ranks"]] == ["TP0", "TP1"]
    tp1 = rep["ranks"][1]
    assert tp1["observed"]["weight_mem_usage_gib"] == 16.25 and tp1["observed"]["kv_size_gib"] == 45.0
    assert {k: tp1["rank"][k] for k in ("tp", "dp", "pp", "ep")} == {"tp": 1, "dp": None, "pp": None, "ep": None}
    assert tp1["observed"]["max_total_num_tokens"] is None  # only TP0 prints it


# ---- launches -----------------------------------------------------------------------------------

def test_crash_then_restart_default_picks_the_furthest():
    a = _analysis("restart_furthest_first.log")
    assert [l.index for l in a.launches] == [1, 2]
    assert [l.phase for l in a.launches] == ["graph_capture", "weights"]
    assert a.launch.index == 1  # got further than the restart, which the excerpt cuts short
    rep = build(a)
    assert rep["source"]["launches"] == 2 and rep["source"]["analyzed_launch"] == 1
    assert rep["config"]["mem_fraction_static"] == 0.9
    assert (rep["source"]["first_line"], rep["source"]["last_line"]) == (1, 8)  # 8: the exception


def test_launch_option_picks_another():
    rep = report("restart_furthest_first.log", launch=2)
    assert rep["source"]["analyzed_launch"] == 2 and rep["config"]["mem_fraction_static"] == 0.85
    assert rep["observed"]["load_weight_begin_avail_gib"] == 139.0
    assert rep["source"]["first_line"] == 9
    assert all(f.evidence.launch == 2 for f in _analysis("restart_furthest_first.log", launch=2).launch.facts)


def test_restart_without_server_args_after_a_failure():
    a = _analysis("restart_then_ready.log")
    assert len(a.launches) == 2 and a.launch.index == 2  # the later launch reached ready
    rep = build(a)
    assert row(rep, "weights")["gib"] == 61.1 and lines_of(row(rep, "weights")) == [5]
    assert finding(rep, "out-of-memory") is None
    first = report("restart_then_ready.log", launch=1)
    assert finding(first, "out-of-memory")["detail"]["direction"] == "raise"


def test_bad_launch_number_is_an_input_error():
    with pytest.raises(InputError, match="2 launch"):
        analyse(fixture("restart_then_ready.log"), launch=3)


@pytest.mark.parametrize("name", ["eagle_v0513.log", "eagle_v0514.log", "eagle_v043_unstated.log"])
def test_speculative_second_weight_load_is_not_a_restart(name):
    assert len(_analysis(name).launches) == 1


# ---- every fixture -------------------------------------------------------------------------------

FIXTURES = sorted(p.name for p in FIXTURE_DIR.glob("*.log") if not p.name.startswith("vllm_"))  # SGLang fixtures


@pytest.mark.parametrize("name", FIXTURES)
def test_every_fixture_has_a_row_per_core_category_and_evidence(name):
    rep = report(name)
    cats = [r["category"] for r in rep["breakdown"]]
    for required in ("framework", "weights", "kv_cache", "cuda_graph", "other", "free"):
        assert required in cats
    for r in rep["breakdown"]:
        if r["status"] != "unknown":
            # a figure always cites the lines it comes from
            assert r["evidence"] and r["derivation"], r
            assert all(isinstance(e["line"], int) and e["line"] >= 1 for e in r["evidence"]
                       if e["kind"] not in ("GpuTotal", "Options")), r


def test_mamba_state_slots_bound_concurrency_where_no_request_limit_is_printed():
    """SGLang caps a hybrid model's request limit at its state slots // 3: with the limit itself
    not printed, that is the tighter upper bound, not the pool's tokens // length."""
    rep = report("sglang_mamba_slots_no_request_limit.log")
    row = rep["concurrency"][0]
    assert (row["request_tokens"], row["token_limit"], row["max_concurrent"]) == (4096, 299, 39)
    assert row["binding"] == "state slots" and row["upper_bound"] and row["state_limit"] == 39
    assert "117 Mamba state slots // 3 = 39 requests (line 3)" in row["derivation"]


def test_request_lengths_longer_than_the_context_are_marked_refused_and_the_context_gets_a_row():
    """A 1,024-token server refuses a 4,096-token request: its row keeps the arithmetic but says
    so, the context's own row is added, and a remedy states its figures at the context."""
    rep = report("vllm_short_context_small_pool.log")
    rows = {c["request_tokens"]: c for c in rep["concurrency"]}
    assert sorted(rows) == [1024, 4096, 6144, 8192]
    assert (rows[1024]["max_concurrent"], rows[1024]["longer_than_context"]) == (1, False)
    assert rows[4096]["longer_than_context"] and "longer than the 1,024-token context" in rows[4096]["derivation"]
    texts = [r["text"] for f in rep["findings"] for r in f["remedies"]]
    assert texts and all("of 4,096" not in t for t in texts) and any("of 1,024 at once" in t for t in texts)
