from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules._common import line_ref


@rule("cuda-graph-estimate-off", code="CD117", worse=("error_percent", "higher"), severity="warning",
      thresholds={"max_error_percent": 30.0, "min_difference_gib": 0.5},
      frameworks=("vllm",),
      reads=(F.VllmGraphPool, F.VllmGraphCapture))
def cuda_graph_estimate_off(kb, t):
    """What it checks: vLLM's pre-capture estimate of CUDA-graph memory differs from the actual
    figure by more than `max_error_percent` % (`CUDA graph pool memory: A (actual), E
    (estimated)`), or the capture line prints a negative figure. A difference under
    `min_difference_gib` is information only: a percentage of a small pool is noise.

    Why it matters: from 0.20 vLLM reserves the *estimate* inside the KV budget. An estimate
    far below the actual leaves the GPU tighter than planned (run-time OOM risk); far above it
    wastes KV memory. A negative capture figure means free memory rose during capture — a
    measurement artefact, so the graph memory is unknown rather than negative.

    Example: `CUDA graph pool memory: 0.71 GiB (actual), 1.55 GiB (estimated), difference:
    0.84 GiB (119.3%).`

    What to do: when the estimate is low, lower `--gpu-memory-utilization` by the difference /
    total; when high, raise it; `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0` turns estimation off.
    Under `min_difference_gib`, nothing: the note says the budget is as planned.
    """
    for pool in kb.of(F.VllmGraphPool):
        if pool.actual_gib <= 0:
            continue
        error = 100 * (pool.estimated_gib - pool.actual_gib) / pool.actual_gib
        if abs(error) > t["max_error_percent"]:
            direction = "over" if error > 0 else "under"
            small = abs(pool.estimated_gib - pool.actual_gib) < t["min_difference_gib"]
            yield Parts((pool,),
                        title=f"CUDA-graph estimate off by {error:+.0f}%",
                        message=f"vLLM estimated {pool.estimated_gib} GiB of CUDA graphs, actual {pool.actual_gib} GiB "
                                f"({error:+.0f}%, {line_ref(pool)}): the KV budget was {direction}-reserved by "
                                f"{abs(pool.estimated_gib - pool.actual_gib):.2f} GiB.",
                        action=(f"Nothing to change: a difference under {t['min_difference_gib']} GiB is within what "
                                "capture's own allocations move; the KV budget is as planned." if small else
                                "Adjust --gpu-memory-utilization by the difference / total (raise it when the "
                                "estimate is high, lower it when low)."),
                        detail={"error_percent": round(error, 1)},
                        key="estimate",
                        severity="info" if small else None)
            break
    negative = next((g for g in kb.of(F.VllmGraphCapture) if g.gib is not None and g.gib < 0), None)
    if negative is not None:
        yield Parts((negative,),
                    title="Negative CUDA-graph memory figure",
                    message=f"The capture line prints {negative.gib} GiB ({line_ref(negative)}): free memory rose "
                            "during capture (the allocator released cached blocks), so it measures nothing.",
                    action="Treat graph memory as unknown for this start-up; nvidia-smi after start-up measures it.",
                    key="negative",
                    severity="info")
