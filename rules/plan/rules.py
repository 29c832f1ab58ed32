"""The pre-deploy worksheet (`capdiag plan`): will this model fit, on which GPUs, with how many
concurrent requests — before any log exists. Every bucket is per GPU and says how it was
computed; the estimates (activation, framework reserve) say they are estimates.

    weights      = parameters × bytes per weight / 2^30, ÷ TP per GPU
    KV per token = max(1, KV heads // TP) × (head_dim + v_head_dim) × layers × bytes (MLA: the latent)
    KV cache     = Σ workload tokens × KV per token per rank
    activation   = estimate: 1 GiB + 8192 prefill tokens × hidden × 2 B × 10 (intermediate buffers)
    framework    = estimate: 1 GiB CUDA context and allocator, + 0.5 GiB NCCL when TP > 1
    headroom     = the requested share (default 15%) of usable memory
    usable       = the GPU's measured total (references, --gpu-total-gib) × the static fraction
"""
from __future__ import annotations

import math
from typing import Optional

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules.derive.weights_theory import parameter_count
from capdiag.vocabulary import GIB, element_size, kv_cell

BYTES_PER_WEIGHT = {"bf16": 2, "fp16": 2, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1, "int4": 0.5, "fp4": 0.5}
# mixed-precision AdamW: 18 B per parameter in all (bf16 weights 2, fp32 gradients 4, fp32 master weights 4,
# two fp32 moments 8); the weights bucket holds the first 2 B, the training state the other 16
TRAINING_BYTES = {"full": 18}
LORA_TRAINABLE = 0.01  # LoRA adapters hold about 1% of the parameters (rank-16 style)
PREFILL_TOKENS = 8192
TP_CHOICES = (1, 2, 4, 8, 16, 32)


def _bucket(rule_name, name, gib, premises, formula, estimate=False):
    return Derived("plan", name, round(gib, 2) if isinstance(gib, (int, float)) else gib, rule_name,
                   tuple(p for p in premises if p is not None), formula, {"estimate": estimate})


def _request(kb) -> Optional[F.PlanRequest]:
    return kb.first(F.PlanRequest, role=None)


def _tp(req: F.PlanRequest) -> int:
    return req.tp or req.gpus or 1


@rule("plan.parameters",
      reads=(F.PlanRequest, F.ModelConfig),
      concludes=("plan:parameters",))
def parameters(kb):
    """What it concludes: `plan.parameters`: the model's parameter count.

    How: `--params` (e.g. 70B), else counted from config.json.

    Example: `--params 70B`: 70 × 10^9."""
    req, model = _request(kb), kb.first(F.ModelConfig, role=None)
    if req is None:
        return
    if req.params:
        yield Derived("plan", "parameters", req.params, "plan.parameters", (req,), f"--params {req.params / 1e9:g}B")
    elif model is not None:
        count, how = parameter_count(model.fields)
        yield Derived("plan", "parameters", count if count else Unknown(how), "plan.parameters", (model,),
                      f"counted from config.json: {how}" if count else "")
    else:
        yield Derived("plan", "parameters", Unknown("give --params or --config-json"), "plan.parameters", (req,))


@rule("plan.weights",
      reads=(F.PlanRequest, F.ModelWeights, "plan:parameters"),
      concludes=("plan:weights",))
def weights(kb):
    """What it concludes: `plan.weights`: the GiB of weights each GPU holds.

    How: The checkpoint's own bytes (`metadata.total_size` of its safetensors index, with `--model`
    and no `--weight-dtype`), else parameters × bytes per weight (bf16/fp16 2, fp8/int8 1, int4 0.5
    plus its quantization scales, not counted) / 2^30; split over TP.

    Example: 70B parameters in bf16 over TP 8: 70 × 10^9 × 2 B / 2^30 / 8 = 16.30 GiB per GPU."""
    req, params = _request(kb), kb.get("plan", "parameters")
    stored = kb.first(F.ModelWeights, role=None)
    if req is not None and req.weights_as_stored and stored is not None:
        total = stored.total_bytes / GIB
        yield _bucket("plan.weights", "weights", total / _tp(req), (req, stored),
                      f"checkpoint {stored.total_bytes:,} B = {total:.1f} GiB (safetensors index total_size); "
                      f"÷ TP {_tp(req)}")
        return
    if req is None or params is None:
        return
    per = BYTES_PER_WEIGHT.get(req.weight_dtype.lower())
    if not params.known or per is None:
        yield _bucket("plan.weights", "weights", Unknown(params.value.reason if not params.known else
                                         f"unknown weight dtype {req.weight_dtype!r}"), (req, params), "")
        return
    total = params.value * per / GIB
    note = " (+ int4 quantization scales, not counted)" if per == 0.5 else ""
    yield _bucket("plan.weights", "weights", total / _tp(req), (req, params),
                  f"{params.value / 1e9:g} B × {per:g} B = {total:.1f} GiB{note}; ÷ TP {_tp(req)}")


