"""The vLLM rules on small real-format fixture logs (tests/fixtures/vllm_*.log).

Every fixture line follows a format string of the release it names (see
../shared/research/vllm-log-spec.md); several are copied from the shared corpus. The expected
figures are worked out by hand from the fixture lines (the arithmetic is in the comments),
never copied from the tool's output.
"""
from __future__ import annotations

import json
from functools import lru_cache

import pytest

from capdiag.analysis import analyse
from capdiag.errors import InputError
from capdiag.render import render
from capdiag.report import build
from helpers import FIXTURES, conc, finding, fixture, lines_of, row, write_log


@lru_cache(maxsize=None)
def report(name: str, **kw) -> dict:
    return build(analyse(fixture(name), **kw))


def variant(tmp_path, name: str, *edits: tuple[str, str], drop: str | None = None) -> dict:
    """A fixture with lines edited (old → new) or dropped, analysed from a temporary file."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    if drop is not None:
        text = "".join(l for l in text.splitlines(keepends=True) if drop not in l)
    return build(analyse(write_log(tmp_path, text)))


V073 = "vllm_v073_v0_tp1.log"          # V0 0.7.3, TP1: `Loading model weights took … GB` + 3-line profile
V073_PROFILE = "vllm_v073_v0_profile_only.log"  # the same without the model-loading line
V092 = "vllm_v092_tp2.log"             # V1 0.9.2, TP2: per-worker KV sizes, min not printed first
V0271 = "vllm_v0271_hybrid_tp2.log"    # V1 0.27.1 hybrid, TP2: consumed memory, graph pool
V028_POOL = "vllm_v028_graph_pool.log"  # 0.28: pool line, no capture line
V0112_NEG = "vllm_v0112_graph_negative.log"  # 0.11.2: capture took -0.41 GiB
V025_EST = "vllm_v025_graph_estimate.log"    # 0.25: stops after KV sizing, estimate only
V090_EAGER = "vllm_v090_eager.log"
V011_SEQS = "vllm_v011_max_num_seqs.log"     # max_num_seqs 128 stated
V033_RESERVED = "vllm_v033_kv_reserved.log"  # --kv-cache-memory-bytes


def test_every_vllm_fixture_is_read_as_vllm():
    for path in sorted(FIXTURES.glob("vllm_*.log")):
        assert build(analyse(str(path)))["framework"] == "vllm", path.name


# ---- weights ---------------------------------------------------------------------------------

def test_weights_from_model_loading_line_printed_in_gb():
    r = row(report(V073), "weights")
    assert (r["gib"], r["status"]) == (14.9889, "measured") and lines_of(r) == [4]
    assert "GB" in r["derivation"] and "GiB" in r["derivation"]  # the "GB" is a GiB figure


def test_weights_model_loading_beats_the_profile_record():
    # line 4 prints 14.9889, the profile record (line 7) 14.99: the load line wins
    assert row(report(V073), "weights")["gib"] == 14.9889


def test_weights_from_v0_profile_when_no_load_line():
    r = row(report(V073_PROFILE), "weights")
    assert (r["gib"], r["status"]) == (14.99, "measured") and lines_of(r) == [6]
    assert "model weights take" in r["derivation"]


def test_weights_per_rank_tp2():
    assert row(report(V092), "weights")["gib"] == 30.5711
    assert row(report(V092, target_rank="tp1"), "weights")["gib"] == 30.5711


# ---- KV cache --------------------------------------------------------------------------------

def test_kv_cache_from_available_kv_of_the_target_rank():
    # rank 1 prints 34.52 first (line 6), rank 0 34.48 (line 7)
    r = row(report(V092), "kv_cache")
    assert (r["gib"], r["status"]) == (34.48, "measured") and lines_of(r) == [7]
    assert row(report(V092, target_rank="tp1"), "kv_cache")["gib"] == 34.52


def test_kv_cache_from_v0_profile_rest_of_memory():
    r = row(report(V073), "kv_cache")
    assert (r["gib"], r["status"]) == (54.78, "measured") and lines_of(r) == [7]
    assert "profiling record" in r["derivation"]


def test_kv_cache_from_the_one_line_064_profile():
    r = row(report("vllm_v064_max_seq_len.log"), "kv_cache")
    assert (r["gib"], r["status"]) == (2.89, "measured") and lines_of(r) == [2]


def test_kv_cache_from_the_explicit_reservation():
    r = row(report(V033_RESERVED), "kv_cache")
    assert (r["gib"], r["status"]) == (40.0, "measured") and lines_of(r) == [3]
    assert "--kv-cache-memory" in r["derivation"]
    # 327,680 tokens in 40 GiB: 40 × 2^30 / 327680 = 131072 B (Llama-3.1-8B bf16: 32 × 8 × 256 × 2)
    assert report(V033_RESERVED)["kv_pool"]["bytes_per_token"] == 131072


# ---- CUDA graphs -----------------------------------------------------------------------------

def test_cuda_graph_measured_by_the_capture_line():
    r = row(report(V073), "cuda_graph")
    assert (r["gib"], r["status"]) == (0.52, "measured") and lines_of(r) == [10]


def test_cuda_graph_is_the_target_ranks_line():
    assert row(report(V092), "cuda_graph")["gib"] == 0.62   # rank 0, line 13 (rank 1's 0.64 is line 12)
    assert row(report(V092, target_rank="1"), "cuda_graph")["gib"] == 0.64


def test_cuda_graph_negative_capture_is_unknown():
    r = row(report(V0112_NEG), "cuda_graph")
    assert r["gib"] is None and r["status"] == "unknown"
    assert "-0.41" in r["derivation"] and "artefact" in r["derivation"]
    assert lines_of(r) == [7]
    # the printed figure is still observed as printed
    assert report(V0112_NEG)["observed"]["graph_capture_gib"] == -0.41


def test_cuda_graph_from_pool_actual_when_no_capture_line():
    r = row(report(V028_POOL), "cuda_graph")
    assert (r["gib"], r["status"]) == (0.71, "measured") and lines_of(r) == [4]
    assert "actual" in r["derivation"]


def test_cuda_graph_negative_capture_falls_back_to_the_pool(tmp_path):
    rep = variant(tmp_path, V028_POOL, (
        "(EngineCore pid=3403212) INFO 08-17 02:57:58 [gpu_worker.py:741]",
        "(EngineCore pid=3403212) INFO 08-17 02:57:58 [gpu_model_runner.py:7048] Graph capturing finished in 12 secs, "
        "took -0.02 GiB\n(EngineCore pid=3403212) INFO 08-17 02:57:58 [gpu_worker.py:741]"))
    r = row(rep, "cuda_graph")
    assert (r["gib"], r["status"]) == (0.71, "measured") and lines_of(r) == [5]


def test_cuda_graph_estimate_when_nothing_was_measured():
    r = row(report(V025_EST), "cuda_graph")
    assert (r["gib"], r["status"]) == (1.41, "derived") and lines_of(r) == [3]
    assert "estimate" in r["derivation"]


def test_cuda_graph_zero_with_enforce_eager():
    r = row(report(V090_EAGER), "cuda_graph")
    assert (r["gib"], r["status"]) == (0.0, "derived") and "enforce_eager" in r["derivation"]


def test_cuda_graph_unknown_when_the_log_stops_before_capture():
    r = row(report("vllm_v013_oom_profile.log"), "cuda_graph")
    assert r["gib"] is None and r["status"] == "unknown"


# ---- activation, framework, budget -----------------------------------------------------------

def test_activation_from_the_v0_profile():
    r = row(report(V073), "activation")
    assert (r["gib"], r["status"]) == (1.19, "measured") and lines_of(r) == [7]


def test_activation_from_the_free_memory_report():
    r = row(report(V0271), "activation")
    assert (r["gib"], r["status"]) == (2.32, "measured") and lines_of(r) == [13]


def test_no_activation_row_where_none_is_printed():
    assert row(report(V092), "activation") is None


def test_framework_is_non_torch_memory_of_the_profile():
    r = row(report(V073), "framework")
    assert (r["gib"], r["status"]) == (0.3, "measured") and lines_of(r) == [7]


def test_framework_from_027_consumed_minus_weights():
    r = row(report(V0271), "framework")
    # consumed (weights + non-torch) 25.86 − Model loading 25.69 = 0.17
    assert (r["gib"], r["status"]) == (0.17, "derived")
    assert "25.86" in r["derivation"] and "25.69" in r["derivation"]
    assert set(lines_of(r)) == {5, 13}


def test_framework_from_028_consumed_minus_weights():
    r = row(report(V028_POOL), "framework")
    assert (r["gib"], r["status"]) == (0.56, "derived")  # 51.66 − 51.1


def test_framework_unknown_when_nothing_prints_non_torch():
    r = row(report(V092), "framework")
    assert r["gib"] is None and r["status"] == "unknown" and r["derivation"]


def test_budget_as_the_profile_prints_it():
    b = report(V073)["budget"]
    assert b["gib"] == 71.26 and "line 6" in b["derivation"]  # 79.18 × 0.90 = 71.26, printed


def test_budget_as_the_free_memory_report_prints_it():
    assert report(V0271)["budget"]["gib"] == 72.91  # (0.92, 72.91 GiB)


def test_budget_unknown_without_a_total():
    b = report(V092)["budget"]
    assert b["gib"] is None and "--gpu-total-gib" in b["derivation"]


def test_budget_derived_from_a_stated_total():
    b = report(V092, gpu_total_gib=79.18)["budget"]
    assert b["gib"] == 67.3  # 79.18 × 0.85 = 67.303
    assert "79.18" in b["derivation"] and "0.85" in b["derivation"]


def test_budget_derived_from_the_064_total():
    # the one-line record prints total 23.58 and util 0.90 but no usable figure: 23.58 × 0.9 = 21.222
    assert report("vllm_v064_max_seq_len.log")["budget"]["gib"] == 21.22


# ---- KV tokens -------------------------------------------------------------------------------

def test_kv_tokens_are_the_least_of_the_per_worker_lines():
    rep = report(V092)
    # line 8 prints 282,784, line 10 prints 282,464: the engine runs with the smaller
    assert rep["kv_pool"]["tokens"] == 282464
    assert "least of 2" in rep["kv_pool"]["derivation"]["tokens"] and "line 10" in rep["kv_pool"]["derivation"]["tokens"]
    # 34.48 GiB × 2^30 / 282464 = 131070.4 → 131070 B per token
    assert rep["kv_pool"]["bytes_per_token"] == 131070


def test_kv_tokens_from_blocks_times_a_stated_block_size():
    rep = report(V073)
    assert rep["kv_pool"]["tokens"] == 28048 * 16 == 448768
    assert "28048" in rep["kv_pool"]["derivation"]["tokens"] and "16" in rep["kv_pool"]["derivation"]["tokens"]


def test_kv_tokens_unknown_from_blocks_without_a_block_size(tmp_path):
    rep = variant(tmp_path, V073, ("block_size=16, ", "block_size=None, "))
    assert rep["kv_pool"]["tokens"] is None
    assert "block size" in rep["kv_pool"]["derivation"]["tokens"]
    assert all(c["max_concurrent"] is None for c in rep["concurrency"])


def test_kv_tokens_from_the_max_seq_len_error():
    rep = report("vllm_v064_max_seq_len.log")
    assert rep["kv_pool"]["tokens"] == 23648 and "line 5" in rep["kv_pool"]["derivation"]["tokens"]


def test_hybrid_note_from_021():
    rep = report(V0271)
    text = rep["kv_pool"]["derivation"]["tokens"]
    assert rep["kv_pool"]["tokens"] == 1407894
    assert "hybrid" in text and "line 3" in text and "exceed" in text


def test_no_hybrid_note_before_021(tmp_path):
    rep = variant(tmp_path, V0271, ("(v0.27.1)", "(v0.11.0)"))
    assert rep["config"]["framework_version"] == "0.11.0"
    assert "hybrid" not in rep["kv_pool"]["derivation"]["tokens"]


def test_no_hybrid_note_without_the_block_size_line():
    assert "hybrid" not in report(V092)["kv_pool"]["derivation"]["tokens"]


# ---- concurrency -----------------------------------------------------------------------------

def test_concurrency_is_an_upper_bound_without_max_num_seqs():
    rep = report(V092)
    c = conc(rep, 4096)
    # 282464 // 4096 = 68 (68.96); no max_num_seqs in the non-default args
    assert (c["max_concurrent"], c["token_limit"], c["request_limit"]) == (68, 68, None)
    assert c["upper_bound"] is True and c["binding"] == "tokens"
    assert "upper bound" in c["derivation"]
    assert [x["max_concurrent"] for x in rep["concurrency"]] == [68, 45, 34]  # // 4096, 6144, 8192


def test_concurrency_namespace_none_is_not_a_limit():
    # `max_num_seqs=None` in args: Namespace(…) means the default, which is not assumed
    c = conc(report(V073), 4096)
    assert c["max_concurrent"] == 448768 // 4096 == 109 and c["upper_bound"] is True


def test_concurrency_min_with_a_stated_max_num_seqs():
    rep = report(V011_SEQS)
    assert rep["config"]["max_running_requests"] == 128
    c = conc(rep, 4096)
    # min(38944 // 4096 = 9, 128) = 9, bound by tokens
    assert (c["max_concurrent"], c["token_limit"], c["request_limit"], c["binding"]) == (9, 9, 128, "tokens")
    assert c["upper_bound"] is False


def test_concurrency_bound_by_max_num_seqs_for_short_requests():
    rep = report(V011_SEQS, token_lengths=(256,))
    (c,) = rep["concurrency"]
    # min(38944 // 256 = 152, 128) = 128, bound by requests
    assert (c["max_concurrent"], c["token_limit"], c["request_limit"], c["binding"]) == (128, 152, 128, "requests")


def test_vllm_maximum_concurrency_cross_check_agrees():
    check = report(V011_SEQS)["concurrency_check"]
    # 38944 / 32000 = 1.217 → 1.22, as vLLM prints
    assert check["tokens"] == 32000 and check["vllm_x"] == 1.22 and check["capdiag_x"] == 1.22
    assert check["agree"] is True
    check = report(V092)["concurrency_check"]
    assert (check["vllm_x"], check["capdiag_x"], check["agree"]) == (6.9, 6.9, True)  # 282464 / 40960 = 6.896


def test_vllm_maximum_concurrency_cross_check_disagrees(tmp_path):
    rep = variant(tmp_path, V011_SEQS, ("tokens per request: 1.22x", "tokens per request: 1.50x"))
    check = rep["concurrency_check"]
    assert (check["vllm_x"], check["capdiag_x"], check["agree"]) == (1.5, 1.22, False)
    assert "disagree" in check["derivation"]


def test_max_model_len_from_the_engine_config():
    assert report(V092)["config"]["max_model_len"] == 40960
    assert report(V073)["config"]["max_model_len"] == 32768


# ---- error findings --------------------------------------------------------------------------

def test_no_cache_blocks_is_out_of_memory_raise_utilization():
    rep = report("vllm_v083_no_cache_blocks.log")
    f = finding(rep, "out-of-memory")
    assert f is not None and f["severity"] == "error"
    assert f["detail"]["direction"] == "raise"
    # weights + activation + non-torch are 0.954 of the total: under 5% would be left for the KV
    # cache at any utilization, so none is suggested
    assert f["action"].startswith("No gpu_memory_utilization helps: weights 34.43 + activation peak 2.71 + "
                                  "non-torch 0.43 = 37.57 GiB is 0.954 of the total 39.38 GiB")
    assert f["detail"]["suggested"] is None
    assert 7 in [e["line"] for e in f["evidence"]]  # the first "No available memory" line
    assert rep["source"]["ready"] is False


def test_oom_during_the_profile_run_points_at_profiling():
    """7B bf16 weights (14.19 GiB) on a 15.47 GiB card: at gpu_memory_utilization 0.95 they leave
    0.50 GiB, less than the 1.02 GiB the profile run asked for, so no setting of this GPU helps
    (issue 27's expert: only quantized weights, two GPUs or a bigger card)."""
    rep = report("vllm_v013_oom_profile.log")
    f = finding(rep, "out-of-memory")
    assert f["detail"]["direction"] == "weights" and f["detail"]["phase"] == "weights"
    assert "even gpu_memory_utilization 0.95 leaves 0.50 GiB beside them, less than the 1.02 GiB" in f["action"]
    assert "--max-num-batched-tokens" in f["action"] and "use quantized weights" in f["action"]
    assert "1044.48" in f["message"]  # 1.02 GiB × 1024 tried
    # the stated cause, not the bare "EngineCore failed to start" before it, is where it stopped
    assert rep["source"]["stopped_at"]["line"] == 5


def test_oom_after_the_pool_was_sized_points_down():
    f = finding(report("vllm_v011_oom_capture.log"), "out-of-memory")
    assert f["detail"]["direction"] == "lower" and "Lower --gpu-memory-utilization" in f["action"]


def test_context_exceeds_kv_from_the_max_seq_len_error():
    rep = report("vllm_v064_max_seq_len.log")
    f = finding(rep, "context-exceeds-kv")
    assert f["severity"] == "error"
    assert "29000" in f["message"] and "23648" in f["message"]
    assert "23648" in f["action"] and "--max-model-len" in f["action"]
    # twice 23,648 tokens hold 29,000: the fp8 cache is offered, resting on the KV dtype (line 2)
    assert "store the KV cache in fp8 (--kv-cache-dtype fp8: about 47,296 tokens)" in f["action"]
    assert lines_of(f) == [2, 5]
    assert rep["config"]["max_model_len"] == 29000


def test_utilization_too_high_from_the_free_memory_error():
    rep = report("vllm_v0102_util_too_high.log")
    f = finding(rep, "utilization-too-high")
    assert f["severity"] == "error"
    # ceiling = free / total = 13.58 / 15.99 = 0.8493 → 0.84 (rounded down, so it fits)
    assert f["detail"]["ceiling"] == 0.84 and "≤ 0.84" in f["action"]
    assert "2.41 GiB" in f["action"]  # 15.99 − 13.58 held by another process
    assert "13.58" in f["message"] and "15.99" in f["message"] and "0.85" in f["message"]
    assert rep["gpu"]["total_gib"] == 15.99 and rep["gpu"]["total_source"] == "log"
    assert finding(rep, "out-of-memory") is None


def test_clean_start_ups_raise_no_error_finding():
    for name in (V073, V092, V0271, V011_SEQS, V033_RESERVED):
        assert [f["rule"] for f in report(name)["findings"] if f["severity"] == "error"] == [], name


# ---- the GPU total from the log --------------------------------------------------------------

def test_gpu_total_from_the_log():
    assert report(V073)["gpu"]["total_gib"] == 79.18       # profile record
    assert report(V0271)["gpu"]["total_gib"] == 79.25      # Free memory on device (78.1/79.25 GiB)
    assert report("vllm_v013_oom_profile.log")["gpu"]["total_gib"] == 15.47  # PyTorch's OOM message
    assert report(V092)["gpu"]["total_gib"] is None


def test_text_report_renders_for_every_fixture():
    for path in sorted(FIXTURES.glob("vllm_*.log")):
        text = render(build(analyse(str(path))), "text")
        assert "vLLM" in text and "MEMORY BREAKDOWN" in text, path.name


def test_target_rank_that_printed_nothing_is_an_input_error():
    with pytest.raises(InputError):
        analyse(fixture(V092), target_rank="tp5")


# ---- known bugs: lines the grammar misses, seen from the report ------------------------------

def test_gpu_memory_utilization_from_the_cuda_graph_advice():
    rep = report("vllm_v021_advice_only.log")
    assert rep["config"]["gpu_memory_utilization"] == 0.92  # `--gpu-memory-utilization=0.9200`


def test_advice_only_log_otherwise_reads():
    rep = report("vllm_v021_advice_only.log")
    assert row(rep, "cuda_graph")["gib"] == 0.58 and row(rep, "kv_cache")["gib"] == 55.7
    # stated only by the CUDA-graph advice line, and read from it (never from a default)
    assert rep["config"]["gpu_memory_utilization"] == 0.92
    assert "CUDA-graph profiling advice" in rep["config_sources"]["gpu_memory_utilization"]


def test_gpu_memory_utilization_from_the_debug_requested_line():
    rep = report("vllm_v0102_debug_requested.log")
    assert rep["config"]["gpu_memory_utilization"] == 0.9


def test_uvicorn_startup_complete_means_ready(tmp_path):
    rep = variant(tmp_path, V073, drop="init engine (profile, create kv cache, warmup model)")
    assert rep["source"]["ready"] is True
    assert finding(rep, "startup-incomplete") is None


def test_version_from_the_015_banner_and_the_hybrid_note():
    rep = report("vllm_v021_banner_hybrid.log")
    assert rep["config"]["framework_version"] == "0.21.0"
    assert "hybrid" in rep["kv_pool"]["derivation"]["tokens"]


def test_context_exceeds_kv_from_the_v1_max_seq_len_error():
    rep = report("vllm_v0112_max_seq_len_v1.log")
    f = finding(rep, "context-exceeds-kv")
    assert f is not None and f["severity"] == "error"
    assert rep["config"]["max_model_len"] == 131072
    assert rep["source"]["stopped_at"]["line"] == 6


def test_v1_max_seq_len_log_still_reports_the_failure():
    rep = report("vllm_v0112_max_seq_len_v1.log")
    assert rep["source"]["ready"] is False
    # one failure, one finding: the one with the token figures names it, and the report opens with it
    f = finding(rep, "context-exceeds-kv")
    assert f["severity"] == "error" and finding(rep, "startup-failed") is None
    assert rep["summary"]["outcome"] == "failed" and rep["summary"]["finding"] == f["code"]


def test_a_kv_reservation_is_the_observed_kv_memory():
    # --kv-cache-memory skips profiling: `reserved 40.00 GiB memory for KV Cache` stands where
    # `Available KV cache memory` would be printed
    rep = report("vllm_v033_kv_reserved.log")
    assert rep["observed"]["available_kv_cache_gib"] == 40.0
    assert next(r for r in rep["breakdown"] if r["category"] == "kv_cache")["gib"] == 40.0


def test_a_hybrid_block_size_the_api_server_prints_before_the_engine_line_stays_in_its_start_up():
    """vLLM 0.16+ resolves a hybrid model's attention block size in the API server, before the
    engine's `Initializing a V1 LLM engine` line: one start-up, its arguments kept."""
    rep = report("vllm_v018_hybrid_block_before_engine.log")
    assert rep["source"]["launches"] == 1 and rep["source"]["ready"] is True
    assert rep["config"]["gpu_memory_utilization"] == 0.85 and rep["config"]["max_model_len"] == 8192


def test_a_refusal_that_states_only_the_sizes_gives_the_length_that_fits_and_only_the_ways_that_close_the_gap(tmp_path):
    """vLLM's V1 refusal without its estimate (`Based on the available memory,` and nothing
    after it): the longest length is the context scaled by available / needed; an fp8 cache
    (5.00 GiB of 1.25) and a higher utilization (0.9 + 8.75 / 23.99 > 0.95) cannot close the
    gap, so neither is offered; on a larger GPU the utilization that closes it is."""
    lines = ["(APIServer pid=3311) INFO 06-02 05:14:40 [api_server.py:1287] vLLM API server version 0.9.0",
             "(APIServer pid=3311) INFO 06-02 05:14:40 [cli_args.py:309] non-default args: {'model': 'org/m-32b-w4a16', "
             "'gpu_memory_utilization': 0.9}",
             "ERROR 06-02 05:17:18 [core.py:387] ValueError: To serve at least one request with the models's max seq len "
             "(40960), (10.00 GiB KV cache is needed, which is larger than the available KV cache memory (1.25 GiB). Based "
             "on the available memory,  Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
             "initializing the engine."]
    log = write_log(tmp_path, "\n".join(lines) + "\n")
    f = finding(json.loads(render(build(analyse(log, gpu_total_gib=23.99)), "json")), "context-exceeds-kv")
    assert "a request of at most about 5,096 tokens fits (40,960 × 1.25 / 10.00" in f["message"]
    assert f["action"] == "Set --max-model-len ≤ 5096; or shard the model over more GPUs (--tensor-parallel-size)."
    # 0.9 + (10.00 − 1.25 + 0.005) / 139.8 = 0.963: past 0.95 on an H200 too; on 180 GiB, 0.949 → 0.95
    h200 = finding(json.loads(render(build(analyse(log, gpu_total_gib=139.8)), "json")), "context-exceeds-kv")
    assert "gpu-memory-utilization" not in h200["action"]
    large = finding(json.loads(render(build(analyse(log, gpu_total_gib=180.0)), "json")), "context-exceeds-kv")
    assert "raise --gpu-memory-utilization to 0.95 (8.75 GiB more)" in large["action"]
