"""The inputs beside the log: nvidia-smi output (every form capdiag accepts, and the ones it
must refuse), a model's config.json (theoretical KV bytes per token and weights), and the GPU
identity and total that --gpu, --gpu-total-gib and nvidia-smi give.

nvidia-smi samples and config.json files live in tests/inputs/. The config.json files carry
the public values of each model; the expected bytes per token are worked out by hand in each
case, with the arithmetic beside it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capdiag import facts as F
from capdiag.analysis import analyse
from capdiag.errors import InputError
from capdiag.parsing.model_config import read_model_config
from capdiag.parsing.nvidia_smi import read_nvidia_smi
from capdiag.report import build
from capdiag.rows import plain
from helpers import SGLANG_CORPUS, TESTS, fixture, lines_of, row, run_entry, write_log

LOG_SINGLE = fixture("single_gpu_ready.log")

INPUTS = TESTS / "inputs"
GIB = 1 << 30
VLLM_TP2 = fixture("vllm_v092_tp2.log")  # Qwen3-32B TP2, gpu_memory_utilization 0.85, prints no total


def inp(name: str) -> str:
    path = INPUTS / name
    assert path.exists(), f"missing input {path}"
    return str(path)


# ==== nvidia-smi ===============================================================================

def smi(name: str) -> list[tuple]:
    return [(g.index, g.used_mib, g.free_mib, g.total_mib, g.name) for g in read_nvidia_smi(inp(name)) if isinstance(g, F.SmiGpu)]


H20_ROWS = [(0, 63092, 34276, None, None)] + [(i, 63188, 34180, None, None) for i in range(1, 7)] + \
           [(7, 62708, 34660, None, None)]


def test_smi_documented_query_without_header():
    # `nvidia-smi --query-gpu=index,memory.used,memory.free --format=csv,noheader` (corpus 012)
    assert smi("smi_query_noheader.csv") == H20_ROWS
    gpus = read_nvidia_smi(inp("smi_query_noheader.csv"))
    assert [g.evidence.line for g in gpus] == list(range(1, 9))
    assert all(g.evidence.source == "nvidia-smi" for g in gpus)


def test_smi_documented_query_with_header():
    assert smi("smi_query_header.csv") == H20_ROWS
    assert [g.evidence.line for g in read_nvidia_smi(inp("smi_query_header.csv"))] == list(range(2, 10))


def test_smi_extra_columns_with_header():
    assert smi("smi_query_extra_columns.csv") == [(0, 74311, 6722, 81559, "NVIDIA H100 80GB HBM3"),
                                                 (1, 74295, 6738, 81559, "NVIDIA H100 80GB HBM3")]


def test_smi_nounits(tmp_path):
    # `--format=csv,noheader,nounits`
    path = write_log(tmp_path, "0, 63092, 34276\n1, 63188, 34180\n", "smi.csv")
    assert [(g.index, g.used_mib, g.free_mib) for g in read_nvidia_smi(path)] == [(0, 63092, 34276), (1, 63188, 34180)]


def test_smi_old_table_with_truncated_name():
    # driver 525 layout; the name column cuts `Tesla V100-SXM2-32GB` to `Tesla V100-SXM2...`;
    # the table prints used / total, no free; the process table below is not a GPU
    assert smi("smi_table_driver525_v100.txt") == [(0, 29810, None, 32768, "Tesla V100-SXM2..."),
                                                   (1, 29806, None, 32768, "Tesla V100-SXM2...")]


def test_smi_wide_table():
    assert smi("smi_table_driver570_h100.txt") == [(0, 74311, None, 81559, "NVIDIA H100 80GB HBM3"),
                                                   (1, 74295, None, 81559, "NVIDIA H100 80GB HBM3")]


def test_smi_gb10_not_supported():
    # DGX Spark: unified memory, nvidia-smi prints `Not Supported` for memory usage
    assert smi("smi_table_gb10.txt") == [(0, None, None, None, "NVIDIA GB10")]


@pytest.mark.parametrize("name", ["smi_bad_five_columns_noheader.csv", "smi_bad_empty.txt", "smi_bad_garbage.txt"])
def test_smi_bad_inputs_are_input_errors(name):
    with pytest.raises(InputError):
        read_nvidia_smi(inp(name))


def test_smi_five_columns_without_header_says_to_keep_the_header():
    with pytest.raises(InputError, match="header"):
        read_nvidia_smi(inp("smi_bad_five_columns_noheader.csv"))


def test_smi_missing_file_is_an_input_error():
    with pytest.raises(InputError):
        read_nvidia_smi(str(INPUTS / "no-such-file.csv"))


@pytest.mark.parametrize("name", ["smi_bad_five_columns_noheader.csv", "smi_bad_empty.txt", "smi_bad_garbage.txt"])
def test_cli_bad_smi_exits_2(monkeypatch, capsys, name):
    code, out, err = run_entry(monkeypatch, capsys, "explain", VLLM_TP2, "--nvidia-smi-file", inp(name))
    assert code == 2 and out == "" and err.startswith("capdiag: error:")


@pytest.mark.parametrize("name", ["smi_query_noheader.csv", "smi_query_header.csv", "smi_query_extra_columns.csv",
                                  "smi_table_driver525_v100.txt", "smi_table_driver570_h100.txt",
                                  "smi_table_gb10.txt"])
def test_cli_good_smi_exits_0(monkeypatch, capsys, name):
    code, out, err = run_entry(monkeypatch, capsys, "explain", VLLM_TP2, "--nvidia-smi-file", inp(name),
                             "--format", "json")
    assert code == 0, err
    assert json.loads(out)["nvidia_smi"]["gpus"] >= 1


# ---- nvidia-smi in the report --------------------------------------------------------------------

def test_per_rank_nvidia_smi_in_the_report():
    rep = build(analyse(VLLM_TP2, nvidia_smi=inp("smi_query_extra_columns.csv")))
    by_label = {r["label"]: r["nvidia_smi"] for r in rep["ranks"]}
    assert by_label["TP0"] == {"index": 0, "used_mib": 74311, "free_mib": 6722, "total_mib": 81559}
    assert by_label["TP1"] == {"index": 1, "used_mib": 74295, "free_mib": 6738, "total_mib": 81559}
    assert rep["nvidia_smi"]["gpus"] == 2 and "sampled" in rep["nvidia_smi"]["note"]


def test_nvidia_smi_spread_names_outliers(tmp_path):
    path = write_log(tmp_path, "0, 74311 MiB, 6722 MiB\n1, 70011 MiB, 11022 MiB\n2, 74300 MiB, 6733 MiB\n", "smi.csv")
    rep = build(analyse(VLLM_TP2, nvidia_smi=path))
    # median used 74300; GPU 1 is 4289 MiB (> 1 GiB) below it
    assert "GPU 1 differ" in rep["nvidia_smi"]["spread"]


def test_target_rank_pp1_on_a_pp_log_pairs_gpu_1():
    log = fixture("vllm_v0271_pp2.log")  # corpus 403: Worker_PP0 / Worker_PP1, only PP0 prints KV
    rep = build(analyse(log, target_rank="pp1", nvidia_smi=inp("smi_query_extra_columns.csv")))
    assert rep["target_rank"].startswith("PP1")
    w = row(rep, "weights")
    assert w["gib"] == 30.52 and lines_of(w) == [2]  # the PP1 worker's own line
    assert row(rep, "kv_cache")["gib"] is None  # PP1 printed no KV figure
    assert {k: v for k, v in rep["observed"].items() if v is not None} == {"model_loading_gib": 30.52}
    # PP stage 1 × TP size 1 + TP 0 → GPU 1
    pp1 = next(r for r in rep["ranks"] if r["rank"]["pp"] == 1)
    assert pp1["nvidia_smi"]["index"] == 1
    # the default target is PP0, which printed the KV figure
    assert row(build(analyse(log)), "kv_cache")["gib"] == 6.92


def test_target_rank_pp1_without_pp_lines_is_an_input_error():
    with pytest.raises(InputError):
        analyse(VLLM_TP2, target_rank="pp1")


# ---- the `other` row: nvidia-smi used minus what the log explains ---------------------------------

SG012 = SGLANG_CORPUS / "012-dsv4-flash-h20-tp8-fixture-memory-profiling.log"


@pytest.mark.skipif(not SG012.exists(), reason="shared corpus (../shared) is absent")
@pytest.mark.parametrize("smi_name", ["smi_query_noheader.csv", "smi_query_header.csv"])
def test_other_row_from_nvidia_smi(smi_name):
    rep = build(analyse(str(SG012), nvidia_smi=inp(smi_name), gpu="h20"))
    rows = {r["category"]: r for r in rep["breakdown"]}
    # framework: H20 reference total 97871 MiB = 95.58 GiB − free before weights 93.61 = 1.97
    # weights 93.58 − 57.01 = 36.57; kv 19.58 (DSv4 available_bytes); graphs 1.93
    assert (rows["framework"]["gib"], rows["weights"]["gib"], rows["kv_cache"]["gib"], rows["cuda_graph"]["gib"]) \
        == (1.97, 36.57, 19.58, 1.93)
    other = rows["other"]
    # 63092 MiB / 1024 = 61.613 GiB − (1.97 + 36.57 + 19.58 + 1.93 = 60.05) = 1.563 → 1.56
    assert (other["gib"], other["status"]) == (1.56, "derived")
    assert round(63092 / 1024 - (1.97 + 36.57 + 19.58 + 1.93), 2) == 1.56
    assert "63092" in other["derivation"]
    assert any(e["source"] == "nvidia-smi" for e in other["evidence"])
    # the log prints TP0 and TP1; each is paired with its own GPU
    smi_by_tp = {r["rank"]["tp"]: r["nvidia_smi"] for r in rep["ranks"]}
    assert smi_by_tp == {0: {"index": 0, "used_mib": 63092, "free_mib": 34276, "total_mib": None},
                         1: {"index": 1, "used_mib": 63188, "free_mib": 34180, "total_mib": None}}


def test_other_row_unknown_without_nvidia_smi():
    r = row(build(analyse(VLLM_TP2)), "other")
    assert r["gib"] is None and r["status"] == "unknown" and "nvidia-smi" in r["derivation"]


def test_other_row_unknown_without_used_memory():
    r = row(build(analyse(VLLM_TP2, nvidia_smi=inp("smi_table_gb10.txt"))), "other")
    assert r["gib"] is None and r["status"] == "unknown"


# ==== GPU identity and total =====================================================================

def gpu_of(**kw) -> dict:
    return build(analyse(VLLM_TP2, **kw))["gpu"]


def test_identity_from_the_smi_name():
    g = gpu_of(nvidia_smi=inp("smi_query_extra_columns.csv"))
    assert (g["alias"], g["name"], g["ambiguous"]) == ("h100_sxm", "NVIDIA H100 80GB HBM3", False)
    assert "nvidia-smi name" in g["identity"]
    # the measured total beats the reference: 81559 MiB / 1024 = 79.65
    assert (g["total_gib"], g["total_source"]) == (79.65, "nvidia-smi")


def test_identity_from_the_wide_table_name():
    assert gpu_of(nvidia_smi=inp("smi_table_driver570_h100.txt"))["alias"] == "h100_sxm"


def test_identity_from_the_moe_device_name(tmp_path):
    log = write_log(tmp_path, Path(VLLM_TP2).read_text(encoding="utf-8") + (
        "(VllmWorker rank=0 pid=60240) WARNING 07-09 16:40:20 [fused_moe.py:690] Using default MoE config. Performance "
        "might be sub-optimal! Config file not found at /opt/venv/lib/python3.12/site-packages/vllm/model_executor/"
        "layers/fused_moe/configs/E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json\n"))
    g = build(analyse(log))["gpu"]
    assert (g["alias"], g["name"]) == ("h100_sxm", "NVIDIA H100 80GB HBM3")
    assert "MoE kernel-config device_name" in g["identity"]
    # the reference's observed nvidia-smi total, not the marketing 80 GB
    assert (g["total_gib"], g["total_source"]) == (79.65, "reference")


def test_identity_never_from_the_size():
    # 81559 MiB is what H100 SXM, H100 PCIe and H800 all report: the size names no GPU
    g = gpu_of(nvidia_smi=inp("smi_query_total_no_name.csv"))
    assert g["alias"] is None and g["name"] is None
    assert g["total_gib"] == 79.65 and g["total_source"] == "nvidia-smi"


def test_truncated_name_is_ambiguous():
    g = gpu_of(nvidia_smi=inp("smi_table_driver525_v100.txt"))
    # `Tesla V100-SXM2...` begins both the 16 GB and the 32 GB entries
    assert g["ambiguous"] is True and "v100_32gb" in g["identity"] and "v100_16gb" in g["identity"]
    assert g["total_gib"] == 32.0  # 32768 MiB from the table decides the memory, not the name


def test_gpu_flag_wins_over_the_names():
    g = gpu_of(gpu="h200", nvidia_smi=inp("smi_query_extra_columns.csv"))
    assert g["alias"] == "h200" and g["ambiguous"] is False and "--gpu wins" in g["identity"]


def test_gpu_total_from_the_reference():
    g = gpu_of(gpu="h100_sxm")
    assert (g["total_gib"], g["total_source"]) == (79.65, "reference")  # 81559 / 1024


def test_gpu_total_gib_beats_the_reference():
    g = gpu_of(gpu="h100_sxm", gpu_total_gib=79.5)
    assert (g["total_gib"], g["total_source"]) == (79.5, "stated")
    assert g["alias"] == "h100_sxm"


def test_gpu_total_gib_beats_nvidia_smi():
    g = gpu_of(gpu_total_gib=79.1, nvidia_smi=inp("smi_query_extra_columns.csv"))
    assert (g["total_gib"], g["total_source"]) == (79.1, "stated")


def test_nominal_fallback_is_flagged():
    # Hygon K100_AI: the reference has no observed total, only the vendor's 64 GB (MI325X's 256 is
    # GiB in its source: test_a_nominal_size_the_vendor_states_in_gib_is_not_converted_from_gb)
    g = gpu_of(gpu="k100_ai")
    assert g["total_source"] == "nominal"
    assert g["total_gib"] == round(64e9 / GIB, 2) == 59.6
    assert "NOMINAL" in g["total_derivation"]


def test_gb10_is_nominal_and_shares_system_memory():
    g = gpu_of(nvidia_smi=inp("smi_table_gb10.txt"))
    assert g["alias"] == "gb10_dgx_spark" and g["shared_system_memory"] is True
    assert g["total_source"] == "nominal" and g["total_gib"] == round(128e9 / GIB, 2) == 119.21


def test_unknown_gpu_alias_is_an_input_error(monkeypatch, capsys):
    with pytest.raises(InputError):
        analyse(VLLM_TP2, gpu="no-such-gpu")
    code, _, err = run_entry(monkeypatch, capsys, "explain", VLLM_TP2, "--gpu", "no-such-gpu")
    assert code == 2 and "gpu-specs" in err


def test_budget_uses_the_stated_total():
    rep = build(analyse(VLLM_TP2, gpu_total_gib=79.5))
    assert rep["budget"]["gib"] == 67.58  # 79.5 × 0.85 = 67.575


def test_budget_uses_the_gpu_total_from_gpu_flag():
    rep = build(analyse(VLLM_TP2, gpu="h100_sxm"))
    assert rep["gpu"]["total_gib"] == 79.65
    assert rep["budget"]["gib"] == 67.7  # 79.65 × 0.85 = 67.7025


# ==== config.json ================================================================================

def sglang_log(tmp_path, model: str, tp: int, kv_cache_dtype: str, pp: int = 1) -> str:
    """A minimal SGLang start-up whose server_args states tp_size and kv_cache_dtype."""
    return write_log(tmp_path, "\n".join([
        f"[2025-12-10 10:00:00] server_args=ServerArgs(model_path='{model}', tokenizer_path='{model}', dtype='auto', "
        f"kv_cache_dtype='{kv_cache_dtype}', mem_fraction_static=0.85, tp_size={tp}, pp_size={pp}, dp_size=1, "
        "ep_size=1, enable_dp_attention=False)",
        "[2025-12-10 10:00:02 TP0] Load weight begin. avail mem=78.50 GB",
        "[2025-12-10 10:00:06 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.54 GB, "
        "mem usage=14.96 GB.",
        "[2025-12-10 10:00:50] The server is fired up and ready to roll!",
    ]) + "\n")


# (config, model, tp, kv dtype, bytes per token per rank, replication) — arithmetic:
KV_CASES = [
    # Llama-3.1-8B TP1 bf16: 8 KV heads × (128 + 128) × 32 layers × 2 B = 131072
    ("config_llama31_8b.json", "meta-llama/Llama-3.1-8B-Instruct", 1, "bfloat16", 131072, 1),
    # Llama-3.1-8B TP2 fp8: 8 // 2 = 4 × 256 × 32 × 1 B = 32768
    ("config_llama31_8b.json", "meta-llama/Llama-3.1-8B-Instruct", 2, "fp8_e4m3", 32768, 1),
    # Llama-3.1-70B TP8 bf16: 1 × (128 + 128) × 80 × 2 = 40960
    ("config_llama31_70b.json", "meta-llama/Llama-3.1-70B-Instruct", 8, "bfloat16", 40960, 1),
    # Llama-3.1-70B TP16 (kv_heads 8 < tp 16): max(1, 8 // 16) = 1 × 256 × 80 × 2 = 40960; each head twice
    ("config_llama31_70b.json", "meta-llama/Llama-3.1-70B-Instruct", 16, "bfloat16", 40960, 2),
    # Qwen2.5-7B TP1 bf16: head_dim 3584 / 28 = 128; 4 × 256 × 28 × 2 = 57344
    ("config_qwen25_7b.json", "Qwen/Qwen2.5-7B-Instruct", 1, "bfloat16", 57344, 1),
    # Mixtral-8x7B TP2 bf16: 8 // 2 = 4 × 256 × 32 × 2 = 65536
    ("config_mixtral_8x7b.json", "mistralai/Mixtral-8x7B-Instruct-v0.1", 2, "bfloat16", 65536, 1),
    # DeepSeek-V3 TP8 fp8 (MLA, not split by TP): (512 + 64) × 61 × 1 = 35136
    ("config_deepseek_v3.json", "deepseek-ai/DeepSeek-V3", 8, "fp8_e4m3", 35136, 1),
    # Qwen3-Next-style hybrid TP1 bf16: 48 / 4 = 12 full-attention layers; 2 × (256 + 256) × 12 × 2 = 24576
    ("config_qwen3_next_style.json", "Qwen/Qwen3-Next-80B-A3B-Instruct", 1, "bfloat16", 24576, 1),
    # the same at TP4 (2 KV heads < 4): max(1, 2 // 4) = 1 × 512 × 12 × 2 = 12288; each head twice
    ("config_qwen3_next_style.json", "Qwen/Qwen3-Next-80B-A3B-Instruct", 4, "bfloat16", 12288, 2),
]


@pytest.mark.parametrize("config, model, tp, kv_dtype, want, replication", KV_CASES,
                         ids=[f"{c[0][7:-5]}-tp{c[2]}-{c[3]}" for c in KV_CASES])
def test_theoretical_kv_bytes_per_token(tmp_path, config, model, tp, kv_dtype, want, replication):
    rep = build(analyse(sglang_log(tmp_path, model, tp, kv_dtype), config_json=inp(config)))
    assert rep["config"]["tp_size"] == tp
    assert rep["kv_pool"]["theoretical_bytes_per_token"] == want
    assert rep["kv_pool"]["replication"] == replication
    assert rep["kv_pool"]["dtype"] == kv_dtype
    derivation = rep["kv_pool"]["derivation"]["theoretical_bytes_per_token"]
    if replication > 1:
        assert f"stored {replication} times" in derivation
    if "deepseek" in config:
        assert "MLA" in derivation and "(512 + 64)" in derivation
    if "qwen3_next" in config:
        assert "every 4th of 48 layers" in derivation


def test_theoretical_kv_from_a_vllm_log_matches_the_log():
    # V0 0.7.3 Llama-3.1-8B TP1, kv_cache_dtype auto → the engine's dtype torch.bfloat16: 131072 B.
    # The log: 54.78 GiB / 448,768 tokens = 131069 B, within the printed rounding.
    rep = build(analyse(fixture("vllm_v073_v0_tp1.log"), config_json=inp("config_llama31_8b.json")))
    assert rep["kv_pool"]["theoretical_bytes_per_token"] == 131072
    assert rep["kv_pool"]["log_bytes_per_token"] == round(54.78 * GIB / 448768) == 131069
    assert rep["kv_pool"]["comparison"]["explanation"].startswith("matches")


def test_weights_check_llama31_8b(tmp_path):
    rep = build(analyse(sglang_log(tmp_path, "meta-llama/Llama-3.1-8B-Instruct", 1, "bfloat16"),
                        config_json=inp("config_llama31_8b.json")))
    check = rep["weights_check"]
    # 32 × (4096·4096·2 + 4096·1024·2 + 3·4096·14336) + 2 × 128256·4096 = 8,029,995,008 parameters;
    # × 2 B = 16,059,990,016 B / 2^30 = 14.957 → 14.96 GiB
    params = 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336) + 2 * 128256 * 4096
    assert round(params * 2 / GIB, 2) == 14.96
    assert check["theoretical_gib"] == 14.96
    assert check["ratio"] == 1.0  # measured 14.96 in the log
    assert "agrees" in check["derivation"]


def test_weights_check_counts_the_hybrid(tmp_path):
    # Qwen3-Next-80B-A3B: 36 Gated DeltaNet layers and 12 full-attention ones, 512 experts each;
    # published as 80 B parameters in all, counted here as 79.57 B
    rep = build(analyse(sglang_log(tmp_path, "Qwen/Qwen3-Next-80B-A3B-Instruct", 1, "bfloat16"),
                        config_json=inp("config_qwen3_next_style.json")))
    check = rep["weights_check"]
    assert check["theoretical_gib"] == 148.22  # 79.57 B × 2 B / 2^30
    assert "79.57 B parameters" in check["derivation"] and "36 gdn state layers" in check["derivation"]


def test_read_model_config_fields():
    cfg = read_model_config(inp("config_deepseek_v3.json"))
    assert isinstance(cfg, F.ModelConfig)
    assert (cfg.fields["kv_lora_rank"], cfg.fields["qk_rope_head_dim"], cfg.fields["num_hidden_layers"]) == (512, 64, 61)
    assert cfg.evidence.source == "config.json"


def test_nested_text_config_is_lifted(tmp_path):
    outer = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
             "text_config": json.loads(Path(inp("config_llama31_8b.json")).read_text())}
    path = write_log(tmp_path, json.dumps(outer), "config.json")
    assert read_model_config(path).fields["num_key_value_heads"] == 8


@pytest.mark.parametrize("name", ["config_not_a_model.json", "config_truncated.json"])
def test_bad_config_json_is_an_input_error(monkeypatch, capsys, name):
    with pytest.raises(InputError):
        read_model_config(inp(name))
    code, out, err = run_entry(monkeypatch, capsys, "explain", VLLM_TP2, "--config-json", inp(name))
    assert code == 2 and err.startswith("capdiag: error:")


def test_documented_query_alone_gives_total_framework_and_other(tmp_path):
    """`index,memory.used,memory.free` has no total column: the total is used + free per GPU
    (the driver's reserved memory is in neither, and the report says so)."""
    log = tmp_path / "sglang.log"
    log.write_text("\n".join([
        "[2025-05-06 09:00:01 TP0] Load weight begin. avail mem=78.42 GB",
        "[2025-05-06 09:00:09 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.41 GB, mem usage=15.01 GB.",
        "[2025-05-06 09:00:09 TP0] KV Cache is allocated. #tokens: 420000, K size: 25.63 GB, V size: 25.63 GB",
        "[2025-05-06 09:00:09 TP0] Memory pool end. avail mem=12.01 GB",
        "[2025-05-06 09:00:15 TP0] Capture cuda graph end. Time elapsed: 5.11 s. mem usage=0.61 GB. avail mem=11.40 GB.",
    ]) + "\n")
    smi = tmp_path / "smi.csv"
    smi.write_text("0, 69322 MiB, 11775 MiB\n")
    rep = build(analyse(str(log), nvidia_smi=str(smi)))
    assert rep["gpu"]["total_gib"] == round((69322 + 11775) / 1024, 2) == 79.2
    assert rep["gpu"]["total_source"] == "nvidia-smi"
    assert "memory.used 69322 + memory.free 11775 = 81097 MiB" in rep["gpu"]["total_derivation"]
    assert "reserved" in rep["gpu"]["total_derivation"]
    rows = {r["category"]: r for r in rep["breakdown"]}
    assert rows["framework"]["gib"] == round(79.2 - 78.42, 2)
    # other: used 69322 MiB − framework − weights − KV − graphs
    held = round(79.2 - 78.42, 2) + 15.01 + 25.63 * 2 + 0.61
    assert rows["other"]["gib"] == round(69322 / 1024 - held, 2) and rows["other"]["status"] == "derived"
    # nothing asks for the nvidia-smi output that was given
    assert "--nvidia-smi-file" not in json.dumps(rep, default=plain) and "or nvidia-smi output" not in json.dumps(rep, default=plain)


# ---- GPU spellings people type ---------------------------------------------------------------------

@pytest.mark.parametrize("spelling, alias", [
    ("h100-sxm5", "h100_sxm"), ("H100_SXM5", "h100_sxm"), ("b200-180gb", "b200"), ("h20-sxm", "h20"),
    ("rtx3090", "rtx3090"), ("3090", "rtx3090"), ("RTX 3090", "rtx3090"), ("nvidia geforce rtx 3090", "rtx3090"),
    ("5070-ti", "rtx5070ti"), ("a6000", "rtx_a6000"), ("A40", "a40"), ("4090D", "rtx4090d"), ("rtx4080", "rtx4080"),
    ("rtx5080", "rtx5080"), ("mi300a", "mi300a"), ("910B", "ascend910b"), ("gb10", "gb10_dgx_spark"),
    ("910C", "ascend910c"), ("Ascend-910C", "ascend910c"), ("MTT S4000", "mtt_s4000"), ("s4000", "mtt_s4000"),
    ("MTT_S5000", "mtt_s5000"), ("s5000", "mtt_s5000"),
    ("h100-nvl", "h100_nvl"), ("GH200", "gh200"), ("MI325X", "mi325x"), ("mi355x", "mi355x"), ("l40s", "l40s"),
])
def test_gpu_spellings(spelling, alias):
    rep = build(analyse(LOG_SINGLE, gpu=spelling))
    assert rep["gpu"]["alias"] == alias and not rep["gpu"]["ambiguous"]


@pytest.mark.parametrize("spelling", ["h100", "H100-80GB", "nvidia-h100"])
def test_an_ambiguous_spelling_says_what_it_could_be_and_keeps_the_total(spelling):
    rep = build(analyse(LOG_SINGLE, gpu=spelling))
    assert rep["gpu"]["ambiguous"] and rep["gpu"]["total_gib"] == round(81559 / 1024, 2)
    assert "could be h100_pcie or h100_sxm" in rep["gpu"]["identity"]
    assert "they all report 81559 MiB" in rep["gpu"]["identity"]
    # the total is not in doubt, so no capacity warning
    assert "gpu-capacity-ambiguous" not in {f["rule"] for f in rep["findings"]}


def test_an_ambiguous_spelling_whose_totals_differ_asks():
    with pytest.raises(InputError, match=r"a100_40gb_sxm \(40960 MiB\).*a100_80gb_pcie \(81920 MiB\).*name one"):
        analyse(LOG_SINGLE, gpu="a100")


def test_new_reference_entries_carry_their_sources():
    from capdiag.gpus import gpu_specs
    entries = {e["alias"]: e for e in gpu_specs()}
    for alias, mib in (("rtx3090", 24576), ("rtx4080", 16376), ("rtx4090d", 24564), ("rtx5080", 16303),
                       ("rtx5070ti", 16303), ("rtx_a6000", 49140), ("a40", 46068)):
        assert entries[alias]["observed_total_mib"][0] == mib and entries[alias]["observed_source"]
        assert entries[alias]["source_url"].startswith("https://")
    assert entries["mi300a"]["shared_system_memory"] and entries["ascend910b"]["vendor_nominal_gb"] == 64


@pytest.mark.parametrize("alias, gib", [("mi325x", 256.0), ("mi355x", 288.0)])
def test_a_nominal_size_the_vendor_states_in_gib_is_not_converted_from_gb(alias, gib):
    """ROCm's table gives MI325X 256 GiB and MI355X 288 GiB: taken as they are (marked nominal),
    not as decimal GB (which would give 238.42 and 268.22)."""
    rep = build(analyse(LOG_SINGLE, gpu=alias))
    assert rep["gpu"]["total_gib"] == gib and rep["gpu"]["total_source"] == "nominal"
    assert f"{int(gib)} GiB as the vendor states it" in rep["gpu"]["total_derivation"]


def test_chinese_accelerators_carry_their_sources_and_stay_nominal():
    from capdiag.gpus import gpu_specs
    entries = {e["alias"]: e for e in gpu_specs()}
    assert entries["ascend910c"]["vendor_nominal_gb"] == 128 and entries["mtt_s4000"]["vendor_nominal_gb"] == 48
    for alias in ("ascend910c", "mtt_s4000"):
        assert entries[alias]["source_url"].startswith("https://")
    assert entries["mtt_s4000"]["observed_total_mib"] == []
    rep = build(analyse(VLLM_TP2, gpu="mtt-s4000"))  # a log whose free readings fit in 48 GB
    assert rep["gpu"]["total_gib"] == round(48e9 / (1 << 30), 2) and rep["gpu"]["total_source"] == "nominal"


def test_a_nominal_total_below_the_free_memory_the_log_reports_is_not_used(tmp_path):
    """K100_AI's 64 GB as decimal GB is 59.6 GiB; a log that has 78.5 GiB free before the weights
    contradicts it (Hygon's GB are binary, or the GPU is another): the total stays unknown, so no
    negative framework row is drawn from it."""
    rep = build(analyse(sglang_log(tmp_path, "Qwen/Qwen3-8B", 1, "auto"), gpu="k100_ai"))
    assert rep["gpu"]["total_gib"] is None
    assert "less than the 78.5 GiB the log reports free (line 2)" in rep["gpu"]["total_derivation"]
    framework = row(rep, "framework")
    assert framework["gib"] is None and "nominal 64 GB (59.6 GiB)" in framework["derivation"]


@pytest.mark.parametrize("alias", ["910b", "910c"])
def test_an_ascend_device_is_one_die_of_64_gib_as_npu_smi_reports_it(alias):
    """npu-smi prints 65536 MB of HBM per 910B, and per die of a 910C (A3 hosts list each package
    as two chips): a rank's total is 64 GiB, not the 910C package's 128 GB."""
    rep = build(analyse(LOG_SINGLE, gpu=alias))
    assert (rep["gpu"]["total_gib"], rep["gpu"]["total_source"]) == (64.0, "reference")
    assert rep["gpu"]["alias"] == "ascend" + alias and "gpu-capacity-ambiguous" not in {f["rule"] for f in rep["findings"]}


@pytest.mark.parametrize("spelling, alias", [
    ("K100_AI", "hygon_k100_ai"), ("k100-ai", "hygon_k100_ai"), ("K100", "hygon_k100"), ("bw1000", "hygon_bw1000"),
    ("BW200", "hygon_bw1000"), ("BW1000 64G", "hygon_bw1000"), ("bw1100", "hygon_bw1100"), ("Z100L", "hygon_z100l"),
])
def test_hygon_dcu_spellings(spelling, alias):
    rep = build(analyse(LOG_SINGLE, gpu=spelling))
    assert rep["gpu"]["alias"] == alias and not rep["gpu"]["ambiguous"]


def test_hygon_dcus_use_the_measured_total_where_one_was_seen_and_say_nominal_otherwise():
    """BW1000 and Z100L have a device-reported total (hy-smi 65520 MiB, rocminfo 32752 MiB);
    K100_AI and BW1100 only the vendor's GB, converted and marked nominal."""
    bw = build(analyse(LOG_SINGLE, gpu="bw1000"))["gpu"]
    assert (bw["total_gib"], bw["total_source"]) == (round(65520 / 1024, 2), "reference")
    z = build(analyse(LOG_SINGLE, gpu="z100l"))["gpu"]
    assert (z["total_gib"], z["total_source"]) == (round(32752 / 1024, 2), "reference")
    for alias, gb in (("hygon_k100_ai", 64), ("hygon_bw1100", 144)):
        rep = build(analyse(VLLM_TP2, gpu=alias))  # LOG_SINGLE's 78.5 GiB free would contradict 64 GB
        assert rep["gpu"]["total_source"] == "nominal" and rep["gpu"]["total_gib"] == round(gb * 1e9 / (1 << 30), 2)
        assert "gpu-capacity-ambiguous" in {f["rule"] for f in rep["findings"]}
    from capdiag.gpus import gpu_specs
    for e in (e for e in gpu_specs() if e["alias"].startswith("hygon_")):
        assert e["source_url"] and (e["observed_source"] or not e["observed_total_mib"])


def test_the_hip_device_name_of_a_bw1000_matches_its_entry():
    from capdiag.gpus import match_name
    assert [e["alias"] for e in match_name("BW200, UBB BW1000")] == ["hygon_bw1000"]
    assert [e["alias"] for e in match_name("K100_AI 64GB")] == ["hygon_k100_ai"]


# ---- nvidia-smi: MIG instances and the processes holding GPU memory --------------------------------

VLLM_MIG = fixture("vllm_v0111_mig.log")


def test_a_mig_instance_is_the_gpu_the_server_sees():
    """The parent A100 reports 40960 MiB; the one MIG instance (GI 5) 9856 MiB: that is the total,
    and the instance's used memory is the rank's."""
    rep = build(analyse(VLLM_MIG, nvidia_smi=inp("smi_table_mig_a100.txt")))
    assert rep["gpu"]["total_gib"] == round(9856 / 1024, 2) and "MIG instance memory 9856 MiB" in rep["gpu"]["total_derivation"]
    assert "40960 MiB is not what a process on an instance sees" in rep["gpu"]["total_derivation"]
    target = next(r for r in rep["ranks"] if r["target"])
    assert target["nvidia_smi"]["used_mib"] == 9850 and target["nvidia_smi"]["total_mib"] == 9856
    assert rep["nvidia_smi"]["mig_instances"] == 1


def test_mig_instances_of_different_sizes_leave_the_total_and_other_unknown(tmp_path):
    table = open(inp("smi_table_mig_a100.txt")).read().replace(
        "+------------------+--------------------------------+-----------+-----------------------+\n\n",
        "+------------------+--------------------------------+-----------+-----------------------+\n"
        "|  0    1   0   1  |              12MiB / 19968MiB  | 42      0 |  3   0    2    0    0 |\n"
        "|                  |               0MiB / 32767MiB  |           |                       |\n"
        "+------------------+--------------------------------+-----------+-----------------------+\n\n", 1)
    smi = tmp_path / "smi.txt"
    smi.write_text(table)
    rep = build(analyse(VLLM_MIG, nvidia_smi=str(smi)))
    assert rep["gpu"]["total_gib"] is None and "9856, 19968 MiB" in rep["gpu"]["total_derivation"]
    other = next(r for r in rep["breakdown"] if r["category"] == "other")
    assert other["gib"] is None and "which instance each rank ran on is not in the inputs" in other["derivation"]


def test_processes_from_the_table_and_the_compute_apps_query_name_the_server_and_other_tenants():
    rep = build(analyse(VLLM_MIG, nvidia_smi=inp("smi_query_then_compute_apps.csv")))
    procs = {p["pid"]: p for p in rep["nvidia_smi"]["processes"]}
    assert procs[207574]["server"] is True and procs[207574]["used_mib"] == 9836  # EngineCore_0 pid=207574
    assert procs[3321] == {"pid": 3321, "name": "/opt/tenant/bin/encoder", "used_mib": 2048, "gpu": None,
                           "server": False}
    assert "other tenants: pid 3321 /opt/tenant/bin/encoder 2048 MiB" in rep["nvidia_smi"]["processes_derivation"]
    # the documented query in the same file still gives the total (used + free)
    assert rep["gpu"]["total_gib"] == round(81000 / 1024, 2)
    table = build(analyse(VLLM_TP2, nvidia_smi=inp("smi_table_driver570_h100.txt")))
    assert [(p["pid"], p["gpu"], p["used_mib"]) for p in table["nvidia_smi"]["processes"]] == [
        (1843211, 0, 74302), (1843212, 1, 74286)]


def test_the_compute_apps_query_alone_is_accepted_without_a_header(tmp_path):
    smi = tmp_path / "apps.csv"
    smi.write_text("207574, python3, 9836 MiB\n")
    rep = build(analyse(VLLM_MIG, nvidia_smi=str(smi)))
    assert rep["nvidia_smi"]["processes"][0]["server"] is True and rep["gpu"]["total_gib"] is None


def test_an_sglang_log_names_no_pids_so_the_server_is_not_known():
    rep = build(analyse(LOG_SINGLE, nvidia_smi=inp("smi_table_driver570_h100.txt")))
    assert {p["server"] for p in rep["nvidia_smi"]["processes"]} == {None}
    assert "which of them is this server is not known" in rep["nvidia_smi"]["processes_derivation"]
