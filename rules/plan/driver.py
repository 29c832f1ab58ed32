"""`capdiag plan`: the worksheet's inputs → facts → the plan rules → a plan report (data).

With `--from-log`, the worksheet is filled from a real start-up (its TP, dtypes and model)
and set beside what that log measured, with the error of each prediction. The driver is handed
what it runs on (the plan rule set, the analysed log's knowledge): rules never reach back into
the analysis or the report that are built on them.
"""
from __future__ import annotations

from typing import Any, Optional

import attrs

from capdiag import facts as F
from capdiag.engine import Knowledge, Rule, run
from capdiag.errors import InputError
from capdiag.gpus import gpu_input_facts
from capdiag.parsing.model_config import read_model_config
from capdiag.rules.plan.rules import BYTES_PER_WEIGHT
from capdiag.vocabulary import GIB, element_size, kv_cell

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
        raise InputError(f"--params {text}: use a count like 70B, 7.5B or 405e9") from None
    if not 0 < count <= MAX_PARAMS:  # also refuses nan and inf
        raise InputError(f"--params {text}: a positive count like 70B, 7.5B or 405e9 (at most 1000T)")
    if raw[-1] not in scale and count < MIN_BARE_PARAMS:
        mantissa, exponent = f"{count * 1e9:e}".split("e")
        raise InputError(f"--params {text}: a bare number counts single parameters; for {text} billion write "
                         f"{text}B or {mantissa.rstrip('0').rstrip('.')}e{int(exponent)}")
    return count


MIN_BARE_PARAMS = 1e6  # a bare --params below this is a count in billions written without its B


def shape_config(layers: Optional[int], kv_heads: Optional[int], head_dim: Optional[int],
                 hidden: Optional[int]) -> Optional[F.ModelConfig]:
    """The shape given on the command line (`--layers --kv-heads --head-dim`, and `--hidden` for
    the activation estimate) as the fact a config.json would give; None when none is given."""
    given = {"--layers": layers, "--kv-heads": kv_heads, "--head-dim": head_dim, "--hidden": hidden}
    if all(v is None for v in given.values()):
        return None
    missing = [k for k in ("--layers", "--kv-heads", "--head-dim") if given[k] is None]
    if missing:
        raise InputError(f"sizing the KV cache without a config.json needs {', '.join(missing)}")
    fields = {"num_hidden_layers": layers, "num_key_value_heads": kv_heads, "head_dim": head_dim}
    if hidden is not None:
        fields["hidden_size"] = hidden
    text = " ".join(f"{k} {v}" for k, v in given.items() if v is not None)
    return F.ModelConfig(evidence=F.Evidence(F.INPUT_LINE, text, 0, "input"), fields=fields)


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


def plan(rules: tuple[Rule, ...], request: F.PlanRequest, *, config_json: Optional[str] = None, gpu: Optional[str] = None,
         gpu_total_gib: Optional[float] = None, model: Optional[F.ModelConfig] = None,
         weights: Optional[F.ModelWeights] = None) -> dict[str, Any]:
    """The worksheet for `request`, by the plan `rules`; the model's shape from `config_json` (a path) or `model`
    (from the Hub or the command line), its checkpoint's bytes from `weights`. When the
    deployment does not fit, the nearest ones that do (more GPUs, smaller weight or KV dtype)."""
    inputs: list[F.Fact] = [f for f in (model, weights) if f is not None]
    if config_json is not None:
        inputs.append(read_model_config(config_json))
    if element_size(request.kv_dtype) is None:
        raise InputError(f"--kv-dtype {request.kv_dtype}: bf16, fp16 or fp8")
    inputs.extend(gpu_input_facts(gpu, gpu_total_gib, ()))
    kb = _worksheet(rules, request, inputs)
    report = build_plan(kb, request)
    report["fitting_alternatives"] = (_alternatives(rules, request, inputs, kb) if report["verdict"] == "does not fit"
                                      else [])
    return report


def _worksheet(rules: tuple[Rule, ...], request: F.PlanRequest, inputs: list[F.Fact]) -> Knowledge:
    kb = Knowledge((request, *inputs))
    run(rules, kb)
    return kb


# what "does not fit" tries instead: more GPUs (TP), then a smaller weight dtype, then fp8 KV
ALTERNATIVE_WEIGHT_DTYPES = ("fp8", "int4")
ALTERNATIVE_KV_DTYPES = ("fp8",)
MAX_ALTERNATIVES = 5


