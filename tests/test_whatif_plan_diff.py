"""What-if projections, the planning worksheet and diffs of two start-ups."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capdiag import facts as F
from capdiag.analysis import analyse
from capdiag.errors import InputError
from capdiag.report import build, build_diff
from capdiag.rules import PLAN
from capdiag.rules.plan.driver import parse_params, parse_workload, plan
from capdiag.whatif import parse_what_if
from helpers import SGLANG_CORPUS, SHARED, fixture, needs_shared, run_entry

CONFIGS = Path(__file__).resolve().parent / "plan_configs"
EXAMPLE = str(Path(__file__).resolve().parents[1] / "capdiag" / "examples" / "sglang-llama31-8b-h100.log")
VLLM_CORPUS = SHARED / "corpus" / "vllm"


def corpus(name: str, folder=SGLANG_CORPUS) -> str:
    return str(next(folder.glob(f"{name}-*.log")))


def what_if(path: str, *changes: str, **options) -> dict:
    return build(analyse(path, what_if=parse_what_if(changes), **options))["what_if"]


# ---- what-if: SGLang ------------------------------------------------------------------------

@needs_shared
def test_012_projected_to_088_lands_on_030_within_one_page():
    """012 and 030 are one DeepSeek-V4-Flash deployment at fraction 0.60 and 0.88. SGLang's
    formula on 012's printed figures: rest = 57.01 − 93.58 × (1 − 0.88) = 45.7804 GiB (030 prints
    available_bytes=45.78); tokens = ⌊45.7804 × 2^30 / 15955.85⌋ = 3,080,771, down to the 256-token
    page: 3,080,704. 030 prints 3,080,960: one page (256 tokens, 0.008 %) apart — the printed
    figures are rounded to two decimals."""
    projected = what_if(corpus("012"), "mem_fraction_static=0.88")
    actual = build(analyse(corpus("030")))["observed"]["max_total_num_tokens"]
    assert projected["kv_cache_gib"] == 45.78
    assert projected["max_total_num_tokens"] == 3080704 and actual == 3080960
    assert abs(projected["max_total_num_tokens"] - actual) <= 256  # within page rounding
    assert projected["free_after_capture_gib"] == 8.08  # 030 prints 8.16 after capture
    assert projected["not_projected"] == []
    assert projected["derivation"][0] == "rest = free after weights 57.01 − free before weights 93.58 × (1 − 0.88) = 45.7804 GiB"


def test_sglang_mem_fraction_and_page_and_requests_on_the_example():
    # example: free before weights 78.43, after 63.44; bytes/token 131087 (50.74 GiB / 415615 tokens)
    p = what_if(EXAMPLE, "mem_fraction_static=0.80", "page_size=64", "max_running_requests=64")
    rest = 63.44 - 78.43 * (1 - 0.80)  # 47.754 GiB
    tokens = int(rest * (1 << 30) // 131087) // 64 * 64
    assert p["max_total_num_tokens"] == tokens
    assert p["concurrency"][0] == {"request_tokens": 4096, "token_limit": tokens // 4096, "request_limit": 64,
                                   "max_concurrent": 64}
    assert p["free_after_capture_gib"] == round(11.94 - (p["kv_cache_gib"] - 50.74), 2)


def test_sglang_kv_dtype_halves_bytes_per_token():
    p = what_if(EXAMPLE, "kv_cache_dtype=fp8_e4m3", config_json=str(CONFIGS / "llama-3.1-8b.json"))
    rest = 63.44 - 78.43 * (1 - 0.838)
    assert p["max_total_num_tokens"] == int(rest * (1 << 30) // (131087 / 2))
    assert any("× 1/2" in line for line in p["derivation"])


def test_sglang_tp_change_needs_config_json():
    assert what_if(EXAMPLE, "tp_size=2")["not_projected"] == [
        {"change": "tp_size", "reason": "needs --config-json, the current tp_size and measured weights"}]
    p = what_if(EXAMPLE, "tp_size=2", config_json=str(CONFIGS / "llama-3.1-8b.json"))
    assert p["not_projected"] == [] and p["max_total_num_tokens"] > 415615
    assert any("tp_size 1 → 2" in line for line in p["derivation"])


def test_foreign_key_and_unknown_fraction_are_not_projected():
    p = what_if(fixture("mfs_unstated_elided.log"), "mem_fraction_static=0.9", "gpu_memory_utilization=0.9")
    changes = {n["change"]: n["reason"] for n in p["not_projected"]}
    assert changes["gpu_memory_utilization"] == "a vllm setting; this log is sglang's"
    assert "mem_fraction_static" in changes["mem_fraction_static"]  # the fraction is not stated: nothing assumed


# ---- what-if: the counterfactual run (the same rules, re-run on the projected start-up) --------

def counterfactual(path: str, *changes: str, **options):
    """(the analysis, its what_if report section, the counterfactual knowledge base)."""
    a = analyse(path, what_if=parse_what_if(changes), **options)
    return a, build(a)["what_if"], a.knowledge.get("what_if").detail["then"]


def test_fp8_kv_makes_fp8_kv_opportunity_go_away_on_the_example():
    a, p, then = counterfactual(EXAMPLE, "kv_cache_dtype=fp8_e4m3")
    base = a.knowledge.get("finding", "fp8-kv-opportunity")
    assert base is not None and base.detail == {} and "torch.bfloat16" in base.message  # it fires today
    assert p["findings_disappear"] == ["fp8-kv-opportunity"] and p["findings_appear"] == []
    assert then.get("kv_pool", "dtype").value == "fp8_e4m3"
    assert then.get("kv_pool", "tokens").value == 831136 == p["max_total_num_tokens"]
    assert then.get("kv_pool", "bytes_per_token").value == 65544  # 131087 / 2, rounded
    # the rule was judged and stayed quiet: neither a finding nor "could not judge"
    assert then.get("finding", "fp8-kv-opportunity") is None and then.get("not_judged", "fp8-kv-opportunity") is None
    # the projected free memory is the rule's own; 11.95 GiB is within the 15% of the 78.43 GiB
    # free before the weights that excess-headroom keeps (the GPU total is not stated), as before
    assert then.get("breakdown", "free").value == 11.95
    assert then.get("finding", "excess-headroom") is None and a.knowledge.get("finding", "excess-headroom") is None
    assert any(d is base for d in a.knowledge.get("what_if").premises)  # the finding that goes away is cited


def test_a_fraction_near_one_raises_thin_headroom():
    rest = 63.44 - 78.43 * (1 - 0.99)  # 62.6557 GiB
    tokens = int(rest * (1 << 30) // 131087)
    _, p, then = counterfactual(EXAMPLE, "mem_fraction_static=0.99")
    assert p["max_total_num_tokens"] == tokens == 513216
    assert p["free_after_capture_gib"] == round(11.94 - (round(tokens * 131087 / (1 << 30), 2) - 50.74), 2) == 0.02
    assert p["findings_appear"] == ["thin-headroom"] and p["findings_disappear"] == []
    assert then.get("finding", "thin-headroom").detail == {"free_gib": 0.02}
    assert then.get("config", "mem_fraction_static").value == 0.99


def test_a_lower_request_limit_raises_request_limit_binds():
    _, p, then = counterfactual(EXAMPLE, "max_running_requests=8")
    assert p["findings_appear"] == ["request-limit-binds"] and p["findings_disappear"] == []
    assert [row["max_concurrent"] for row in p["concurrency"]] == [8, 8, 8]
    assert then.get("kv_pool", "tokens").value == 415615  # the pool is not re-sized for a request limit
    assert "4096 tokens: 101 fit, 8 allowed" in then.get("finding", "request-limit-binds").message


def test_a_longer_context_raises_context_exceeds_kv():
    _, p, then = counterfactual(EXAMPLE, "context_len=300000")
    assert p["findings_appear"] == ["context-exceeds-kv"]
    f = then.get("finding", "context-exceeds-kv")
    assert f.severity == "info" and f.detail == {"fit": 1} and "415615 tokens" in f.message


def test_vllm_counterfactual_runs_both_ways():
    # v0.11 OOM in capture at 0.97 of 22.03 GiB: at 0.5 the budget (11.02 GiB) is below the weights
    _, p, then = counterfactual(fixture("vllm_v011_oom_capture.log"), "gpu_memory_utilization=0.5")
    assert p["findings_appear"] == ["low-concurrency", "weights-exceed-budget"]
    assert p["findings_disappear"] == ["thin-headroom"]
    assert then.get("breakdown", "budget").value == 11.02 and then.get("kv_pool", "tokens").value == 0
    _, p, _ = counterfactual(fixture("vllm_v064_max_seq_len.log"), "gpu_memory_utilization=0.97")
    assert p["findings_appear"] == ["thin-headroom"] and p["free_after_capture_gib"] == 0.71
    _, p, then = counterfactual(fixture("vllm_v073_v0_tp1.log"), "kv_cache_dtype=fp8")
    # its pool already holds many full-length requests: no fp8 tip to clear, the tokens double all the same
    assert p["findings_disappear"] == [] and p["kv_cache_tokens"] == 897536
    assert then.get("kv_pool", "dtype").value == "fp8"


def test_nothing_projected_runs_no_counterfactual():
    a = analyse(fixture("mfs_unstated_elided.log"), what_if=parse_what_if(("mem_fraction_static=0.9",)))
    p = build(a)["what_if"]
    assert "findings_appear" not in p and "then" not in a.knowledge.get("what_if").detail


@pytest.mark.parametrize("item, message", [("nope=1", "use KEY=VALUE"), ("mem_fraction_static=2", "between 0 and 1"),
                                           ("tp_size=two", "takes int"), ("page_size=0", "positive")])
def test_bad_what_if_is_an_input_error(item, message):
    with pytest.raises(InputError, match=message):
        parse_what_if((item,))


# ---- what-if: vLLM --------------------------------------------------------------------------

@needs_shared
def test_vllm_utilization_and_dtype():
    # 004: L4, total 22.49 GiB (reference), util 0.92, available KV 4.75 GiB, 38944 tokens
    p = what_if(corpus("004", VLLM_CORPUS), "gpu_memory_utilization=0.95", "kv_cache_dtype=fp8", "max_num_seqs=8",
                gpu="l4")
    kv = 4.75 + 22.49 * (0.95 - 0.92)
    cell = round(4.75 * (1 << 30) / 38944) / 2
    assert p["kv_cache_gib"] == round(kv, 2) and p["kv_cache_tokens"] == int(kv * (1 << 30) // cell)
    assert p["free_after_capture_gib"] == round(22.49 * 0.05, 2)
    assert all(row["request_limit"] == 8 for row in p["concurrency"])
    assert "context-exceeds-kv" in p["findings_disappear"]


@needs_shared
def test_vllm_without_a_total_is_not_projected():
    p = what_if(corpus("004", VLLM_CORPUS), "gpu_memory_utilization=0.95")
    assert p["not_projected"] == [{"change": "gpu_memory_utilization", "reason": "needs the GPU total"}]


# ---- plan: the framework's own arithmetic, forwards -------------------------------------------

def request(**kw) -> F.PlanRequest:
    return F.PlanRequest(evidence=F.Evidence(0, "test", 0, "input"), **kw)


@pytest.mark.parametrize("params, gib", [("7B", 13.04), ("70B", 130.39), ("405B", 754.37)])
def test_weights_figures(params, gib):
    report = plan(PLAN, request(params=parse_params(params), weight_dtype="bf16"), gpu="h100_sxm")
    assert report["totals"]["weights_gib"] == gib  # params × 2 B / 2^30: ≈13.0, 130.4, 754.4 GiB


def test_params_without_a_dtype_are_not_sized():
    report = plan(PLAN, request(params=7e9), gpu="h100_sxm")
    assert report["per_gpu"]["weights_gib"]["value"] is None and report["verdict"] == "unknown"
    assert "--weight-dtype" in report["per_gpu"]["weights_gib"]["derivation"]


def test_llama_70b_kv_per_token_and_the_pool_at_tp_8():
    report = plan(PLAN, request(workloads=(parse_workload("8192x16"),), tp=8, gpus=8),
                  config_json=str(CONFIGS / "llama-3.1-70b.json"), gpu="h100_sxm")
    g = report["per_gpu"]
    assert g["kv_bytes_per_token"]["value"] == 40960  # 80 layers × 1 head a rank × (128 + 128) × 2 B
    assert g["weights_gib"]["value"] == 16.54  # 8.82 B parameters a rank × 2 B + SGLang's measured 0.11 GiB
    # (79.19 − 0.51 − 1.25) × SGLang's own fraction 0.818 (14848 MiB reserved of 81559) − 16.54
    assert g["budget_gib"]["value"] == 46.8 and report["settings"]["fraction"] == 0.818
    assert g["kv_tokens"]["value"] == 1_226_833 and report["verdict"] == "fits"
    assert g["max_concurrent"]["value"] == 9  # 1,226,833 // 131,072 (the model's context)


def test_70b_full_fine_tuning():
    report = plan(PLAN, request(params=70e9, weight_dtype="bf16", training="full", gpus=16, tp=16), gpu="h100_sxm")
    assert report["totals"]["training_gib"] == 1173.47  # 70e9 × 18 B / 2^30 ≈ 1,173 GiB
    assert report["training"]["state_gib"] == round(70e9 * 16 / (1 << 30) / 16, 2)  # 16 B beyond the weights
    assert report["verdict"] == "does_not_fit"  # 8.15 + 65.19 GiB against 79.19 × 0.85


def test_vllm_refuses_a_context_one_request_cannot_fill_and_the_remedies_are_planned():
    report = plan(PLAN, request(tp=2, gpus=8, framework="vllm"), config_json=str(CONFIGS / "llama-3.1-70b.json"),
                  gpu="h100_sxm")
    assert report["verdict"] == "does_not_fit" and "max_model_len 131,072" in report["reason"]
    by_kind = {next(iter(r["changes"])): r for r in report["remedies"]}
    assert by_kind["tp_size"]["changes"] == {"tp_size": 4} and by_kind["tp_size"]["projected"]["fits"]
    assert by_kind["max_model_len"]["projected"]["max_concurrent"] >= 1
    assert all(r["introduces"] == [] and r["clears"] == ["plan.verdict"] for r in report["remedies"])


def test_plan_cli_json_and_from_log(monkeypatch, capsys):
    code, out, _ = run_entry(monkeypatch, capsys, "plan", "--config-json", str(CONFIGS / "llama-3.1-8b.json"), "--gpu",
                             "h100_sxm", "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["verdict"] == "fits" and doc["schema"] == "capdiag.plan/2"
    assert doc["per_gpu"]["kv_tokens"]["value"] == 414_105  # (79.19 − 0.6) × 0.835 − 15.07 GiB / 131,072 B
    code, out, _ = run_entry(monkeypatch, capsys, "plan", "--from-log", EXAMPLE, "--config-json",
                             str(CONFIGS / "llama-3.1-8b.json"), "--gpu", "h100_sxm", "--format", "json")
    doc = json.loads(out)
    rows = {r["quantity"]: r for r in doc["from_log"]["comparison"]}
    assert rows["weights per GPU"]["predicted"] == 15.07 and rows["weights per GPU"]["measured"] == 14.99
    assert rows["weights per GPU"]["error_percent"] == 0.5
    # the log's own fraction (0.838) and context, the plan's own cell: 415,615 tokens in the log
    assert doc["settings"]["fraction"] == 0.838 and rows["KV tokens per GPU"]["measured"] == 415_615
    assert abs(rows["KV tokens per GPU"]["error_percent"]) < 1.0
    assert rows["KV bytes per token per GPU"]["predicted"] == 131072


def test_plan_needs_params_or_config(monkeypatch, capsys):
    code, _, err = run_entry(monkeypatch, capsys, "plan", "--gpu", "h100_sxm")
    assert code == 2 and err.startswith("capdiag: error: give --params, --config-json or --model")


# ---- diff -----------------------------------------------------------------------------------

@needs_shared
def test_diff_012_030():
    d = build_diff(analyse(corpus("012"), gpu="h20"), analyse(corpus("030"), gpu="h20"))
    config = {c["key"]: (c["before"], c["after"]) for c in d["config"]}
    assert config["mem_fraction_static"] == (0.6, 0.88) and config["kv_cache_dtype"] == ("fp8_e4m3", "bf16")
    memory = {m["key"]: m for m in d["memory"]}
    assert memory["kv_cache"]["before"] == 19.58 and memory["kv_cache"]["after"] == 45.78
    assert memory["kv_cache"]["delta"] == 26.2 and memory["kv_cache"]["explained_by"] == "mem_fraction_static"
    assert {k["key"]: (k["before"], k["after"]) for k in d["kv_pool"]}["tokens"] == (1317632, 3080960)
    assert any(e["where"].startswith("after log line") for e in memory["kv_cache"]["evidence"])


@needs_shared
def test_diff_two_vllm_logs_cli(monkeypatch, capsys):
    code, out, _ = run_entry(monkeypatch, capsys, "diff", corpus("004", VLLM_CORPUS), corpus("009", VLLM_CORPUS),
                             "--format", "json")
    d = json.loads(out)
    assert code == 0 and d["before"]["framework"] == d["after"]["framework"] == "vllm"
    config = {c["key"]: (c["before"], c["after"]) for c in d["config"]}
    assert config["framework_version"] == ("0.11.0", "0.11.2") and config["max_model_len"] == (32000, 1024)
    kv = next(m for m in d["memory"] if m["key"] == "kv_cache")
    # utilization is stated only before: a difference, not an explanation; the version is stated in both
    assert config["gpu_memory_utilization"] == (0.92, None)
    assert kv["explained_by"] == "framework_version" and "framework_version: 0.11.0 → 0.11.2" in kv["derivation"]
    code, out, _ = run_entry(monkeypatch, capsys, "diff", corpus("004", VLLM_CORPUS), corpus("009", VLLM_CORPUS),
                             "--format", "markdown")
    assert code == 0 and out.startswith("# capdiag diff") and "| kv_cache | 4.75 | 105.97 |" in out


WHAT_IF_KEYS = [(EXAMPLE, change) for change in ("mem_fraction_static=0.8", "kv_cache_dtype=fp8_e4m3", "page_size=16",
                                                 "tp_size=2", "max_running_requests=8", "context_len=4096")] + [
    (fixture("vllm_v011_max_num_seqs.log"), change) for change in ("gpu_memory_utilization=0.8", "kv_cache_dtype=fp8",
                                                                   "tp_size=2", "max_num_seqs=8", "max_model_len=4096")]


@pytest.mark.parametrize("fmt", ["text", "markdown", "html", "json"])
@pytest.mark.parametrize("log, change", WHAT_IF_KEYS, ids=[c for _, c in WHAT_IF_KEYS])
def test_every_what_if_key_renders_in_every_format(log, change, fmt, monkeypatch, capsys):
    # a change that cannot be projected (tp_size without config.json) has no counterfactual run:
    # its report says why instead of listing rows it does not have
    code, out, err = run_entry(monkeypatch, capsys, "explain", log, "--what-if", change, "--format", fmt)
    assert code == 0 and not err, err
    key = change.split("=")[0]
    if fmt == "json":
        what_if = json.loads(out)["what_if"]
        assert [(k, str(v)) for k, v in what_if["changes"].items()] == [tuple(change.split("="))]
        assert ("concurrency" in what_if) != any(n["change"] == key for n in what_if["not_projected"])
    else:
        assert key in out


# ---- a diff cites the lines of what changed, and tells one rule's findings apart (issue 32) ----

def _two_start_ups(tmp_path) -> tuple[str, str]:
    """mla_tp2 with both ranks alike, then with TP1 short of 2 GiB before and 2.25 GiB after the
    weights, a lower memory fraction and 1 GiB more free at the end."""
    src = Path(fixture("mla_tp2.log")).read_text()
    before = src.replace("TP1] Load weight begin. avail mem=77.50", "TP1] Load weight begin. avail mem=78.00") \
        .replace("avail mem=61.25 GB, mem usage=16.25", "avail mem=62.00 GB, mem usage=16.00")
    after = src.replace("TP1] Load weight begin. avail mem=77.50", "TP1] Load weight begin. avail mem=76.00") \
        .replace("avail mem=61.25 GB, mem usage=16.25", "avail mem=59.75 GB, mem usage=16.25") \
        .replace("mem_fraction_static=0.8", "mem_fraction_static=0.78") \
        .replace("available_gpu_mem=14.00 GB", "available_gpu_mem=15.00 GB")
    paths = tmp_path / "before.log", tmp_path / "after.log"
    for path, text in zip(paths, (before, after)):
        path.write_text(text)
    return str(paths[0]), str(paths[1])


def test_a_diff_cites_the_lines_of_the_values_and_of_the_change_that_explains_them(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the header holds each log's path whole: keep it short, as a user's is
    before, after = (Path(p).name for p in _two_start_ups(tmp_path))
    d = build_diff(analyse(before), analyse(after))
    free = next(m for m in d["memory"] if m["key"] == "free")
    assert (free["before"], free["after"], free["explained_by"]) == (14.0, 15.0, "mem_fraction_static")
    # first each side's reading of the free memory (the max_total_num_tokens line, 14), then the
    # server_args line (1) that states the fraction that changed; nothing the rule merely looked at
    assert [e["where"] for e in free["evidence"]] == ["before log line 14", "after log line 14",
                                                      "after log line 1", "before log line 1"]
    assert "available_gpu_mem=15.00 GB" in free["evidence"][1]["text"]
    # rank-imbalance fires twice after (two readings): two changes, each named by its reading
    assert [(f["key"], f["status"]) for f in d["findings"]] == [
        ("rank-imbalance (free after weights)", "appeared"), ("rank-imbalance (free before weights)", "appeared")]
    for columns in ("80", "100", "200"):
        monkeypatch.setenv("COLUMNS", columns)
        code, out, _ = run_entry(monkeypatch, capsys, "diff", before, after)
        assert code == 0 and all(len(line) <= int(columns) for line in out.splitlines()), columns
        rows = [line for line in out.splitlines() if line.startswith(("  free ", "  unattributed "))]
        assert rows[0].split()[:4] == ["free", "14.00", "15.00", "+1.00"], rows
        assert "appeared: rank-imbalance (free before weights)" in out
