from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, cannot_judge, rule
from capdiag.rules._common import is_vllm


@rule("cuda-graph-heavy", code="CD116", severity="info",
      thresholds={"max_percent_of_kv": 15.0, "max_percent_of_total": 4.0},
      reads=(F.Options, F.ServerArgs, "breakdown:cuda_graph", "breakdown:kv_cache", "gpu:total_gib"))
def cuda_graph_heavy(kb, t):
    """What it checks: CUDA-graph memory exceeds `max_percent_of_kv` % of the KV cache or
    `max_percent_of_total` % of the GPU.

    Why it matters: graph memory is taken from the headroom the KV pool could otherwise use.
    It grows with the largest captured batch size (SGLang `cuda_graph_max_bs`, vLLM's capture
    sizes) and with piecewise/prefill graphs.

    Example: 2.3 GiB of piecewise graphs beside a 5 GiB KV cache.

    What to do: lower `--cuda-graph-max-bs` (vLLM: fewer/smaller `cudagraph_capture_sizes`) to
    the concurrency you actually serve; graph memory falls roughly in proportion to the largest
    batch captured (an estimate — capture again to measure).
    """
    graphs = kb.get("breakdown", "cuda_graph")
    kv = kb.get("breakdown", "kv_cache")
    total = kb.get("gpu", "total_gib")
    if graphs is None or not graphs.known:
        yield cannot_judge(("the CUDA-graph memory", graphs))
        return
    if graphs.value <= 0:
        return
    of_kv = 100 * graphs.value / kv.value if kv is not None and kv.known and kv.value else None
    of_total = 100 * graphs.value / total.value if total is not None and total.known and total.value else None
    if of_kv is None and of_total is None:
        yield cannot_judge(("the KV cache size", kv), ("the GPU total", total))
        return
    if not ((of_kv is not None and of_kv > t["max_percent_of_kv"]) or
            (of_total is not None and of_total > t["max_percent_of_total"])):
        return
    args = kb.first(F.ServerArgs, role=None)
    max_bs = args.fields.get("cuda_graph_max_bs") if args is not None else None
    share = ", ".join(s for s in ((f"{of_kv:.0f}% of the KV cache" if of_kv is not None else ""),
                                  (f"{of_total:.1f}% of the GPU" if of_total is not None else "")) if s)
    hint = (f" Captured up to batch {max_bs}: halving it would free roughly {graphs.value / 2:.2f} GiB (estimate)."
            if isinstance(max_bs, int) else "")
    flag = "cudagraph_capture_sizes / max_capture_size" if is_vllm(kb) else "--cuda-graph-max-bs"
    yield Parts((graphs, kv, total, args if max_bs else None),
                title=f"CUDA graphs take {graphs.value} GiB",
                message=f"CUDA graphs hold {graphs.value} GiB ({share}).{hint}",
                action=f"Lower {flag} to the concurrency you serve; re-measure after.")
