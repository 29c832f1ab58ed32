from __future__ import annotations

from capdiag.engine import Parts, rule
from capdiag.rules._common import shares_system_memory


@rule("gpu-capacity-ambiguous", code="CD123", severity="warning",
      reads=("gpu:identity", "gpu:total_gib"))
def gpu_capacity_ambiguous(kb):
    """What it checks: the GPU total rests on weak ground — only the vendor's nominal GB is
    known, the inputs name several GPU models, or the GPU shares its memory with the CPU (DGX
    Spark GB10), where "free" moves with everything else on the machine.

    Why it matters: the framework row, percentages and `other` all subtract from the total; a
    nominal or wrong total shifts every one of them. B200 and GB200 exist in several SKUs
    (180/192 GB, 186/192 GB); nominal figures do not say which.

    Example: `--gpu gb10` (no measured total: nvidia-smi prints "Not Supported").

    What to do: give `--gpu-total-gib` or nvidia-smi output (`--nvidia-smi-file`) from the
    machine itself.
    """
    total = kb.get("gpu", "total_gib")
    ident = kb.get("gpu", "identity")
    reasons = []
    if total is not None and total.known and total.detail.get("source") == "nominal":
        reasons.append("only the nominal capacity is known")
    if ident is not None and ident.known and ident.value.get("ambiguous") and not ident.value.get("totals_agree"):
        reasons.append(f"the inputs name several GPUs ({', '.join(ident.value['candidates'])})")
    if shares_system_memory(kb):
        reasons.append("its memory is shared with the CPU")
    if not reasons:
        return
    yield Parts((total, ident),
                title="The GPU's capacity is uncertain",
                message=f"The GPU total is uncertain: {'; '.join(reasons)}.",
                action="Give --gpu-total-gib or --nvidia-smi-file from the machine itself.")
