from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules._common import line_ref


def _deepgemm_evidence(kb):
    """Lines that show DeepGEMM is in use: its warm-up/JIT lines, an FP8 block-quantized
    checkpoint, or a DeepSeek-style MoE model class."""
    lines = kb.of(F.DeepGEMMActivity, role=None)
    weights = kb.first(F.LoadWeightEnd, role=None)
    model = kb.first(F.ModelConfig, role=None)
    quant = (model.fields.get("quantization_config") or {}) if model is not None else {}
    block_fp8 = str(quant.get("quant_method", "")).lower() == "fp8" and bool(quant.get("weight_block_size"))
    deepseek = weights is not None and str(weights.model_class or "").startswith(("Deepseek", "Glm", "KimiK"))
    return lines, block_fp8, deepseek, weights, model


# DeepGEMM's kernels are built for Hopper (sm90) and datacenter Blackwell (sm100/sm103) only
DEEPGEMM_MAJORS = (9, 10)


def _nvidia_or_unknown(kb) -> bool:
    """DeepGEMM is CUDA-only and Hopper/Blackwell-datacenter-only: not on a GPU the inputs name as
    AMD, on a compute capability it has no kernels for, or on NPU/CPU graphs."""
    if any(c.major not in DEEPGEMM_MAJORS for c in kb.of(F.ComputeCapability, role=None)):
        return False
    names = [f.name for f in kb.of(F.DeviceName, F.SmiGpu, role=None) if f.name]
    ident = kb.get("gpu", "identity")
    if ident is not None and ident.known and ident.value["alias"].startswith(("mi", "gaudi")):
        return False
    if any("AMD" in n or "Instinct" in n for n in names):
        return False
    return not any(g.device.lower() in ("npu", "cpu", "xpu") for g in kb.of(F.GraphCaptureBegin, F.GraphCaptureEnd,
                                                                            role=None))


@rule("deepgemm-jit-suspected", code="CD107", severity="info",
      reads=(F.DeepGEMMActivity, F.LoadWeightEnd, F.ModelConfig, F.DeviceName, F.SmiGpu, F.GraphCaptureBegin,
             F.GraphCaptureEnd, F.ComputeCapability, "gpu:identity", "breakdown:other"))
def deepgemm_jit_suspected(kb):
    """What it checks: the model runs DeepGEMM kernels — the log shows DeepGEMM warm-up/JIT
    lines, config.json declares FP8 block quantization, or the model class is DeepSeek-style
    MoE — while memory is unexplained or nvidia-smi was not given.

    Why it matters: DeepGEMM's JIT compilation and warm-up buffers are never logged. Their
    memory appears in whatever phase ran (inside a `mem usage` figure) or as unexplained
    memory, and the first start after an upgrade compiles again.

    Example: `Entering DeepGEMM JIT Pre-Compile session` and a 3 GiB `other` row.

    What to do: compare nvidia-smi right after start-up with and without
    `SGLANG_ENABLE_JIT_DEEPGEMM=0` (or after the JIT cache is warm); the difference is the JIT
    share.
    """
    lines, block_fp8, deepseek, weights, model = _deepgemm_evidence(kb)
    if not (lines or block_fp8 or deepseek) or not _nvidia_or_unknown(kb):
        return
    other = kb.get("breakdown", "other")
    unexplained = other is not None and other.known and other.value > 0.5
    if other is not None and other.known and not unexplained:
        return
    why = (f"DeepGEMM lines in the log ({line_ref(lines[0])})" if lines else
           "config.json declares FP8 block quantization" if block_fp8 else
           f"the model class {weights.model_class} uses DeepSeek-style MoE kernels")
    where = (f"{other.value} GiB is unexplained" if unexplained else
             "without nvidia-smi output the unexplained share cannot be measured")
    yield Parts((*lines[:3], weights if deepseek else None, model if block_fp8 else None, other),
                title="DeepGEMM JIT memory is a likely part of unexplained memory",
                message=f"{why}; DeepGEMM JIT memory is never logged, and {where}.",
                action="Sample nvidia-smi after start-up with a warm JIT cache and with DeepGEMM JIT disabled; "
                       "the difference is its share.")
