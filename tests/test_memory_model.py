"""The memory model (capdiag.memory) against what real start-ups printed, in its three directions:
backwards (a log's own figures through the framework's formula give the pool it printed),
forwards (config.json + GPU + settings give what the framework allocated: the shared plan
cases, each with every setting its log states) and the weights of quantized checkpoints."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capdiag.memory import sglang as sg, vllm as vl
from capdiag.memory.kv import Cell, cell, state
from capdiag.memory.shape import model_shape
from capdiag.memory.weights import quantization, weight_bytes
from capdiag.parsing.model_config import read_model_config
from capdiag.rules import PLAN
from capdiag.rules.plan.driver import plan
from capdiag.rules.what_if.projection import log_cell
from capdiag import facts as F
from helpers import SHARED, needs_shared

GIB = 1 << 30
PLAN_CASES = SHARED / "plan"
CONFIGS = PLAN_CASES / "configs"
LOCAL_CONFIGS = Path(__file__).resolve().parent / "plan_configs"


def config(name: str) -> dict:
    return read_model_config(str(CONFIGS / f"{name}.config.json")).fields


# ---- backwards: each log's own figures, SGLang's formula --------------------------------------

# (log, free before weights, free after, mem_fraction_static, pool GiB printed, tokens printed), all
# read off the corpus lines the comment names
SGLANG_POOLS = [
    ("003 L1,3,12-13", 78.81, 63.72, 0.88, 54.26, 444_500),
    ("004 L1,3,13-14", 22.76, 8.37, 0.88, 5.64, 105_531),
    ("008 L7,97,122,130", 77.43, 40.69, 0.831, 27.58, 903_439),
    ("017 L3,26,53-54", 21.63, 6.09, 0.85, 2.84, 46_611),
    ("002 L6,371,428,436", 283.56, 209.98, 0.8260405859375, 160.63, 2_454_421),
]


@pytest.mark.parametrize("where, pre, post, fraction, kv_gib, tokens", SGLANG_POOLS)
def test_sglang_rest_gives_the_logs_pool(where, pre, post, fraction, kv_gib, tokens):
    rest = sg.rest_gib(pre, post, fraction)
    predicted = sg.pool(rest, [log_cell(kv_gib * GIB / tokens)]).tokens
    # the printed GiB carry ±0.005 each: at most a few hundred tokens either way
    assert abs(predicted - tokens) / tokens < 0.002, (where, rest, predicted)


@needs_shared
def test_sglang_dsa_on_rocm_is_sized_by_the_raw_latent():
    # sglang/001 (GLM-5-FP8, MI355X, fp8 KV): rest 193.92 − 283.50 × 0.092 = 167.84 GiB bought
    # 3,262,823 tokens: 708 B a layer (512 + 64 + indexer 128 + 4), not the 788 B the pool holds
    shape, _ = model_shape(config("glm-5-fp8"))
    mla = shape.of("mla")
    rest = sg.rest_gib(283.50, 193.92, 0.908)
    raw = sg.pool(rest, [cell(mla, 1, 8, raw_latent=True)]).tokens
    assert cell(mla, 1, 8, raw_latent=True).per_layer == 708 and cell(mla, 1, 8).per_layer == 788
    assert abs(raw - 3_262_823) / 3_262_823 < 0.001


def test_sglang_mamba_slots_and_request_cap():
    # sglang/011 (Qwen3.5-9B, TP2): 4.48 GiB of state for 186 slots (L57), KV 5.00 GiB (L59),
    # rest ≈ 9.48; 0.9/1.9 of rest to the state, (budget − per) // per slots, cap 186 // 3 = 62 (L97)
    per = 4.48 * GIB / 187
    pool = sg.pool(9.48, [log_cell(5.00 * GIB / 327_310)], state=_state(per))
    assert pool.state_slots == 186 and pool.request_cap == 62
    assert abs(pool.tokens - 327_310) / 327_310 < 0.01


def _state(per_request: float):
    from capdiag.memory.kv import State
    return State(1, 0.0, per_request, "test")


def test_sglang_sliding_window_split():
    # sglang/502 (Gemma-4-31B, TP2, fp8 KV): 15.82 GiB (L61) → 92,143 full and 73,714 sliding tokens (L54)
    full = Cell("full", 10, 2048, 2, 1, None, "test")  # 10 full layers × 2 heads × (512 + 512) × 1 B
    sliding = Cell("sliding", 50, 4096, 8, 1, 1024, "test")  # 50 sliding layers × 8 heads × (256 + 256) × 1 B
    pool = sg.pool(15.82, [full, sliding])  # a full token costs 20,480 + 0.8 × 204,800 = 184,320 B
    assert abs(pool.tokens - 92_143) <= 30 and pool.swa_tokens == int(pool.tokens * 0.8)


@pytest.mark.parametrize("total_mib, tp, chunked, max_bs, fraction", [
    (81_559, 1, 8192, 4, 0.841),  # sglang/027 L8: H100, chunked 8192, cuda_graph_max_bs 4
    (294_912, 8, 16384, 512, 0.908),  # sglang/001 L12: MI355X TP8
])
def test_sglang_default_fraction(total_mib, tp, chunked, max_bs, fraction):
    assert sg.default_fraction(total_mib, tp, 1, chunked, max_bs)[0] == fraction


# ---- backwards: vLLM's budget and pool ---------------------------------------------------------

# (log, total, utilization, weights + non-torch, activation peak, graph estimate, available printed)
VLLM_BUDGETS = [
    ("608 L555-558 v0.12.0", 94.97, 0.5, 7.56 + 0.06, 0.59, 0.0, 39.28),
    ("615 L67-78 v0.26.1rc1", 79.25, 0.9, 57.26, 0.08, 0.15, 13.84),
    ("017 L97-111 v0.27.1", 79.25, 0.92, 25.86, 1.36, 0.96, 44.73),
]


@pytest.mark.parametrize("where, total, util, consumed, activation, graphs, available", VLLM_BUDGETS)
def test_vllm_budget_identity(where, total, util, consumed, activation, graphs, available):
    got = vl.available_gib(total, util, consumed, 0.0, activation, graphs)
    assert abs(got - available) <= 0.02, (where, got)


@needs_shared
def test_vllm_hybrid_pools_print_as_each_release_counts_them():
    # gpt-oss-120b TP4 (vllm/002, v0.10.1.1): 45.32 GiB (L104) → 2,640,144 tokens (L108), 284.25× (L109)
    oss, _ = model_shape(config("gpt-oss-120b"))
    cells = [cell(a, 2, 4) for a in oss.attention]
    pool = vl.pool(45.32, cells, (0, 10), 16_384, batched_tokens=2048)
    assert abs(pool.tokens - 2_640_144) <= 200 and round(pool.concurrency, 2) == 284.25
    # Qwen3.6-27B TP2 (vllm/017, v0.27.1): 44.73 GiB (L98) → 784-token blocks, 21.48× (L101), 1,407,894 (L100)
    qwen, _ = model_shape(config("qwen3.6-27b"))
    pool = vl.pool(44.73, [cell(a, 2, 2) for a in qwen.attention], (0, 27), 65_536, state(qwen.recurrent, 2, 2))
    assert pool.block_size == 784 and round(pool.concurrency, 2) == 21.48
    assert abs(pool.tokens - 1_407_894) / 1_407_894 < 0.001


# ---- weights of quantized checkpoints ----------------------------------------------------------

@needs_shared
@pytest.mark.parametrize("name, tp, measured, where", [
    ("gpt-oss-120b", 4, 17.2217, "vllm/002 L89 (MXFP4 experts, kernels' padding)"),
    ("gpt-oss-120b", 2, 32.98, "vllm/609 L52"),
    ("qwen3-235b-a22b-fp8", 8, 27.6656, "vllm/018 L211 (fp8 blocks of 128×128)"),
    ("glm-5-fp8", 8, 89.58, "sglang/001 L497 (fp8, 712 modules left unconverted)"),
])
def test_quantized_weights(name, tp, measured, where):
    cfg = config(name)
    shape, _ = model_shape(cfg)
    quant, _ = quantization(cfg, None)
    got = weight_bytes(shape, tp, quant, 2).gib
    assert abs(got - measured) / measured < 0.012, (where, got)


# ---- forwards: the shared plan cases, every setting the log states -----------------------------

def _stated_settings() -> dict[str, dict]:
    """What each case's log states beyond check.py's flags (its notes name the lines)."""
    return {"V001": {"version": "0.10.1.1"}, "V002": {"version": "0.10.1.1"},
            "V004": {"version": "0.11.0", "settings": ("max_num_seqs=128",)},
            "V015": {"version": "0.7.2"}, "V017": {"version": "0.27.1", "gpu": "a100_80gb_sxm"},
            "V018": {"version": "0.10.0"},
            "V608": {"version": "0.12.0", "settings": ("max_num_seqs=8", "max_num_batched_tokens=8192")},
            "V610": {"version": "0.16.0", "settings": ("max_num_seqs=32", "enforce_eager=true")},
            "V611": {"version": "0.22.1", "settings": ("max_num_seqs=1", "enforce_eager=true")},
            "V615": {"version": "0.26.1", "settings": ("max_num_seqs=16",), "gpu": "a100_80gb_sxm"}}


# the checkpoints behind these kept layers unquantized that the case's config.json (its quantization
# block removed) cannot say: the plan's generic 4-bit layout under-counts their weights
UNKNOWN_LAYOUT = {"S502": "AWQ checkpoint with layers kept in 16 bits", "S505": "AWQ checkpoint with layers kept in "
                  "16 bits (14.45 GiB a rank for 27 B parameters)"}


def _cases():
    path = PLAN_CASES / "plan-cases.json"
    return json.loads(path.read_text()) if path.exists() else []


@needs_shared
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["id"])
def test_plan_predicts_what_the_framework_allocated(case):
    from capdiag.whatif import parse_settings
    if case["id"] in UNKNOWN_LAYOUT:
        pytest.xfail(UNKNOWN_LAYOUT[case["id"]])
    stated = _stated_settings().get(case["id"], {})
    kv = case["kv_cache_dtype"]
    request = F.PlanRequest(evidence=F.Evidence(0, "test", 0, "input"), framework=case["framework"], tp=case["tp"],
                            gpus=case["tp"], fraction=case["fraction"], kv_dtype=kv, weight_dtype=case["weight_dtype"],
                            contexts=(case["context"],) if case["context"] else (), version=stated.get("version"),
                            settings=tuple(sorted(parse_settings(stated.get("settings", ()), "--set").items())))
    report = plan(PLAN, request, config_json=str(PLAN_CASES / case["model_config"]),
                  gpu=stated.get("gpu", case["gpu"]), gpu_total_gib=case["gpu_total_gib"])
    actual, g = case["actual"], report["per_gpu"]
    assert report["verdict"] == ("fits" if actual["fits"] else "does_not_fit"), report["reason"]
    assert abs(g["weights_gib"]["value"] - actual["weights_gib"]) < max(0.035 * actual["weights_gib"], 0.06)
    if actual["kv_tokens"]:
        error = abs(g["kv_tokens"]["value"] - actual["kv_tokens"]) / actual["kv_tokens"]
        assert error < 0.10, (g["kv_tokens"], actual)


def test_a_plan_without_a_gpu_is_unknown_not_a_default():
    request = F.PlanRequest(evidence=F.Evidence(0, "test", 0, "input"), framework="vllm")
    report = plan(PLAN, request, config_json=str(LOCAL_CONFIGS / "llama-3.1-8b.json"))
    assert report["verdict"] == "unknown" and "give --gpu or --gpu-total-gib" in report["reason"]
    assert report["per_gpu"]["kv_tokens"]["value"] is None
