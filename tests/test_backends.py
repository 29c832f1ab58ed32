"""vLLM's CPU backend: the KV space a worker gets on its NUMA node (fixture written in the real
format of cpu_worker.py's lines)."""
from __future__ import annotations

from helpers import conc, corpus_report, fixture, row


def test_cpu_backend_kv_space_budget_and_no_graphs():
    report = corpus_report(fixture("vllm_cpu_backend.log"))
    assert report["framework"] == "vllm" and report["config"]["model"] == "Qwen/Qwen2.5-1.5B-Instruct"
    kv = row(report, "kv_cache")
    assert kv["gib"] == 2.61 and kv["status"] == "measured" and "node 0 of its 30.96 GiB" in kv["derivation"]
    assert row(report, "cuda_graph")["gib"] == 0.0 and "CPU backend" in row(report, "cuda_graph")["derivation"]
    assert report["budget"]["gib"] == 8.05 and "requested for the worker" in report["budget"]["derivation"]
    observed = report["observed"]
    assert observed["available_kv_cache_gib"] == 2.61 and observed["cpu_node_memory_gib"] == 30.96
    assert observed["total_gpu_memory_gib"] is None  # a NUMA node's memory is no GPU's total
    assert conc(report, 4096)["max_concurrent"] == 97728 // 4096
