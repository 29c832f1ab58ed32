"""`capdiag plan`: the worksheet's inputs → facts → the plan rules → a plan report (data).

With `--from-log`, the worksheet is filled from a real start-up (its TP, dtypes and model)
and set beside what that log measured, with the error of each prediction.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from capdiag import facts as F
from capdiag.analysis import Analysis
from capdiag.engine import Knowledge, Unknown, run
from capdiag.errors import InputError
from capdiag.gpus import gpu_input_facts
from capdiag.parsing.model_config import read_model_config
from capdiag.rules import PLAN
from capdiag.rules.kv_theory import element_size

BUCKETS = ("weights", "kv_cache", "activation", "framework", "headroom", "training_state")
SCHEMA = "capdiag.plan/1"


MAX_PARAMS = 1e15


def parse_params(text: Optional[str]) -> Optional[float]:
    """`70B`, `7.5b`, `405e9`, `1.2T` → a parameter count."""
    if text is None:
        return None
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
    raw = text.strip().lower()
    try:
        count = float(raw[:-1]) * scale[raw[-1]] if raw[-1] in scale else float(raw)
    except (ValueError, IndexError):
        count = math.nan
    if not 1 <= count <= MAX_PARAMS:  # also refuses nan
        raise InputError(f"--params {text}: use a positive count like 70B, 7.5B or 405e9 (at most 1000T)")
    return count


def parse_workload(text: str) -> tuple[int, int]:
    """`8192x16` → (8192 tokens, 16 requests)."""
    ctx, sep, count = text.lower().replace("k", "000").partition("x")
    try:
        pair = (int(ctx), int(count))
    except ValueError:
        pair = (0, 0)
    if not sep or min(pair) <= 0:
        raise InputError(f"--workload {text}: use CONTEXTxCOUNT, e.g. 8192x16")
    return pair


def plan(request: F.PlanRequest, *, config_json: Optional[str] = None, gpu: Optional[str] = None,
         gpu_total_gib: Optional[float] = None) -> dict[str, Any]:
    facts: list[F.Fact] = [request]
    if config_json is not None:
        facts.append(read_model_config(config_json))
    if element_size(request.kv_dtype) is None:
        raise InputError(f"--kv-dtype {request.kv_dtype}: bf16, fp16 or fp8")
    facts.extend(gpu_input_facts(gpu, gpu_total_gib, ()))
    kb = Knowledge(tuple(facts))
    run(PLAN, kb)
    return build_plan(kb, request)


def build_plan(kb: Knowledge, request: F.PlanRequest) -> dict[str, Any]:
    def value(key):
        d = kb.get("plan", key)
        return d.value if d is not None and d.known else None

    def derivation(d):
        return d.formula if d.known else d.value.reason

    verdict = kb.get("plan", "verdict")
    total = kb.get("gpu", "total_gib")
    return {
        "schema": SCHEMA,
        "inputs": {"params": request.params, "weight_dtype": request.weight_dtype, "kv_dtype": request.kv_dtype,
                   "workloads": [{"context": c, "requests": n} for c, n in request.workloads],
                   "contexts": list(request.contexts), "gpus": request.gpus, "tp": request.tp or request.gpus or 1,
                   "framework": request.framework, "fraction": request.fraction, "headroom": request.headroom,
                   "training": request.training},
        "parameters": value("parameters"),
        "kv_bytes_per_token": value("kv_per_token"),
        "kv_derivation": derivation(kb.get("plan", "kv_per_token")) if kb.get("plan", "kv_per_token") else None,
        "gpu": {"total_gib": total.value if total is not None and total.known else None,
                "derivation": derivation(total) if total is not None else None},
        "buckets": [{"bucket": key, "gib": value(key), "estimate": kb.get("plan", key).detail.get("estimate", False),
                     "derivation": derivation(kb.get("plan", key))}
                    for key in BUCKETS if kb.get("plan", key) is not None],
        "usable_gib_per_gpu": value("usable"),
        "usable_derivation": derivation(kb.get("plan", "usable")) if kb.get("plan", "usable") else None,
        "verdict": verdict.value["verdict"] if verdict is not None and verdict.known else None,
        "verdict_derivation": derivation(verdict) if verdict is not None else None,
        "min_tp": verdict.value["min_tp"] if verdict is not None and verdict.known else None,
        "need_gib_per_gpu": verdict.value["need_gib"] if verdict is not None and verdict.known else None,
        "max_concurrency": verdict.value["max_concurrency"] if verdict is not None and verdict.known else [],
        "concurrency_at_tp": verdict.value["at_tp"] if verdict is not None and verdict.known else None,
        "totals": _totals(kb, request),
        "from_log": None,
    }


def _totals(kb: Knowledge, request: F.PlanRequest) -> dict[str, Any]:
    """Whole-model figures (all GPUs together), as the worksheet publishes them."""
    from capdiag.rules.plan import BYTES_PER_WEIGHT, TRAINING_BYTES

    params = kb.get("plan", "parameters")
    per_token = kb.get("plan", "kv_per_token")
    tp = request.tp or request.gpus or 1
    out: dict[str, Any] = {}
    if params is not None and params.known:
        out["weights_gib"] = round(params.value * BYTES_PER_WEIGHT.get(request.weight_dtype.lower(), 2) / (1 << 30), 2)
        if request.training == "full":
            out["training_gib"] = round(params.value * TRAINING_BYTES["full"] / (1 << 30), 2)
    if per_token is not None and per_token.known:
        model = kb.first(F.ModelConfig, role=None)
        heads = model.fields.get("num_key_value_heads") or model.fields.get("num_attention_heads")
        replicas = max(1, tp // heads) if heads and not model.fields.get("kv_lora_rank") else tp
        whole = per_token.value * tp / replicas  # one copy of each head
        out["kv_bytes_per_token"] = whole
        tokens = sum(c * n for c, n in request.workloads)
        if tokens:
            out["kv_cache_gib"] = round(tokens * whole / (1 << 30), 2)
    return out


def request_from_log(analysis: Analysis, params: Optional[float]) -> F.PlanRequest:
    """The worksheet's inputs as the log states them: TP, KV dtype, context."""
    kb = analysis.knowledge
    tp = kb.value("config", "tp_size") or 1
    dtype = kb.value("kv_pool", "dtype") or "bf16"
    weight_dtype = "fp8" if str(kb.value("config", "quantization") or "").lower().startswith("fp8") else "bf16"
    return F.PlanRequest(evidence=F.Evidence(F.INPUT_LINE, f"--from-log {analysis.path}", 0, "input"), params=params,
                         weight_dtype=weight_dtype, kv_dtype=str(dtype), tp=tp, gpus=tp, framework=analysis.framework,
                         fraction=kb.value("config", "mem_fraction_static") or kb.value("config", "gpu_memory_utilization"))


