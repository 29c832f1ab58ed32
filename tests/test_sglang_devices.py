"""SGLang's ports — Ascend NPU, ROCm and Hygon DCU (HIP), Moore Threads MUSA, Intel XPU, CPU —
print the same memory lines as CUDA; what differs is what `avail mem` measures
(`get_available_gpu_memory`): the device's free memory everywhere but XPU (total −
PyTorch-allocated) and CPU (the host's available memory per NUMA node). Fixtures and lines
written in the real formats of those ports."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from capdiag.analysis import analyse
from capdiag.render import render
from capdiag.report import build

from helpers import fixture, row, write_log

XPU = fixture("sglang_xpu_b60.log")


def report(path: str, **kw) -> dict:
    return json.loads(render(build(analyse(path, **kw)), "json"))


def write_log_from(path: str, change, name: str = "variant.log") -> str:
    """A copy of the fixture at `path`, changed by `change` (text → text), in a new directory."""
    return write_log(Path(tempfile.mkdtemp()), change(open(path).read()), name)


def rules_of(rep: dict, key: str) -> set:
    return {f["rule"] for f in rep[key]}


def test_on_xpu_the_free_and_pre_weights_memory_are_not_read_as_the_devices():
    rep = report(XPU, gpu_total_gib=23.91)
    assert row(rep, "weights")["gib"] == 7.52 and row(rep, "kv_cache")["gib"] == 4.44
    for category in ("framework", "free"):
        r = row(rep, category)
        assert r["gib"] is None and r["status"] == "unknown"
        assert "total − PyTorch-allocated" in r["derivation"], r["derivation"]
    assert "11.95 GiB (line 10)" in row(rep, "free")["derivation"]
    # no advice rests on memory the log does not show: excess-headroom is not judged ...
    assert "excess-headroom" not in rules_of(rep, "findings") and "excess-headroom" in rules_of(rep, "not_judged")
    # ... while the same start-up on CUDA (no `device='xpu'`) gets it
    cuda = write_log_from(XPU, lambda t: t.replace("device='xpu', ", ""))
    twin = report(cuda, gpu_total_gib=23.91)
    assert row(twin, "free")["gib"] == 11.95 and row(twin, "framework")["gib"] == 0.0
    assert "excess-headroom" in rules_of(twin, "findings")


def test_the_device_comes_from_the_launch_command_when_no_server_args_line_survives():
    text = open(XPU).read().splitlines()
    command = "$ python3 -m sglang.launch_server --model-path Qwen/Qwen3-4B --device xpu --mem-fraction-static 0.5"
    log = write_log_from(XPU, lambda _: "\n".join([command] + text[1:]) + "\n")
    rep = report(log)
    free = row(rep, "free")
    assert free["gib"] is None and "total − PyTorch-allocated" in free["derivation"]
    assert any("--device xpu" in e["text"] for e in free["evidence"])


def test_a_graph_line_names_the_device_and_only_xpu_changes_the_reading(tmp_path):
    lines = ["[2026-07-14 09:12:07] Load weight begin. avail mem=23.91 GB",
             "[2026-07-14 09:12:13] Load weight end. elapsed=6.12 s, type=Qwen3ForCausalLM, dtype=torch.bfloat16, "
             "avail mem=16.39 GB, mem usage=7.52 GB.",
             "[2026-07-14 09:12:13] KV Cache is allocated. #tokens: 32294, K size: 2.22 GB, V size: 2.22 GB",
             "[2026-07-14 09:12:13] Memory pool end. avail mem=11.96 GB",
             "[2026-07-14 09:12:14] Capture {word} graph begin. This can take up to several minutes. avail mem=11.96 GB",
             "[2026-07-14 09:12:19] Capture {word} graph end. Time elapsed: 5.02 s. mem usage=0.31 GB. avail mem=11.65 GB."]
    free = {}
    for word in ("XPU", "npu", "cuda"):
        rep = report(write_log(tmp_path, "\n".join(lines).format(word=word) + "\n", f"{word}.log"))
        free[word] = row(rep, "free")["gib"]
        assert row(rep, "cuda_graph")["gib"] == 0.31
    # Ascend's `avail mem` is torch.npu.mem_get_info's free memory; `cuda graph` (CUDA, ROCm, MUSA) too
    assert free == {"XPU": None, "npu": 11.65, "cuda": 11.65}


def test_on_the_cpu_device_avail_mem_is_the_hosts_memory_per_numa_node():
    log = write_log_from(XPU, lambda t: t.replace("device='xpu'", "device='cpu'"))
    rep = report(log)
    assert row(rep, "free")["gib"] is None and "NUMA" in row(rep, "free")["derivation"]
    assert row(rep, "framework")["gib"] is None


def test_musa_port_lines_read_as_on_cuda(tmp_path):
    """The MUSA port's KV line names its dtype first (`dtype: torch.bfloat16, #tokens: …`), and
    quantized loads print `quant=fp8` in Load weight end; a `cuda graph` line there names no device."""
    log = write_log(tmp_path, "\n".join([
        "[2026-06-08 07:20:31 TP0] Load weight begin. avail mem=78.12 GB",
        "[2026-06-08 07:20:47 TP0] Load weight end. elapsed=15.80 s, type=Qwen3MoeForCausalLM, quant=fp8, "
        "avail mem=62.30 GB, mem usage=15.82 GB.",
        "[2026-06-08 07:20:53 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1012736, K size: 23.18 GB, "
        "V size: 23.18 GB",
        "[2026-06-08 07:20:53 TP0] Memory pool end. avail mem=15.90 GB",
        "[2026-06-08 07:21:30 TP0] Capture cuda graph end. Time elapsed: 36.10 s. mem usage=0.74 GB. avail mem=15.16 GB.",
    ]) + "\n")
    rep = report(log)
    assert rep["observed"]["kv_tokens"] == 1012736 and row(rep, "kv_cache")["gib"] == 46.36
    assert rep["config"]["kv_cache_dtype"] == "torch.bfloat16"
    assert row(rep, "weights")["gib"] == 15.82 and row(rep, "free")["gib"] == 15.16


def test_the_capacity_sglang_read_from_torch_is_the_gpu_total(tmp_path):
    """Where nvidia-smi reports no capacity (a GB10), SGLang's main process says what torch
    reported, in MiB: that is the GPU total the log states (124546 / 1024 = 121.63 GiB), read
    before server_args without opening a start-up of its own."""
    log = write_log(tmp_path, "\n".join([
        "[2026-08-01 23:37:38] Failed to get GPU memory capacity from nvidia-smi. Falling back to torch.cuda.mem_get_info(). "
        "Reported total GPU memory per device (MiB): [124546], using min: 124546 MiB.",
        "[2026-08-01 23:37:40] server_args=ServerArgs(model_path='org/Model-30B', tp_size=1, mem_fraction_static=0.8)",
        "[2026-08-01 23:38:02] Load weight begin. avail mem=115.36 GB",
        "[2026-08-01 23:40:10] Load weight end. type=Qwen3MoeForCausalLM, dtype=torch.bfloat16, avail mem=96.12 GB, mem usage=19.24 GB.",
    ]) + "\n")
    rep = report(log)
    assert rep["gpu"]["total_gib"] == 121.63 and len(rep["source"]["all_launches"]) == 1
    assert "total printed by the log (line 1)" in rep["gpu"]["total_derivation"]
    assert row(rep, "framework")["gib"] == 6.27  # 121.63 − 115.36
