from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.memory.shape import experts_of


@rule("moe-expert-buffers", code="CD122", severity="info",
      reads=(F.DeviceName, F.ModelConfig))
def moe_expert_buffers(kb):
    """What it checks: the model is a mixture of experts (config.json experts, MoE kernel-config
    lines in the log).

    Why it matters: MoE layers allocate routing and dispatch buffers (top-k indices, permuted
    activations, DeepEP/all-to-all buffers) that no start-up line reports. Those allocated
    during weight loading land in `weights`, those at capture in `cuda_graph`, the rest — and
    their growth with batch size — in `other`.

    Example: `Using MoE kernel config from …/E=8,N=2048,device_name=NVIDIA_H100_80GB_HBM3,…`.

    What to do: expect some unexplained memory on MoE models; with EP/DeepEP, budget its
    buffers (SGLang reserves extra memory for them in its default fraction).
    """
    model = kb.first(F.ModelConfig, role=None)
    experts = experts_of(model.fields) if model is not None else 0
    lines = kb.of(F.DeviceName, role=None)
    if not experts and not lines:
        return
    what = f"{experts} experts (config.json)" if experts else "MoE kernel-config lines in the log"
    yield Parts((model if experts else None, *lines[:1]),
                title="MoE buffers are not logged",
                message=f"A mixture-of-experts model ({what}): expert routing and dispatch buffers are not reported "
                        "by any line; they sit inside weights, graphs or the unexplained remainder.",
                action="Expect some unexplained memory; with EP/DeepEP, budget its all-to-all buffers.")
