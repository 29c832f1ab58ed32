from __future__ import annotations

from capdiag.engine import Parts, rule
from capdiag.rules._common import breakdown_rows, gib
from capdiag.vocabulary import NAMED

_STATED = NAMED + ("free",)  # what a rank's lines state it holds and has left, none of it from the total


@rule("figures-exceed-gpu", code="CD132", worse=("held_gib", "higher"), severity="warning", thresholds={"over_percent": 2.0, "over_gib": 0.1},
      reads=("gpu:total_gib", *(f"breakdown:{c}?" for c in _STATED)))
def figures_exceed_gpu(kb, t):
    """What it checks: the target rank's own figures — every breakdown row not computed from the
    GPU total (weights, KV cache, Mamba state, graphs, the draft's, vLLM's non-torch memory and
    activation peak, SGLang's free memory at the end) — sum to more than the GPU total, by more
    than `over_percent` % of it plus `over_gib` GiB (readings taken at different moments overlap
    a little, no more).

    Why it matters: one GPU cannot hold more than its memory. The total came from `--gpu`,
    `--gpu-total-gib` or nvidia-smi output of another machine, or the figures are a whole
    server's (a probe's cluster-wide gauge); every percentage, the framework row and every
    remedy projected against that total are then wrong.

    Example: `--gpu l4` (22.49 GiB) beside a log whose KV pool alone is 48.82 GiB.

    What to do: name the GPU the server ran on (`--gpu`), or give `--gpu-total-gib` or
    `--nvidia-smi-file` from that machine.
    """
    total = kb.get("gpu", "total_gib")
    if total is None or not total.known:
        return
    stated = [d for d in breakdown_rows(kb, _STATED) if d.known and d.value > 0 and total not in d.premises]
    held = gib(sum(d.value for d in stated))
    if not stated or held <= total.value * (1 + t["over_percent"] / 100) + t["over_gib"]:
        return
    biggest = max(stated, key=lambda d: d.value)
    share = round(100 * biggest.value / total.value, 1)
    yield Parts((total, *stated),
                title=f"The rank's figures sum to {held} GiB, more than the {total.value} GiB GPU",
                message=f"The rank's own figures sum to {held} GiB ("
                        + " + ".join(f"{d.key} {d.value}" for d in stated)
                        + f"), more than the GPU total of {total.value} GiB ({total.formula}); {biggest.key} alone "
                        f"is {share}% of it. The total is not this server's GPU, or the figures cover several GPUs.",
                action="Name the GPU the server ran on (--gpu), or give --gpu-total-gib or --nvidia-smi-file from "
                       "that machine; until then the percentages and the advice rest on the wrong total.",
                detail={"held_gib": held, "total_gib": total.value})