def _alternatives(rules: tuple[Rule, ...], request: F.PlanRequest, inputs: list[F.Fact], kb: Knowledge) -> list[dict[str, Any]]:
    """The nearest deployments that fit: for each weight and KV dtype (the request's, or a
    smaller one), the fewest GPUs (TP) that fit — a TP the model's attention heads divide, when
    they are known; fewest changes first, then fewest GPUs. A weight dtype is only tried when
    the weights are sized from parameters (a checkpoint's stored bytes hold one dtype)."""
    from capdiag.rules.plan.rules import TP_CHOICES

    params_known = kb.value("plan", "parameters") is not None
    weight_dtypes = (request.weight_dtype,) + tuple(
        d for d in ALTERNATIVE_WEIGHT_DTYPES if params_known and not request.weights_as_stored
        and BYTES_PER_WEIGHT[d] < BYTES_PER_WEIGHT.get(request.weight_dtype.lower(), 2))
    kv_dtypes = (request.kv_dtype,) + tuple(d for d in ALTERNATIVE_KV_DTYPES
                                            if element_size(d) < element_size(request.kv_dtype))
    model = kb.first(F.ModelConfig, role=None)
    heads = model.fields.get("num_attention_heads") if model is not None else None
    tp = request.tp or request.gpus or 1
    found = []
    for weight_dtype in weight_dtypes:
        for kv_dtype in kv_dtypes:
            for candidate_tp in (t for t in TP_CHOICES if t >= tp and (not heads or heads % t == 0)):
                changes = [f"{what} {old} → {new}" for what, old, new in
                           (("GPUs (TP)", tp, candidate_tp), ("weight dtype", request.weight_dtype, weight_dtype),
                            ("KV dtype", request.kv_dtype, kv_dtype)) if old != new]
                trial = attrs.evolve(request, tp=candidate_tp, gpus=max(candidate_tp, request.gpus or 1),
                                     weight_dtype=weight_dtype, kv_dtype=kv_dtype)
                verdict = _worksheet(rules, trial, inputs).get("plan", "verdict")
                if changes and verdict is not None and verdict.known and verdict.value["verdict"] == "fits":
                    found.append({"tp": candidate_tp, "gpus": trial.gpus, "weight_dtype": weight_dtype,
                                  "kv_dtype": kv_dtype, "need_gib_per_gpu": verdict.value["need_gib"],
                                  "changes": changes})
                    break  # more GPUs fit too; the fewest is the nearest
    found.sort(key=lambda a: (len(a["changes"]), a["gpus"]))
    return found[:MAX_ALTERNATIVES]


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
                   "training": request.training, "weights_as_stored": request.weights_as_stored},
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
    from capdiag.rules.plan.rules import TRAINING_BYTES

    params = kb.get("plan", "parameters")
    per_token = kb.get("plan", "kv_per_token")
    tp = request.tp or request.gpus or 1
    out: dict[str, Any] = {}
    stored = kb.first(F.ModelWeights, role=None)
    if request.weights_as_stored and stored is not None:
        out["weights_gib"] = round(stored.total_bytes / GIB, 2)
    elif params is not None and params.known:
        out["weights_gib"] = round(params.value * BYTES_PER_WEIGHT.get(request.weight_dtype.lower(), 2) / GIB, 2)
        if request.training == "full":
            out["training_gib"] = round(params.value * TRAINING_BYTES["full"] / GIB, 2)
    if per_token is not None and per_token.known:
        cell = kv_cell(kb.first(F.ModelConfig, role=None).fields, 1, tp)
        replicas = cell.replication if cell.attention == "mha" else tp  # MLA: every rank holds the whole latent
        whole = per_token.value * tp / replicas  # one copy of each head
        out["kv_bytes_per_token"] = whole
        tokens = sum(c * n for c, n in request.workloads)
        if tokens:
            out["kv_cache_gib"] = round(tokens * whole / GIB, 2)
    return out


def request_from_log(kb: Knowledge, log: str, framework: str, params: Optional[float]) -> F.PlanRequest:
    """The worksheet's inputs as the log states them (`kb`, the analysis of `log`): TP, KV dtype,
    context."""
    tp = kb.value("config", "tp_size") or 1
    dtype = kb.value("kv_pool", "dtype") or "bf16"
    weight_dtype = "fp8" if str(kb.value("config", "quantization") or "").lower().startswith("fp8") else "bf16"
    return F.PlanRequest(evidence=F.Evidence(F.INPUT_LINE, f"--from-log {log}", 0, "input"), params=params,
                         weight_dtype=weight_dtype, kv_dtype=str(dtype), tp=tp, gpus=tp, framework=framework,
                         fraction=kb.value("config", "mem_fraction_static") or kb.value("config", "gpu_memory_utilization"))


def compare_with_log(plan_report: dict[str, Any], kb: Knowledge) -> list[dict[str, Any]]:
    """The worksheet's predictions beside the log's measurements (`kb`, its analysis), with the
    error of each."""
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
    predicted_pool = round(tokens * per_token / GIB, 2) if tokens and per_token else None
    add("KV pool for the log's tokens", predicted_pool, kb.value("breakdown", "kv_cache"), "GiB",
        f"{tokens:,} tokens × predicted bytes per token" if tokens else "")
    add("CUDA graphs", None, kb.value("breakdown", "cuda_graph"), "GiB",
        "the worksheet does not predict graphs: they sit in its activation estimate")
    return rows
