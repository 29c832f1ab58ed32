from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules._common import is_vllm, line_ref
from capdiag.vocabulary import element_size

# config.json keys that say the checkpoint carries its own KV scales (compressed-tensors'
# `kv_cache_scheme`, ModelOpt's `kv_cache_quant_algo`): SGLang warns even then (sgl-project/sglang#31224)
_KV_SCALE_KEYS = ("kv_cache_scheme", "kv_cache_quant_algo")


def _config_has_kv_scales(kb) -> bool:
    model = kb.first(F.ModelConfig, role=None)
    quant = model.fields.get("quantization_config") if model is not None else None
    return isinstance(quant, dict) and any(quant.get(key) for key in _KV_SCALE_KEYS)


@rule("fp8-kv-uncalibrated", code="CD133", severity="info",
      reads=(F.KVScaleDefault, F.ModelConfig, F.Options, F.DSV4MemoryCalculation, "kv_pool:dtype?"))
def fp8_kv_uncalibrated(kb):
    """What it checks: the framework says the fp8 KV cache runs with its scales at 1.0 (SGLang's
    `Using FP8 KV cache but no scaling factors provided`, vLLM's `Using KV cache scaling factor
    1.0 for fp8_e4m3`), and the pool is fp8 (or its dtype is not stated). Quiet where config.json
    states the checkpoint's own KV scales (`kv_cache_scheme`, `kv_cache_quant_algo`): SGLang
    prints the line even when it loaded them.

    Why it matters: without calibrated k/v scales, keys and values are cast to fp8 as they are:
    e4m3 keeps 3 mantissa bits and saturates beyond ±448. Many models lose little; some lose
    much (long-context attention, models with large activations). This is a quality question
    the memory figures cannot answer, so it is a note, not a warning.

    Example: `Using KV cache scaling factor 1.0 for fp8_e4m3. This may cause accuracy issues.`
    beside `Using fp8 data type to store kv cache`.

    What to do: compare answers against a 16-bit KV cache (`--kv-cache-dtype auto`) on your
    evaluation set; if quality drops, serve a checkpoint that carries calibrated k/v scales
    (SGLang can also read a scales file: `--quantization-param-path`), or keep the KV cache in
    16 bits at the capacity the remedy projects.
    """
    lines = kb.of(F.KVScaleDefault, role=None)
    if not lines:
        return
    dtype = kb.get("kv_pool", "dtype")
    if dtype is not None and dtype.known and element_size(dtype.value) != 1:
        return  # the pool is not fp8 (a projection back to 16 bits): no scales to miss
    if _config_has_kv_scales(kb):
        return
    named = next((line.dtype for line in lines if line.dtype), None)
    stored = next((f" ({name})" for name in (dtype.value if dtype is not None and dtype.known else None, named)
                   if name and name.lower() != "fp8"), "")
    # DeepSeek-V4's compressed pool admits no 16-bit KV cache: only scales can help there
    sixteen = kb.first(F.DSV4MemoryCalculation, role=None) is None
    scales_file = "" if is_vllm(kb) else " (or give SGLang a scales file: --quantization-param-path)"
    yield Parts((lines[0], *((dtype,) if dtype is not None and dtype.known else ())),
                title="The fp8 KV cache runs with uncalibrated scales (1.0)",
                message=f"The KV cache is stored in fp8{stored} with its scales at 1.0: the checkpoint provides no "
                        f"k/v scales ({line_ref(lines[0])}). Keys and values are cast as they are (e4m3: 3 mantissa "
                        f"bits, saturating beyond ±448), which costs some models accuracy.",
                action=("Compare answers against a 16-bit KV cache (--kv-cache-dtype auto) on your evaluation set; "
                        if sixteen else "Check answer quality on your evaluation set; ")
                + f"if quality drops, serve a checkpoint with calibrated k/v scales{scales_file}.",
                detail={"dtype": named})
