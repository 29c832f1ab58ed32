"""utilization-too-high (CD105)."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Finding, rule
from capdiag.rules._common import line_ref


@rule("utilization-too-high", code="CD105", severity="error", frameworks=("vllm",),
      reads=(F.VllmStartupMemory,))
def utilization_too_high(kb):
    """What it checks: the fraction of GPU memory the server was told to use is more than the
    GPU had free at start-up — vLLM's "Free memory on device (F/T GiB) on startup is less than
    desired GPU memory utilization (U, R GiB)".

    Why it matters: the engine refuses to start. Usually another process (a previous server
    that did not exit, another tenant) holds memory, or the utilization was raised past what a
    shared GPU can give.

    Example: `Free memory on device (13.58/15.99 GiB) on startup is less than desired GPU memory
    utilization (0.85, 13.59 GiB).`

    What to do: free the GPU, or lower `--gpu-memory-utilization` to at most free / total.
    """
    for s in kb.of(F.VllmStartupMemory, role=None):
        if not s.error or s.free_gib is None or s.total_gib is None:
            continue
        ceiling = int(s.free_gib / s.total_gib * 100) / 100
        yield Finding("finding", "utilization-too-high", None, "utilization-too-high", (s,),
                      f"At start-up {s.free_gib} of {s.total_gib} GiB were free, less than the "
                      f"{s.requested_gib} GiB that gpu_memory_utilization {s.utilization} asks for ({line_ref(s)}).",
                      severity="error", title="gpu_memory_utilization asks for more than is free",
                      action=f"Free the GPU (another process holds {round(s.total_gib - s.free_gib, 2)} GiB) or lower "
                             f"--gpu-memory-utilization to ≤ {ceiling}.",
                      detail={"ceiling": ceiling})
        return
