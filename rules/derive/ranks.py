"""Across ranks: which one binds the KV pool."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, rule
from capdiag.rules._common import line_ref
from capdiag.vocabulary import SEGMENTS


@rule("ranks.binding",
      reads=(F.LoadWeightEnd, F.MemoryPoolEnd, F.VllmAvailableKV),
      concludes=("binding_rank",))
def binding_rank(kb):
    """What it concludes: `binding_rank`: the rank whose memory sizes every rank's KV pool.

    How: The rank with the least memory for its KV pool binds every rank's pool (SGLang sizes the
    pool from the minimum over ranks; vLLM takes the smallest worker's block count). SGLang: the
    least free memory after the weights load, else after the pools; vLLM: the least `Available KV
    cache memory`.

    Example: `[TP3] Load weight end. … avail mem=61.20 GB` against 63.44 on the others: TP3 binds."""
    for kind, attr, what in ((F.LoadWeightEnd, "avail_gib", "free after weights"),
                             (F.MemoryPoolEnd, "avail_gib", "free after pools"),
                             (F.VllmAvailableKV, "gib", "available KV cache memory")):
        readings = [f for f in kb.of(kind) if getattr(f, attr) is not None]
        ranks = {f.rank.key() for f in readings}
        if len(ranks) < 2:
            continue
        least = min(readings, key=lambda f: (getattr(f, attr), f.rank.key()))
        low = getattr(least, attr)
        spread = round(max(getattr(f, attr) for f in readings) - low, 2)
        yield Derived("binding_rank", None, least.rank.label, "ranks.binding", tuple(readings),
                      f"least {what}: {low} GiB on {least.rank.label} ({line_ref(least)}); "
                      f"spread across {len(ranks)} ranks {spread} GiB",
                      {"rank": least.rank.key(), "reading": what, "gib": low, "spread_gib": spread})
        return


_SEGMENT_SOURCES = {
    "sglang": (("weights", ("weight_mem_usage_gib",)), ("kv_cache", ("kv_size_gib",)),
               ("kv_cache", ("k_size_gib", "v_size_gib")), ("mamba_state", ("mamba_conv_state_gib", "mamba_ssm_state_gib")),
               ("cuda_graph", ("cuda_graph_mem_usage_gib", "piecewise_cuda_graph_mem_usage_gib",
                               "prefill_cuda_graph_mem_usage_gib")),
               ("free", ("available_gpu_mem_gib",)), ("free", ("cuda_graph_end_avail_gib",))),
    "vllm": (("weights", ("model_loading_gib",)), ("kv_cache", ("available_kv_cache_gib",)),
             ("cuda_graph", ("graph_capture_gib",)), ("framework", ("non_torch_memory_gib",)),
             ("activation", ("activation_peak_gib",))),
}




@rule("ranks.memory",
      reads=(F.Fact, "observed", "gpu:total_gib", "target_rank", "breakdown"),
      concludes=("rank_memory",))
def rank_memory(kb):
    """What it concludes: `rank_memory.<rank>`: each rank's memory by category, for the per-rank table
    and bars.

    How: Each rank's memory by category, from the figures that rank printed (for the per-rank bars):
    weights, KV cache, Mamba state, CUDA graphs (every capture of the rank), free at the end;
    framework = GPU total − free before weights (SGLang) or non-torch memory (vLLM); vLLM's
    activation peak; and SGLang's unattributed = free before weights − free at the end − the rows
    between, when the rank printed weights, KV and a free reading. These are the breakdown's
    top-level rows, which sum to the GPU total; nvidia-smi's readings stand beside them in the
    per-rank table. The target rank takes the breakdown's rows. A category a rank did not print is
    left out, not zero.

    Example: `[TP1] Load weight end. … mem usage=7.49 GB.` fills TP1's weights."""
    vllm = bool(kb.of(F.VllmVersion, F.VllmEngineConfig, F.VllmModelLoading, F.VllmKVCacheSize, role=None))
    total = kb.get("gpu", "total_gib")
    target = kb.value("target_rank")
    log_facts = [f for f in kb.facts if f.evidence.source == "log"]
    by_rank: dict[tuple, list] = {}  # grouped once: filtering every fact per rank is quadratic in the ranks
    for f in log_facts:
        by_rank.setdefault(f.rank.key(), []).append(f)
    for key, observed in sorted((kb.value("observed") or {}).items()):
        if key == target:  # the breakdown's rows: the best derivation of each category
            rows = [d for d in kb.topic("breakdown") if d.known and d.key in SEGMENTS]
            if rows:
                yield Derived("rank_memory", key, {d.key: d.value for d in rows}, "ranks.memory", tuple(rows),
                              "the target rank's breakdown rows")
                continue
        segments: dict[str, float] = {}
        for category, keys in _SEGMENT_SOURCES["vllm" if vllm else "sglang"]:
            values = [observed.get(k) for k in keys]
            present = [v for v in values if v is not None]
            if category not in segments and present and (len(keys) == 1 or category in ("cuda_graph", "mamba_state")
                                                          or len(present) == len(keys)):
                segments[category] = round(sum(present), 2)
        begin = observed.get("load_weight_begin_avail_gib")
        if not vllm and begin is not None and total is not None and total.known:
            segments["framework"] = round(total.value - begin, 2)
        if not vllm and begin is not None and {"weights", "kv_cache", "free"} <= set(segments):
            named = sum(v for c, v in segments.items() if c not in ("framework", "free"))
            segments["unattributed"] = round(begin - segments["free"] - named, 2)
        if segments:
            premises = tuple(by_rank.get(key, ())) + tuple(p for p in (total,) if p)
            yield Derived("rank_memory", key, segments, "ranks.memory", premises,
                          ", ".join(f"{c} {v}" for c, v in segments.items()) + " GiB")