@rule("plan.kv-per-token",
      reads=(F.PlanRequest, F.ModelConfig),
      concludes=("plan:kv_per_token",))
def kv_per_token(kb):
    """What it concludes: `plan.kv_per_token`: the KV bytes one token takes on each GPU.

    How: from config.json, the cell the log rules compute too (capdiag.vocabulary.kv_cell): KV heads
    on the rank (max(1, heads // TP)) × (head_dim + v_head_dim) × full-attention layers × bytes of
    the KV dtype; MLA: (kv_lora_rank + qk_rope_head_dim) × layers × bytes on every rank.

    Example: Llama-3.1-70B at TP 8: max(1, 8 // 8) × (128 + 128) × 80 layers × 2 B = 40960 B."""
    req, model = _request(kb), kb.first(F.ModelConfig, role=None)
    if req is None:
        return
    elem = element_size(req.kv_dtype)
    if model is None or elem is None:
        yield Derived("plan", "kv_per_token", Unknown("needs --config-json for the KV shape" if model is None
                                                      else f"unknown KV dtype {req.kv_dtype!r}"), "plan.kv-per-token",
                      (req,))
        return
    cell = kv_cell(model.fields, elem, _tp(req))
    if cell is None:
        yield Derived("plan", "kv_per_token", Unknown("config.json lacks the attention shape (num_attention_heads, "
                                                      "and head_dim or hidden_size)"), "plan.kv-per-token", (req, model))
        return
    yield Derived("plan", "kv_per_token", cell.bytes, "plan.kv-per-token", (req, model),
                  f"{cell.formula} = {cell.bytes:,} B ({cell.bytes / (1 << 20):.4f} MiB) per token per GPU")


@rule("plan.usable",
      reads=(F.PlanRequest, "gpu:total_gib"),
      concludes=("plan:usable",))
def usable(kb):
    """What it concludes: `plan.usable`: the GiB of each GPU the framework may use.

    How: The measured total (`--gpu-total-gib`, else the reference's nvidia-smi total for `--gpu`) ×
    the framework's static fraction (SGLang mem_fraction_static, vLLM gpu_memory_utilization;
    default 0.9).

    Example: `--gpu h100_sxm` (79.65 GiB measured) × 0.9 ≈ 71.7 GiB."""
    req, total = _request(kb), kb.get("gpu", "total_gib")
    if req is None or total is None:
        return
    if not total.known:
        yield Derived("plan", "usable", Unknown(total.value.reason), "plan.usable", (total,))
        return
    fraction = req.fraction if req.fraction is not None else 0.9
    yield Derived("plan", "usable", round(total.value * fraction, 2), "plan.usable", (req, total),
                  f"GPU total {total.value} GiB ({total.formula}) × fraction {fraction}"
                  + ("" if req.fraction is not None else " (default; give --fraction)"))


@rule("plan.buckets",
      reads=(F.PlanRequest, F.ModelConfig, "plan:kv_per_token", "plan:usable", "plan:parameters"),
      concludes=("plan:kv_cache", "plan:activation", "plan:framework", "plan:headroom", "plan:training_state"))
def buckets(kb):
    """What it concludes: `plan.kv_cache`, `plan.activation`, `plan.framework`, `plan.headroom` and
    `plan.training_state`: the other buckets per GPU.

    How: KV cache for the workload, activation and framework estimates, and headroom (a share of
    usable memory); with `--training`, the optimizer state.

    Example: `--workload 8192x16` at 40960 B per token: 16 × 8192 × 40960 B = 5.00 GiB of KV per
    GPU."""
    req, model = _request(kb), kb.first(F.ModelConfig, role=None)
    per_token, usable_d = kb.get("plan", "kv_per_token"), kb.get("plan", "usable")
    if req is None or per_token is None or usable_d is None:
        return
    tokens = sum(ctx * count for ctx, count in req.workloads)
    if req.workloads:
        if per_token.known:
            yield _bucket("plan.buckets", "kv_cache", tokens * per_token.value / GIB, (req, per_token),
                          " + ".join(f"{count} × {ctx:,}" for ctx, count in req.workloads)
                          + f" = {tokens:,} tokens × {per_token.value:,} B")
        else:
            yield _bucket("plan.buckets", "kv_cache", Unknown(per_token.value.reason), (req, per_token), "")
    hidden = model.fields.get("hidden_size") if model is not None else None
    act = 1.0 + (PREFILL_TOKENS * hidden * 2 * 10 / GIB if hidden else 1.0)
    yield _bucket("plan.buckets", "activation", act, (req, model),
                  f"estimate: 1 GiB + {PREFILL_TOKENS} prefill tokens × hidden {hidden} × 2 B × 10" if hidden
                  else "estimate: 2 GiB (no hidden size known)", estimate=True)
    yield _bucket("plan.buckets", "framework", 1.0 + (0.5 if _tp(req) > 1 else 0.0), (req,),
                  "estimate: 1 GiB CUDA context and allocator" + (" + 0.5 GiB NCCL" if _tp(req) > 1 else ""),
                  estimate=True)
    if usable_d.known:
        yield _bucket("plan.buckets", "headroom", usable_d.value * req.headroom, (req, usable_d),
                      f"{req.headroom:.0%} of usable {usable_d.value} GiB")
    params = kb.get("plan", "parameters")
    if req.training and params is not None and params.known:
        per_weight = BYTES_PER_WEIGHT.get(req.weight_dtype.lower(), 2)
        if req.training == "full":
            state = params.value * (TRAINING_BYTES["full"] - per_weight) / GIB
            formula = (f"{params.value / 1e9:g} B × {TRAINING_BYTES['full'] - per_weight:g} B (fp32 gradients, master "
                       f"weights and two Adam moments; with the weights, {TRAINING_BYTES['full']} B per parameter = "
                       f"{params.value * TRAINING_BYTES['full'] / GIB:,.1f} GiB in all)")
        else:
            state = params.value * LORA_TRAINABLE * TRAINING_BYTES["full"] / GIB
            formula = (f"LoRA adapters ≈ {LORA_TRAINABLE:.0%} of {params.value / 1e9:g} B parameters × "
                       f"{TRAINING_BYTES['full']} B (frozen weights are in the weights bucket)")
        yield _bucket("plan.buckets", "training_state", state / _tp(req), (req, params),
                      f"{formula}; ÷ {_tp(req)} GPUs (sharded); activations depend on batch and sequence length and "
                      "are not included")


