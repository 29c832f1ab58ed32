"""vLLM's other backends: the CPU backend's KV space on its NUMA node, and the memory lines of the
XPU, HPU (Gaudi) and TPU workers, each read onto the same facts as CUDA's (fixtures written in
the real formats of cpu_worker.py, xpu_worker.py, hpu_worker.py / hpu_model_runner.py and
tpu-inference's tpu_worker.py)."""
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


def test_xpu_profiling_lines_in_mib_give_total_and_non_torch():
    """xpu_worker.py prints MB computed as bytes / 2^20: 24480.00 MB is 23.9062 GiB."""
    report = corpus_report(fixture("vllm_xpu_v0100.log"))
    observed = report["observed"]
    assert observed["total_gpu_memory_gib"] == 23.9062 and observed["non_torch_memory_gib"] == 0.5
    assert row(report, "weights")["gib"] == 5.7812  # `Model loading took` wins over `model load takes`
    assert row(report, "framework")["gib"] == 0.5 and row(report, "framework")["status"] == "measured"
    assert report["budget"]["gib"] == round(23.90625 * 0.8, 2)
    assert row(report, "kv_cache")["status"] == "unknown"  # XPU prints no KV figure


def test_hpu_lines_give_weights_total_utilization_and_kv_budget():
    report = corpus_report(fixture("vllm_hpu_v064.log"))
    assert report["config"]["gpu_memory_utilization"] == 0.9
    assert row(report, "weights")["gib"] == 14.98
    kv = row(report, "kv_cache")
    assert kv["gib"] == 63.99 and kv["status"] == "measured"
    assert report["observed"]["total_gpu_memory_gib"] == 94.62 and report["observed"]["gpu_blocks"] == 4095
    # HPU applies the utilization to the memory free after profiling (79.0 × 0.9), not to the total
    assert report["budget"]["gib"] == 71.1 and "free memory after profiling" in report["budget"]["derivation"]


def test_hpu_dummy_block_wording_takes_the_usable_kv_figure():
    from capdiag.parsing.vllm import parse_vllm_line
    [parsed] = parse_vllm_line("INFO 03-01 10:00:00 hpu_worker.py:250] Free device memory: 79.0 GiB, 71.1 GiB usable "
                               "(gpu_memory_utilization=0.9), 7.11 GiB reserved for HPUGraphs (VLLM_GRAPH_RESERVED_MEM=0.1), "
                               "512 MiB reserved for KV cache dummy block 63.49 GiB reserved for usable KV cache")
    assert parsed.values["values"]["kv_cache_gib"] == 63.49 and "kv_dummy_block_gib" not in parsed.values["values"]


def test_tpu_memory_statistics_give_total_budget_and_kv():
    report = corpus_report(fixture("vllm_tpu_v026.log"))
    assert row(report, "kv_cache")["gib"] == 20.08
    assert report["observed"]["total_gpu_memory_gib"] == 31.25
    assert report["budget"]["gib"] == 28.12
    assert report["config"]["gpu_memory_utilization"] is None  # the cap is printed, the fraction is not
