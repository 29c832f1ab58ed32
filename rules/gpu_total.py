"""The GPU's total memory, from the best source the inputs give."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import line_ref


@rule("gpu-total")
def gpu_total(kb):
    """Concludes the GPU total in GiB, preferring a measured figure: `--gpu-total-gib`, then a
    total the log prints (vLLM's profiling record or `Free memory on device (F/T GiB)`,
    PyTorch's out-of-memory message), then the `--gpu` reference's observed total. A vendor's
    nominal GB is never used as usable GiB."""
    given = kb.first(F.GpuTotal, role=None)
    if given is not None and given.source == "--gpu-total-gib":
        yield Derived("gpu", "total_gib", given.gib, "gpu-total", (given,), "--gpu-total-gib")
        return
    printed = [(p, p.values["total_gpu_memory_gib"]) for p in kb.of(F.VllmMemoryProfile, role=None)
               if "total_gpu_memory_gib" in p.values]
    printed += [(s, s.total_gib) for s in kb.of(F.VllmStartupMemory, role=None) if s.total_gib is not None]
    printed += [(o, o.total_capacity_gib) for o in kb.of(F.OutOfMemory, role=None) if o.total_capacity_gib is not None]
    if printed:
        fact, value = printed[0]
        yield Derived("gpu", "total_gib", value, "gpu-total", (fact,), f"total printed by the log ({line_ref(fact)})",
                      {"source": "log"})
    elif given is not None:
        yield Derived("gpu", "total_gib", given.gib, "gpu-total", (given,), given.source, {"source": given.source})
    else:
        yield Derived("gpu", "total_gib", Unknown("the log prints no GPU total; give --gpu or --gpu-total-gib"),
                      "gpu-total")