@rule("plan.verdict",
      reads=(F.PlanRequest, F.ModelConfig, "plan"),
      concludes=("plan:verdict",))
def verdict(kb):
    """What it concludes: `plan.verdict`: whether the model fits, at which TP, and how many requests at
    each context.

    How: fits / fits at TP=N / does not fit: the per-GPU buckets against usable memory; the smallest
    TP (1, 2, 4, … up to the GPUs given) that fits; and the most concurrent requests at each context
    that the memory left after weights, activation, framework and headroom holds.

    Example: weights 16.30 + KV 5.00 GiB + the estimates and headroom within 71.7 GiB usable: fits."""
    req = _request(kb)
    usable_d, per_token, weights_d = kb.get("plan", "usable"), kb.get("plan", "kv_per_token"), \
        kb.get("plan", "weights")
    if req is None or usable_d is None or weights_d is None or per_token is None:
        return
    rows = [d for d in kb.topic("plan") if d.key in ("weights", "kv_cache", "activation", "framework", "headroom",
                                                      "training_state")]
    if not usable_d.known or any(not d.known for d in rows):
        missing = [d.key for d in rows if not d.known] + ([] if usable_d.known else ["usable"])
        yield Derived("plan", "verdict", Unknown("cannot size: " + ", ".join(missing) + " unknown"), "plan.verdict",
                      tuple(rows) + (usable_d,))
        return
    tp = _tp(req)
    need = sum(d.value for d in rows)
    fixed = need - weights_d.value - sum(d.value for d in rows if d.key in ("kv_cache", "training_state"))
    limit = req.gpus or max(TP_CHOICES)
    min_tp = None
    for candidate in (t for t in TP_CHOICES if t <= limit):
        weights_c = weights_d.value * tp / candidate
        state = sum(d.value for d in rows if d.key == "training_state") * tp / candidate
        kv_c = sum(d.value for d in rows if d.key == "kv_cache") * (tp / candidate if per_token.known and
                                                                        kb.first(F.ModelConfig, role=None) else 1)
        if weights_c + state + kv_c + fixed <= usable_d.value:
            min_tp = candidate
            break
    status = "fits" if need <= usable_d.value else (f"fits at TP={min_tp}" if min_tp else "does not fit")
    at = tp if need <= usable_d.value else (min_tp or tp)
    state = sum(d.value for d in rows if d.key == "training_state") * tp / at
    left = usable_d.value - weights_d.value * tp / at - fixed - state
    cell = per_token.value * tp / at if per_token.known else None  # KV heads per rank shrink with TP (approx.)
    concurrency = []
    if cell and not req.training:
        for ctx in sorted(set(req.contexts) | {c for c, _ in req.workloads}):
            concurrency.append({"context": ctx, "requests": max(0, math.floor(left * GIB / (ctx * cell)))})
    yield Derived("plan", "verdict", {"verdict": status, "min_tp": min_tp, "need_gib": round(need, 2),
                                      "max_concurrency": concurrency, "at_tp": at}, "plan.verdict",
                  tuple(rows) + (usable_d,),
                  f"need {need:.2f} GiB per GPU at TP {tp} vs usable {usable_d.value} GiB: {status}"
                  + (f"; smallest TP that fits: {min_tp}" if min_tp else "")
                  + (f"; at TP {at}, {left:.2f} GiB per GPU is left for KV after weights and reserves" if left > 0
                     else ""))
