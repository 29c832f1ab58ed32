from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules.findings._advice import round_down
from capdiag.rules._common import gib, line_ref


@rule("utilization-too-high", code="CD105", severity="error", frameworks=("vllm",),
      reads=(F.VllmStartupMemory,))
def utilization_too_high(kb):
    """What it checks: the fraction of GPU memory the server was told to use is more than the
    GPU had free at start-up — vLLM's "Free memory on device [cuda:N] (F/T GiB) on startup is
    less than desired GPU memory utilization (U, R GiB)" (0.9.1+; 0.14+ names the device). Each
    rank prints its own; the rank with the least free memory decides.

    Why it matters: the engine refuses to start. Usually another process (a previous server
    that did not exit, another tenant) holds memory, or the utilization was raised past what a
    shared GPU can give.

    Example: `Free memory on device cuda:1 (60.87/79.19 GiB) on startup is less than desired GPU
    memory utilization (0.95, 75.23 GiB).`

    What to do: free the GPU (T − F GiB is held outside this start-up), or lower
    `--gpu-memory-utilization` to at most F / T, rounded down. When F / T is below 0.01 no
    utilization fits: the GPU must be freed.
    """
    errors = [s for s in kb.of(F.VllmStartupMemory, role=None)
              if s.error and s.free_gib is not None and s.total_gib and s.utilization is not None]
    if not errors:
        return
    worst = min(errors, key=lambda s: s.free_gib / s.total_gib)
    held = gib(worst.total_gib - worst.free_gib)
    ratio = worst.free_gib / worst.total_gib
    # strictly below free/total: 0.14+ rounds total × U up to whole bytes before comparing
    ceiling = round_down(ratio - 1e-6)
    device = f" ({worst.device})" if worst.device else ""
    others = f"; {len(errors)} ranks report it, this one has the least free memory" if len(errors) > 1 else ""
    if ceiling > 0:
        action = (f"Free the GPU of the other processes holding {held} GiB, or lower --gpu-memory-utilization to "
                  f"≤ {ceiling} (free {worst.free_gib} / total {worst.total_gib} = {round(ratio, 4)}, rounded down).")
    else:
        action = f"No --gpu-memory-utilization fits: only {worst.free_gib} GiB is free. Free the GPU first."
    yield Parts(tuple(errors),
                title="gpu_memory_utilization asks for more than is free",
                message=f"At start-up {worst.free_gib} of {worst.total_gib} GiB were free on the GPU{device}, less "
                        f"than the {worst.requested_gib} GiB that gpu_memory_utilization {worst.utilization} asks for "
                        f"({worst.total_gib} × {worst.utilization}); {held} GiB is held by other processes "
                        f"({line_ref(worst)}{others}).",
                action=action,
                detail={"ceiling": ceiling if ceiling > 0 else None, "held_gib": held, "free_gib": worst.free_gib,
                        "total_gib": worst.total_gib})
