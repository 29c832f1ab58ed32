"""What the weights should weigh per rank, from config.json, beside what the log measured: the
memory model's count (capdiag.memory.shape and .weights, the one `plan` runs) — every layer's
parameter groups with their TP split, in the checkpoint's quantization, the modules it leaves
unconverted in the model dtype. PP gives each stage its share of the layers.
"""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.memory.shape import model_shape
from capdiag.memory.weights import model_dtype_bytes, quantization, weight_bytes

TOLERANCE = 0.15  # within ±15% the measured weights agree with the estimate


@rule("weights.theoretical",
      reads=(F.ModelConfig, "breakdown:weights", "config:tp_size", "config:pp_size"),
      concludes=("weights:theoretical_gib",))
def theoretical(kb):
    """What it concludes: `weights.theoretical_gib`: the weights each rank should hold, from
    config.json, against the measured row.

    How: Expected weights per rank from config.json (the memory model's count: each parameter group
    split as TP splits it, in the checkpoint's quantization) ÷ PP, against the measured `weights`
    row. Within ±15% they agree; beyond, the report lists what usually explains it (a vision tower or MTP/draft layers the count leaves out, layers kept
    unquantized, experts not sharded by TP) — or says it is unexplained.

    Example: 8.03 B parameters × 2 B (bfloat16) / 1 rank = 14.96 GiB; measured 14.99 GiB: agrees."""
    model = kb.first(F.ModelConfig, role=None)
    if model is None:
        return
    shape, how = model_shape(model.fields)
    quant, what = quantization(model.fields, None)
    measured = kb.get("breakdown", "weights")
    tp, pp = kb.value("config", "tp_size"), kb.value("config", "pp_size")
    unsized = quant is None and what.startswith(("quantization", "compressed", "bitsandbytes", "awq", "gptq"))
    if shape is None or unsized or not isinstance(tp, int) or not isinstance(pp, int):
        # a rank holds its share of the layers: no PP size of 1 is assumed where none is stated
        reason = how if shape is None else what if unsized else "needs the log's tp_size and pp_size"
        yield Derived("weights", "theoretical_gib", Unknown(reason), "weights.theoretical", (model,))
        return
    dtype_bytes, dtype_how = model_dtype_bytes(model.fields, None)
    counted = weight_bytes(shape, tp, quant, dtype_bytes)
    value = round(counted.gib / pp, 2)
    formula = (f"{shape.parameters / 1e9:.2f} B parameters ({how}): {counted.formula}"
               + (f" ÷ {pp} PP stages" if pp > 1 else "") + f" ({what}; unconverted at {dtype_how})")
    detail = {"parameters": shape.parameters}
    if measured is not None and measured.known and measured.value:
        ratio = measured.value / value
        detail["ratio"] = round(ratio, 3)
        formula += (f"; measured {measured.value} GiB ({ratio:.2f}×): "
                    + ("agrees" if abs(ratio - 1) <= TOLERANCE else
                       "more than expected — a vision tower, MTP/draft layers, unquantized layers, or experts "
                       "replicated rather than sharded" if ratio > 1 else
                       "less than expected — experts sharded by EP beyond TP, or layers the checkpoint omits"))
    yield Derived("weights", "theoretical_gib", value, "weights.theoretical",
                  (model,) + ((measured,) if measured is not None else ()), formula, detail)
