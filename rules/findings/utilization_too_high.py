from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.memory.weights import named_weight_gib
from capdiag.rules.findings._advice import failed, round_down
from capdiag.rules._common import gib, line_ref


# what a start-up needs beside the weights, at the least (activation peak, non-torch, a KV block)
MIN_BESIDE_WEIGHTS_GIB = 1.0


@rule("utilization-too-high", code="CD105", severity="error", frameworks=("vllm",),
      reads=(F.VllmStartupMemory, "failure?", "weights:theoretical_gib?", "config:model?", "config:quantization?",
             "config:tp_size?", "config:pp_size?"))
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
    `--gpu-memory-utilization` to at most F / T, rounded down — only where that budget still holds
    the weights (from config.json, else the parameter count the model's name states) and a
    little more. When F / T is below 0.01, or the weights would not fit under it, no utilization
    fits: the GPU must be freed, or the model spread over more GPUs.
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
    weights = _weights(kb)
    if ceiling > 0 and weights is not None and weights[0] + MIN_BESIDE_WEIGHTS_GIB > ceiling * worst.total_gib:
        action = (f"Free the GPU of the other processes holding {held} GiB: a --gpu-memory-utilization of ≤ {ceiling} "
                  f"(free {worst.free_gib} / total {worst.total_gib}) leaves {gib(ceiling * worst.total_gib)} GiB, "
                  f"under the weights alone ({weights[1]}), so lowering it cannot work; or spread the model over "
                  "more GPUs.")
    elif ceiling > 0:
        action = (f"Free the GPU of the other processes holding {held} GiB, or lower --gpu-memory-utilization to "
                  f"≤ {ceiling} (free {worst.free_gib} / total {worst.total_gib} = {round(ratio, 4)}, rounded down).")
    else:
        action = f"No --gpu-memory-utilization fits: only {worst.free_gib} GiB is free. Free the GPU first."
    failure = kb.get("failure")
    named = failure if failure is not None and failure.value == "gpu-memory-held" else None
    yield Parts((named, *errors),
                title="gpu_memory_utilization asks for more than is free",
                message=f"At start-up {worst.free_gib} of {worst.total_gib} GiB were free on the GPU{device}, less "
                        f"than the {worst.requested_gib} GiB that gpu_memory_utilization {worst.utilization} asks for "
                        f"({worst.total_gib} × {worst.utilization}); {held} GiB is held by other processes "
                        f"({line_ref(worst)}{others}).",
                action=action,
                detail={"ceiling": ceiling if ceiling > 0 else None, "held_gib": held, "free_gib": worst.free_gib,
                        "total_gib": worst.total_gib, **failed(kb.get("failure"), ("gpu-memory-held",))})


def _weights(kb):
    """(GiB of weights a rank, how): config.json's count, else the model's name's."""
    theory = kb.get("weights", "theoretical_gib")
    if theory is not None and theory.known:
        return theory.value, f"{theory.value} GiB a rank, from config.json"
    tp = kb.value("config", "tp_size")
    model = kb.value("config", "model")
    if not isinstance(tp, int) or not model:
        return None
    return named_weight_gib(model, kb.value("config", "quantization"), tp * (kb.value("config", "pp_size") or 1))