def compare_with_log(plan_report: dict[str, Any], analysis: Analysis) -> list[dict[str, Any]]:
    """The worksheet's predictions beside the log's measurements, with the error of each."""
    kb = analysis.knowledge
    rows = []

    def add(what, predicted, measured, unit, note=""):
        error = None
        if isinstance(predicted, (int, float)) and isinstance(measured, (int, float)) and measured:
            error = round(100 * (predicted - measured) / measured, 1)
        rows.append({"quantity": what, "predicted": predicted, "measured": measured, "unit": unit,
                     "error_percent": error, "note": note})

    bucket = {b["bucket"]: b["gib"] for b in plan_report["buckets"]}
    add("weights per GPU", bucket.get("weights"), kb.value("breakdown", "weights"), "GiB")
    add("KV bytes per token per GPU", plan_report["kv_bytes_per_token"], kb.value("kv_pool", "bytes_per_token"), "B",
        "the log's figure carries printed rounding and a padding page")
    tokens = kb.value("kv_pool", "tokens")
    per_token = plan_report["kv_bytes_per_token"]
    predicted_pool = round(tokens * per_token / (1 << 30), 2) if tokens and per_token else None
    add("KV pool for the log's tokens", predicted_pool, kb.value("breakdown", "kv_cache"), "GiB",
        f"{tokens:,} tokens × predicted bytes per token" if tokens else "")
    add("CUDA graphs", None, kb.value("breakdown", "cuda_graph"), "GiB",
        "the worksheet does not predict graphs: they sit in its activation estimate")
    return rows
