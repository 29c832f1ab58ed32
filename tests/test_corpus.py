"""The shared corpus of real SGLang logs, scored against hand-checked truth the way
../shared/tools/corpus_check.py scores `capdiag explain --format json` (same keys, same
tolerances), one log per test so a regression names its log. Skipped without ../shared.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from capdiag.analysis import analyse
from capdiag.render import render
from capdiag.report import build
from capdiag.rows import plain
from helpers import (breakdown_gib, check_breakdown_row, close, corpus_id, corpus_logs,
                     corpus_report, max_concurrent, truth_same)

# as in corpus_check.py
SGLANG_CONFIG = {"tp_size": "tp_size", "model_path": "model", "mem_fraction_static": "mem_fraction_static"}
SGLANG_RENAME = {"sw_kv_calc_available_bytes_gb": "dsv4_available_bytes_gib",
                 "sw_kv_calc_full_token": "dsv4_full_token"}
SGLANG_CORE = ["load_weight_begin_avail_gib", "load_weight_end_avail_gib", "weight_mem_usage_gib", "kv_tokens",
               "k_size_gib", "v_size_gib", "kv_size_gib", "memory_pool_end_avail_gib", "cuda_graph_mem_usage_gib",
               "cuda_graph_end_avail_gib", "max_total_num_tokens", "max_running_requests", "context_len",
               "available_gpu_mem_gib"]

LOGS = corpus_logs()
if not LOGS:
    pytestmark = pytest.mark.skip(reason="shared corpus (../shared) is absent")


def sglang_key(k: str) -> str:
    k = SGLANG_RENAME.get(k, k)
    return k[:-3] + "_gib" if k.endswith("_gb") else k


def truth_for(path: Path) -> dict:
    return json.loads(path.with_name(path.name[: -len(".log")] + ".truth.json").read_text())


def rank_observed(report: dict, tp: str):
    for r in report.get("ranks") or []:
        rank = r.get("rank") or {}
        if str(rank.get("tp") if rank.get("tp") is not None else 0) == tp:
            return r.get("observed") or {}
    return None


@pytest.mark.parametrize("log", LOGS, ids=corpus_id)
def test_framework_and_schema(log):
    truth, report = truth_for(log), corpus_report(str(log))
    assert truth["framework"] == "sglang"
    assert report["framework"] == "sglang" and report["schema"] == "capdiag.report/1"
    for key in ("source", "config", "gpu", "observed", "ranks", "breakdown", "concurrency", "findings"):
        assert key in report


@pytest.mark.parametrize("log", LOGS, ids=corpus_id)
def test_config(log):
    truth, config = truth_for(log), corpus_report(str(log))["config"]
    bad = [f"{rk}: want {truth[tk]!r}, got {config.get(rk)!r}" for tk, rk in SGLANG_CONFIG.items()
           if truth.get(tk) is not None and not truth_same(truth[tk], config.get(rk))]
    assert not bad
    # a fraction the log does not state is not filled in (SGLang's 0.88 fallback included)
    if truth.get("mem_fraction_static") is None:
        assert config.get("mem_fraction_static") is None


@pytest.mark.parametrize("log", LOGS, ids=corpus_id)
def test_observed_per_rank(log):
    truth, report = truth_for(log), corpus_report(str(log))
    bad, scored = [], 0
    for tp, values in sorted((truth.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
        targets = [("rank0", report.get("observed") or {})] if tp == "0" else []
        targets.append((f"TP{tp}", rank_observed(report, tp)))
        for where, got in targets:
            if got is None:
                bad.append(f"{where}: rank missing from report")
                continue
            for k, want in values.items():
                key = sglang_key(k)
                if want is None:
                    if key in SGLANG_CORE and got.get(key) is not None:
                        bad.append(f"{where} {key}: invented {got.get(key)!r} (the log shows no value)")
                    continue
                scored += 1
                if not truth_same(want, got.get(key)):
                    bad.append(f"{where} {key}: want {want!r}, got {got.get(key)!r}")
    assert not bad, "\n".join(bad)
    assert scored > 0 or all(v is None for r in truth["ranks"].values() for v in r.values())


@pytest.mark.parametrize("log", LOGS, ids=corpus_id)
def test_derived(log):
    truth, report = truth_for(log), corpus_report(str(log))
    r0 = (truth.get("ranks") or {}).get("0") or {}
    bad = []
    weights = r0.get("weight_mem_usage_gb")
    if weights is None and r0.get("load_weight_begin_avail_gb") is not None and r0.get("load_weight_end_avail_gb") is not None:
        weights = round(r0["load_weight_begin_avail_gb"] - r0["load_weight_end_avail_gb"], 2)
    if weights is not None and not close(weights, breakdown_gib(report, "weights"), 0.021):
        bad.append(f"breakdown.weights: want {weights}, got {breakdown_gib(report, 'weights')}")
    hybrid = any(k.startswith(("mamba", "swa", "sw_kv")) for k in r0)
    kv = r0.get("kv_size_gb")
    if kv is None and r0.get("k_size_gb") is not None and r0.get("v_size_gb") is not None:
        kv = r0["k_size_gb"] + r0["v_size_gb"]
    if kv is not None and not hybrid and not close(kv, breakdown_gib(report, "kv_cache"), 0.021):
        bad.append(f"breakdown.kv_cache: want {kv}, got {breakdown_gib(report, 'kv_cache')}")
    graphs = [v for k, v in r0.items()
              if k.endswith("cuda_graph_mem_usage_gb") and not k.startswith("draft_") and v is not None]
    if graphs and not close(round(sum(graphs), 2), breakdown_gib(report, "cuda_graph"), 0.011 * max(1, len(graphs))):
        bad.append(f"breakdown.cuda_graph: want {round(sum(graphs), 2)}, got {breakdown_gib(report, 'cuda_graph')}")
    tokens, reqs = r0.get("max_total_num_tokens"), r0.get("max_running_requests")
    if tokens is not None and reqs is not None and max_concurrent(report, 4096) != min(tokens // 4096, reqs):
        bad.append(f"concurrency@4096: want {min(tokens // 4096, reqs)}, got {max_concurrent(report, 4096)}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("log", LOGS, ids=corpus_id)
def test_breakdown_rows_are_consistent(log):
    """Every row is measured/derived with a number and cited lines, or unknown with a reason."""
    for row in corpus_report(str(log))["breakdown"]:
        check_breakdown_row(row)


@pytest.mark.parametrize("log", LOGS, ids=corpus_id)
def test_renders(log):
    report = build(analyse(str(log)))
    text = render(report, "text")
    assert "MEMORY BREAKDOWN" in text and str(log) in text
    assert json.loads(render(report, "json")) == json.loads(json.dumps(report, default=plain))
    try:
        markdown = render(report, "markdown")
    except Exception as exc:  # the markdown template may not exist yet
        if type(exc).__name__ != "TemplateNotFound":
            raise
    else:
        assert markdown.strip()
