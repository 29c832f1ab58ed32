from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules._common import line_ref


@rule("overlap-weight-load", code="CD109", severity="info", frameworks=("sglang",),
      reads=(F.ServerArgs, F.WeightsCommitted))
def overlap_weight_load(kb):
    """What it checks: SGLang ran with `--startup-weight-load-mode overlap` (server_args, or the
    `Load weight end. Committed real weights after CUDA graph capture` line).

    Why it matters: the normal `Load weight end … mem usage` line is suppressed and the real
    weights page in while graphs are captured. A short load time then does not mean small
    weights, and capture-phase `mem usage` figures can hold weight pages.

    Example: `Load weight end. Committed real weights after CUDA graph capture in 4.12 s`.

    What to do: read the weights from config.json (`--config-json`) or a normal start-up;
    capdiag leaves the weights row unknown rather than guess.
    """
    args = kb.first(F.ServerArgs, role=None)
    committed = kb.first(F.WeightsCommitted, role=None)
    stated = args is not None and str(args.fields.get("startup_weight_load_mode", "")).lower() == "overlap"
    if not (stated or committed):
        return
    source = f"the commit line ({line_ref(committed)})" if committed else "server_args startup_weight_load_mode='overlap'"
    yield Parts((args if stated else None, committed),
                title="Weights load overlapped with graph capture",
                message=f"Weights load in overlap mode ({source}): no weight figure is printed, and weight paging "
                        "overlaps graph capture.",
                action="Take the weight footprint from config.json or a start-up without overlap mode.")
