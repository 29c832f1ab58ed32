"""`capdiag plan`: the plan's inputs → facts → the plan rules → a plan report (data).

When the deployment does not fit, each candidate change (more GPUs, quantized weights, an fp8
KV cache, a larger fraction, a shorter context) is planned again through the same rules, and
only the changes whose plan fits are offered, with the figures of that plan. With `--from-log`,
the plan is filled from a real start-up's settings and set beside what that log measured. The
driver is handed what it runs on (the plan rule set, the analysed log's knowledge): rules never
reach back into the analysis or the report that are built on them.
"""
from __future__ import annotations

from typing import Any, Optional

import attrs

from capdiag import facts as F
from capdiag.engine import Knowledge, Rule, run
from capdiag.errors import InputError
from capdiag.gpus import gpu_input_facts
from capdiag.parsing.model_config import read_model_config
from capdiag.rules.plan.rules import TP_CHOICES, tp_of
from capdiag.vocabulary import GIB, element_size

SCHEMA = "capdiag.plan/2"
MAX_PARAMS = 1e15
MIN_BARE_PARAMS = 1e6  # a bare --params below this is a count in billions written without its B
MAX_FRACTION = 0.95  # the largest fraction a remedy proposes: above it, nothing is left for activations


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


def shape_config(layers: Optional[int], kv_heads: Optional[int], head_dim: Optional[int],
                 hidden: Optional[int]) -> Optional[F.ModelConfig]:
    """The shape given on the command line (`--layers --kv-heads --head-dim`, and `--hidden`) as
    the fact a config.json would give; None when none is given."""
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
    """The plan for `request`, by the plan `rules`; the model's shape from `config_json` (a path)
    or `model` (from the Hub or the command line), its checkpoint's bytes from `weights`."""
    inputs: list[F.Fact] = [f for f in (model, weights) if f is not None]
    if config_json is not None:
        inputs.append(read_model_config(config_json))
    if request.kv_dtype not in (None, "auto") and element_size(request.kv_dtype) is None:
        raise InputError(f"--kv-dtype {request.kv_dtype}: bf16, fp16, fp8 or auto")
    inputs.extend(gpu_input_facts(gpu, gpu_total_gib, ()))
    kb = worksheet(rules, request, inputs)
    report = build_plan(kb, request)
    if report["verdict"] == "does_not_fit" and not request.training:
        report["remedies"] = remedies(rules, request, inputs, kb)
        if not report["remedies"]:
            report["no_remedy"] = _no_remedy(kb, request)
    return report


def worksheet(rules: tuple[Rule, ...], request: F.PlanRequest, inputs: list[F.Fact]) -> Knowledge:
    kb = Knowledge((request, *inputs))
    run(rules, kb)
    return kb


def _value(kb: Knowledge, key: str) -> Any:
    d = kb.get("plan", key)
    return d.value if d is not None and d.known else None


def _verdict(kb: Knowledge) -> dict[str, Any]:
    return _value(kb, "verdict") or {}


