from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules._common import line_ref


@rule("kernel-cache-cold", code="CD108", severity="info", thresholds={"long_capture_s": 120.0},
      frameworks=("sglang",),
      reads=(F.KernelCacheNote, F.GraphCaptureEnd))
def kernel_cache_cold(kb, t):
    """What it checks: signs that this start-up compiled its kernels from scratch — SGLang's
    note that compiled-kernel caches moved to `SGLANG_CACHE_DIR` (v0.5.18+), DeepGEMM JIT
    compile lines, or a graph capture longer than `long_capture_s` seconds.

    Why it matters: the first start after an upgrade (or on a fresh node) recompiles Triton,
    FlashInfer, DeepGEMM and Inductor kernels. It inflates start-up time and the memory that
    no line explains; a second start with a warm cache is faster and leaner.

    Example: `Capture cuda graph end. Time elapsed: 455.21 s` on a model that captures in 20 s
    when warm.

    What to do: persist `SGLANG_CACHE_DIR` (and the Triton/Inductor caches) across restarts, e.g.
    on a volume; judge start-up memory on a warm start.
    """
    moved = kb.of(F.KernelCacheNote, role=None)
    slow = [g for g in kb.of(F.GraphCaptureEnd, role=None) if g.elapsed_s and g.elapsed_s > t["long_capture_s"]]
    if not (moved or slow):
        return
    signs = ([f"compiled-kernel caches moved to SGLANG_CACHE_DIR ({line_ref(moved[0])})"] if moved else []) + \
            ([f"a {slow[0].elapsed_s:.0f} s graph capture ({line_ref(slow[0])})"] if slow else [])
    yield Parts((*moved[:1], *slow[:1]),
                title="Kernels were probably compiled cold",
                message="This start-up likely compiled kernels from a cold cache: " + "; ".join(signs) + ".",
                action="Persist SGLANG_CACHE_DIR (and Triton/Inductor caches) across restarts; measure memory and "
                       "start-up time on a warm start.")