def _candidates(request: F.PlanRequest, kb: Knowledge) -> list[tuple[dict[str, Any], F.PlanRequest, str]]:
    """(the change in --what-if keys, the request with it, its wording), least disruptive first:
    a larger fraction, a shorter context, an fp8 KV cache, more GPUs, then quantized weights."""
    out = []
    settings = _value(kb, "settings") or {}
    fraction = settings.get("fraction")
    key = "mem_fraction_static" if request.framework == "sglang" else "gpu_memory_utilization"
    if fraction is not None and fraction < MAX_FRACTION:
        for step in (0.05, 0.1):
            new = round(min(fraction + step, MAX_FRACTION), 2)
            if new > fraction:
                out.append(({key: new}, attrs.evolve(request, fraction=new), f"raise {key} to {new}"))
    context = settings.get("context")
    pool = _value(kb, "pool") or {}
    if request.framework == "vllm" and context and pool.get("concurrency") is not None and pool["concurrency"] < 1:
        shorter = max(256, int(context * pool["concurrency"]) // 256 * 256)
        out.append(({"max_model_len": shorter}, attrs.evolve(request, contexts=(shorter,) + request.contexts[1:]),
                    f"lower max_model_len to {shorter:,}"))
    cells = kb.get("plan", "kv_cells")
    if cells is not None and cells.known and cells.detail.get("element", 1) > 1:
        out.append(({"kv_cache_dtype": "fp8"}, attrs.evolve(request, kv_dtype="fp8"), "store the KV cache in fp8"))
    shape = (kb.get("plan", "shape").detail.get("shape") if kb.get("plan", "shape") is not None
             and kb.get("plan", "shape").known else None)
    tp = tp_of(request)
    for candidate in TP_CHOICES:
        if candidate > tp and (request.gpus is None or candidate <= max(request.gpus, tp) or request.gpus <= tp) \
                and (shape is None or shape.heads % candidate == 0):
            out.append(({"tp_size": candidate}, attrs.evolve(request, tp=candidate, gpus=max(candidate, request.gpus or 1)),
                        f"shard over {candidate} GPUs (TP {candidate})"))
    weights = kb.get("plan", "weights")
    quantized = weights is not None and weights.known and weights.detail.get("quantization")
    if not quantized and not request.weights_as_stored:
        for dtype, what in (("fp8", "fp8 weights"), ("int4", "4-bit weights (AWQ/GPTQ)")):
            out.append(({"quantization": dtype}, attrs.evolve(request, weight_dtype=dtype), f"serve {what}"))
    return out


def remedies(rules: tuple[Rule, ...], request: F.PlanRequest, inputs: list[F.Fact], kb: Knowledge) -> list[dict[str, Any]]:
    """Every candidate change planned again; those whose plan fits, with its figures — at most
    one a kind (the smallest TP, the smallest fraction step that fits)."""
    found, kinds = [], set()
    for changes, trial, text in _candidates(request, kb):
        kind = next(iter(changes))
        if kind in kinds:
            continue
        then = worksheet(rules, trial, inputs)
        verdict = _verdict(then)
        if verdict.get("verdict") != "fits":
            continue
        kinds.add(kind)
        pool = _value(then, "pool") or {}
        found.append({"changes": changes, "text": text,
                      "projected": {"fits": True, "kv_tokens": pool.get("kv_tokens"),
                                    "kv_cache_gib": pool.get("kv_cache_gib"), "budget_gib": _value(then, "budget"),
                                    "max_concurrent": verdict.get("max_concurrent")},
                      "clears": ["plan.verdict"], "introduces": []})
    return found


def _no_remedy(kb: Knowledge, request: F.PlanRequest) -> str:
    weights, device = _value(kb, "weights"), _value(kb, "device")
    if weights and device:
        need = weights * tp_of(request)
        return (f"nothing within reach fits: the weights alone are {need:.1f} GiB over {tp_of(request)} GPU(s) of "
                f"{device} GiB; it takes more or larger GPUs (at least {need / device * 1.1:.1f} GPUs' worth with "
                "room for the KV cache) or a smaller checkpoint")
    return "nothing within reach fits, and the inputs do not say what would"


def _field(d, value=None) -> dict[str, Any]:
    if d is None:
        return {"value": None, "derivation": "not planned"}
    if not d.known:
        return {"value": None, "derivation": d.value.reason}
    return {"value": d.value if value is None else value, "derivation": d.formula}


def build_plan(kb: Knowledge, request: F.PlanRequest) -> dict[str, Any]:
    verdict = kb.get("plan", "verdict")
    pool = kb.get("plan", "pool")
    p = pool.value if pool is not None and pool.known else {}
    settings = kb.get("plan", "settings")
    st = settings.value if settings is not None and settings.known else {}
    budget = kb.get("plan", "budget")
    cells = kb.get("plan", "kv_cells")
    training = kb.get("plan", "training")
    v = verdict.value if verdict is not None and verdict.known else (training.value if training is not None and
                                                                   training.known else {})
    status = v.get("verdict") or "unknown"
    reason = v.get("reason") or (verdict.formula if verdict is not None else training.formula if training else
                                 "cannot plan: " + next((d.value.reason for d in (pool, budget, cells)
                                                        if d is not None and not d.known), "inputs missing"))
    terms = []
    if budget is not None and budget.known:
        for key, value in budget.detail.items():
            terms.append({"term": key[:-4] if key.endswith("_gib") else key, "gib": round(value, 2)})
    if request.training:  # a fine-tune is weights and optimizer state, not a serving pool
        return {"schema": SCHEMA, "inputs": _inputs(request), "verdict": status, "reason": reason,
                "shape": _field(kb.get("plan", "shape")), "parameters": _value(kb, "parameters"), "settings": {},
                "settings_derivation": None,
                "per_gpu": {"total_gib": _field(kb.get("plan", "device")),
                            "weights_gib": {"value": v.get("need_gib", 0) - v.get("state_gib", 0) if v else None,
                                            "derivation": "the parameters' bytes on the GPU"}},
                "terms": [], "request_limit": None, "training": v or None,
                "training_derivation": training.formula if training is not None else None,
                "totals": _totals(kb, request), "remedies": [], "no_remedy": None, "from_log": None}
    per_gpu = {
        "total_gib": _field(kb.get("plan", "device")),
        "weights_gib": _field(kb.get("plan", "weights")),
        "budget_gib": _field(budget),
        "kv_cache_gib": _field(pool, p.get("kv_cache_gib")),
        "kv_tokens": _field(pool, p.get("kv_tokens")),
        "kv_bytes_per_token": _field(cells),
        "max_concurrent": {"value": v.get("max_concurrent"), "context": st.get("context"),
                           "derivation": reason},
    }
    if p.get("state_gib") is not None:
        per_gpu["mamba_state_gib"] = {"value": p["state_gib"], "slots": p.get("state_slots"),
                                      "derivation": pool.formula}
    return {
        "schema": SCHEMA,
        "inputs": _inputs(request),
        "verdict": status,
        "reason": reason,
        "shape": _field(kb.get("plan", "shape")),
        "parameters": _value(kb, "parameters"),
        "settings": {k: val for k, val in st.items() if k != "release"},
        "settings_derivation": settings.formula if settings is not None and settings.known else None,
        "per_gpu": per_gpu,
        "terms": terms,
        "request_limit": p.get("max_running_requests"),
        "training": training.value if training is not None and training.known else None,
        "training_derivation": training.formula if training is not None else None,
        "totals": _totals(kb, request),
        "remedies": [],
        "no_remedy": None,
        "from_log": None,
    }


def _inputs(request: F.PlanRequest) -> dict[str, Any]:
    return {"params": request.params, "weight_dtype": request.weight_dtype, "kv_dtype": request.kv_dtype,
            "workloads": [{"context": c, "requests": n} for c, n in request.workloads],
            "contexts": list(request.contexts), "gpus": request.gpus, "tp": tp_of(request),
            "framework": None if request.training else request.framework, "framework_version": request.version,
            "fraction": request.fraction, "settings": dict(request.settings), "training": request.training,
            "headroom": request.headroom if request.training else None, "weights_as_stored": request.weights_as_stored}


def _totals(kb: Knowledge, request: F.PlanRequest) -> dict[str, Any]:
    """Whole-deployment figures (all GPUs together)."""
    out: dict[str, Any] = {}
    weights = kb.get("plan", "weights")
    if weights is not None and weights.known:
        out["weights_gib"] = round(weights.detail.get("parameter_gib", weights.value) * tp_of(request), 2)
    training = _value(kb, "training")
    if training and training.get("total_gib"):
        out["training_gib"] = training["total_gib"]
    return out


def request_from_log(kb: Knowledge, log: str, framework: str, params: Optional[float]) -> F.PlanRequest:
    """The plan's inputs as the log states them (`kb`, the analysis of `log`): TP, KV dtype,
    fraction, context, version; what the log does not state stays the framework's default."""
    tp = kb.value("config", "tp_size")
    dtype = kb.value("kv_pool", "dtype")
    quant = str(kb.value("config", "quantization") or "").lower()
    weight_dtype = ("fp8" if quant.startswith("fp8") else "int4" if quant.startswith(("awq", "gptq")) or "w4" in quant
                    else "fp4" if "fp4" in quant else None)
    context = kb.value("config", "max_model_len") or kb.value("config", "context_len")
    fraction = kb.value("config", "mem_fraction_static") or kb.value("config", "gpu_memory_utilization")
    return F.PlanRequest(evidence=F.Evidence(F.INPUT_LINE, f"--from-log {log}", 0, "input"), params=params,
                         weight_dtype=weight_dtype, kv_dtype=str(dtype) if dtype and element_size(str(dtype)) else None,
                         tp=tp if isinstance(tp, int) else None, gpus=tp if isinstance(tp, int) else None,
                         framework=framework, fraction=fraction,
                         contexts=(context,) if isinstance(context, int) else (),
                         version=kb.value("config", "framework_version"))


def compare_with_log(plan_report: dict[str, Any], kb: Knowledge) -> list[dict[str, Any]]:
    """The plan's predictions beside the log's measurements (`kb`, its analysis), with the error
    of each: the plan is made from config.json and the settings alone, so these are independent."""
    rows = []

    def add(what, predicted, measured, unit, note=""):
        error = None
        if isinstance(predicted, (int, float)) and isinstance(measured, (int, float)) and measured:
            error = round(100 * (predicted - measured) / measured, 1)
        rows.append({"quantity": what, "predicted": predicted, "measured": measured, "unit": unit,
                     "error_percent": error, "note": note})

    g = plan_report["per_gpu"]
    add("weights per GPU", g["weights_gib"]["value"], kb.value("breakdown", "weights"), "GiB")
    add("KV cache per GPU", g["kv_cache_gib"]["value"], kb.value("breakdown", "kv_cache"), "GiB")
    add("KV tokens per GPU", g["kv_tokens"]["value"], kb.value("kv_pool", "tokens"), "tokens",
        "SGLang's max_total_num_tokens / vLLM's GPU KV cache size")
    add("KV bytes per token per GPU", g["kv_bytes_per_token"]["value"], kb.value("kv_pool", "bytes_per_token"), "B",
        "the log's figure carries printed rounding")
    return rows


def log_gib(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value / GIB, 2)
