"""The pre-deploy plan (`capdiag plan`): what the framework would allocate on each GPU — the
weights, the KV pool in GiB and tokens, how many requests fit — from config.json, the GPU and
the settings, through the same memory model `explain` and `--what-if` run (capdiag.memory).

    weights    = the checkpoint's parameters on one rank, in its quantization (capdiag.memory.weights)
                 + what the framework's load adds (measured)
    SGLang     rest = (total − CUDA context − distributed init) × mem_fraction_static − weights
               pools from rest: KV (full, sliding-window), Mamba state (capdiag.memory.sglang)
    vLLM       available = total × gpu_memory_utilization − weights − non-torch − activation peak
                           − CUDA-graph estimate (0.21+); blocks and tokens (capdiag.memory.vllm)

A setting not given is the framework's own default (SGLang's computed mem_fraction_static, vLLM's
0.9 and its scheduler defaults, the model's context length), and the plan says it took it. The
terms no formula gives come from start-ups that measured them (references/measured-memory.toml).
`--training` sizes a fine-tune instead: weights and optimizer state against the GPU.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.gpus import gpu_specs
from capdiag.memory import measured, sglang as sg, vllm as vl
from capdiag.memory.kv import cell as kv_cell_of, state as state_of
from capdiag.memory.shape import kv_shape, model_shape
from capdiag.memory.weights import GIB, model_dtype_bytes, quantization, weight_bytes
from capdiag.vocabulary import element_size

# bytes per parameter for --params without config.json (no layer to tell converted from kept)
BYTES_PER_WEIGHT = {"bf16": 2, "fp16": 2, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1, "int4": 0.5, "fp4": 0.5}
# mixed-precision AdamW: 18 B per parameter in all (bf16 weights 2, fp32 gradients 4, fp32 master weights 4,
# two fp32 moments 8); the weights hold the first 2 B, the training state the other 16
TRAINING_BYTES = {"full": 18}
LORA_TRAINABLE = 0.01  # LoRA adapters hold about 1% of the parameters (rank-16 style)
TP_CHOICES = (1, 2, 4, 8, 16, 32)
VLLM_DEFAULT_UTILIZATION = 0.9  # EngineArgs.gpu_memory_utilization


def _request(kb) -> Optional[F.PlanRequest]:
    return kb.first(F.PlanRequest, role=None)


def tp_of(req: F.PlanRequest) -> int:
    return req.tp or req.gpus or 1


def setting(req: F.PlanRequest, *keys: str) -> Any:
    given = dict(req.settings)
    return next((given[k] for k in keys if k in given), None)


def _shape(kb):
    d = kb.get("plan", "shape")
    return d.detail.get("shape") if d is not None and d.known else None


@rule("plan.shape", reads=(F.PlanRequest, F.ModelConfig), concludes=("plan:shape",))
def shape(kb):
    """What it concludes: `plan.shape`: the model's layers as the frameworks build them.

    How: config.json → each layer's mixer (full, sliding-window or MLA attention; Gated DeltaNet
    or Mamba-2 state), its MLP (dense or experts) and every parameter group with the way TP
    splits it (capdiag.memory.shape). A layer kind the model does not know is unknown, not
    guessed.

    Example: Qwen3.5-27B: 64 layers (every 4th is full attention; 48 gdn state layers), hidden
    5120, 24 heads, 4 KV heads × 256, vocab 248320."""
    req, model = _request(kb), kb.first(F.ModelConfig, role=None)
    if req is None or model is None:
        return
    found, how = model_shape(model.fields)
    if found is None:
        yield Derived("plan", "shape", Unknown(how), "plan.shape", (model,))
        return
    yield Derived("plan", "shape", how, "plan.shape", (model,), how, {"shape": found})


@rule("plan.parameters", reads=(F.PlanRequest, "plan:shape"), concludes=("plan:parameters",))
def parameters(kb):
    """What it concludes: `plan.parameters`: the model's parameter count.

    How: `--params` (e.g. 70B), else counted from the shape config.json gives.

    Example: `--params 70B`: 70 × 10^9."""
    req, found = _request(kb), kb.get("plan", "shape")
    if req is None:
        return
    if req.params:
        yield Derived("plan", "parameters", req.params, "plan.parameters", (req,), f"--params {req.params / 1e9:g}B")
    elif found is not None:
        s = _shape(kb)
        yield Derived("plan", "parameters", s.parameters if s else Unknown(found.value.reason), "plan.parameters",
                      (found,), f"counted from config.json: {found.value}" if s else "")
    else:
        yield Derived("plan", "parameters", Unknown("give --params or --config-json"), "plan.parameters", (req,))


def _load_overhead(framework: str) -> tuple[float, str]:
    value, how = measured.median_term(framework, "load_overhead", "the load's own allocations")
    return (value or 0.0), how


# (framework, vendor) → quantization methods whose routed experts the framework builds unquantized
EXPERTS_KEPT = {("sglang", "amd"): ("awq", "gptq")}


@rule("plan.weights",
      reads=(F.PlanRequest, F.ModelConfig, F.ModelWeights, "plan:parameters", "plan:shape", "plan:device"),
      concludes=("plan:weights",))
def weights(kb):
    """What it concludes: `plan.weights`: the GiB of weights each GPU holds once loaded.

    How: the checkpoint's parameters on one rank (TP splits linears and experts, pads the
    vocabulary to 64 rows a rank, keeps fewer KV heads than ranks at one a rank, replicates norms,
    routers and MLA's down-projections) in its quantization: config.json's `quantization_config`
    (the modules it leaves unconverted stay in the model dtype), else the format `--weight-dtype`
    names; plus what the framework's load adds (measured). With `--model` and no
    `--weight-dtype`, the checkpoint's own bytes (safetensors `total_size`) ÷ TP. With `--params`
    and no config.json, parameters × bytes per weight.

    Example: Llama-3.1-8B in bf16, TP 1: 8.03 B × 2 B = 14.96 GiB + 0.11 GiB (SGLang's load,
    measured) = 15.07 GiB."""
    req, params = _request(kb), kb.get("plan", "parameters")
    if req is None or params is None:
        return
    tp = tp_of(req)
    extra, extra_how = _load_overhead(req.framework)
    stored = kb.first(F.ModelWeights, role=None)
    s, model = _shape(kb), kb.first(F.ModelConfig, role=None)
    if req.weights_as_stored and stored is not None:
        value = stored.total_bytes / GIB / tp + extra
        yield Derived("plan", "weights", round(value, 2), "plan.weights", (req, stored),
                      f"checkpoint {stored.total_bytes:,} B (safetensors total_size) ÷ TP {tp} + {extra_how}",
                      {"parameter_gib": stored.total_bytes / GIB / tp})
        return
    if s is not None and model is not None and not req.params:
        quant, quant_how = quantization(model.fields, req.weight_dtype)
        dtype_bytes, dtype_how = model_dtype_bytes(model.fields, req.weight_dtype)
        if quant is None and quant_how.startswith(("quantization", "compressed", "bitsandbytes", "awq", "gptq",
                                                   "unknown")):
            yield Derived("plan", "weights", Unknown(quant_how), "plan.weights", (req, model))
            return
        dev = kb.get("plan", "device")
        kept = quant is not None and quant.method in EXPERTS_KEPT.get(
            (req.framework, dev.detail.get("vendor") if dev is not None else None), ())
        counted = weight_bytes(s, tp, quant, dtype_bytes, experts_kept=kept)
        yield Derived("plan", "weights", round(counted.gib + extra, 2), "plan.weights", (req, model, params),
                      f"{counted.formula} ({quant_how}; unconverted at {dtype_how}) + {extra_how}",
                      {"parameter_gib": counted.gib, "quantization": quant.method if quant else None})
        return
    dtype = (req.weight_dtype or "bf16").lower() if req.weight_dtype or not params.known else None
    per = BYTES_PER_WEIGHT.get(dtype) if dtype else None
    if not params.known or per is None:
        why = params.value.reason if not params.known else (
            f"unknown weight dtype {req.weight_dtype!r}" if req.weight_dtype else
            "--params without config.json: give --weight-dtype (the checkpoint's dtype)")
        yield Derived("plan", "weights", Unknown(why), "plan.weights", (req, params))
        return
    total = params.value * per / GIB
    yield Derived("plan", "weights", round(total / tp + extra, 2), "plan.weights", (req, params),
                  f"{params.value / 1e9:g} B × {per:g} B = {total:.1f} GiB ÷ TP {tp} (every parameter at one dtype: "
                  f"without config.json nothing tells the layers a format keeps unconverted) + {extra_how}",
                  {"parameter_gib": total / tp})


@rule("plan.device", reads=(F.PlanRequest, F.GpuTotal, F.GpuSpec), concludes=("plan:device",))
def device(kb):
    """What it concludes: `plan.device`: the GiB of one GPU the framework's process sees, and
    which GPU it is.

    How: `--gpu-total-gib` as given, else the `--gpu` entry's torch total_memory where one was
    observed (nvidia-smi's memory.total includes the driver's reservation, 350–870 MiB on NVIDIA
    GPUs, which no process gets), else its nvidia-smi total less the median reservation
    (an estimate, said so).

    Example: `--gpu l4`: torch total_memory 23,570,219,008 B = 21.95 GiB (nvidia-smi: 23034 MiB)."""
    req = _request(kb)
    if req is None:
        return
    given = kb.first(F.GpuTotal, role=None)
    spec = next((s for s in kb.of(F.GpuSpec, role=None) if s.matched_by.startswith("--gpu")), None)
    entry = next((e for e in gpu_specs() if spec is not None and e["alias"] == spec.alias), None)
    vendor = measured.vendor_of(entry["names"], entry["alias"]) if entry else None  # a total alone names no vendor
    name = entry["names"][0] if entry else ""
    if given is not None:
        yield Derived("plan", "device", given.gib, "plan.device", (given,),
                      f"--gpu-total-gib {given.gib} (as the process sees it)",
                      {"vendor": vendor, "name": name, "alias": entry["alias"] if entry else None, "measured": True})
        return
    if entry is None:
        yield Derived("plan", "device", Unknown("give --gpu or --gpu-total-gib"), "plan.device", (req,))
        return
    total, how, exact = measured.device_total(entry)
    yield Derived("plan", "device", round(total, 2) if total else Unknown(how), "plan.device", (spec,), how,
                  {"vendor": vendor, "name": name, "alias": entry["alias"], "measured": exact,
                   "smi_mib": min(entry.get("observed_total_mib") or [0])})


@rule("plan.kv-cells", reads=(F.PlanRequest, F.ModelConfig, "plan:shape", "plan:device"),
      concludes=("plan:kv_cells",))
def kv_cells(kb):
    """What it concludes: `plan.kv_cells`: one token's KV bytes on each GPU, per attention kind,
    and one request's recurrent state.

    How: full and sliding-window layers: max(1, KV heads // TP) × (head_dim + v_head_dim) × the
    KV element (`--kv-dtype`, else the model's dtype, as `auto` does) per layer; MLA: the latent
    on every rank (DSA's fp8 cell with its scales and indexer); Gated DeltaNet / Mamba-2 layers:
    the convolution window and SSM state of one request, split over TP (capdiag.memory.kv).

    Example: Llama-3.1-70B at TP 8: max(1, 8 // 8) = 1 × (128 + 128) × 2 B × 80 layers = 40960 B."""
    req, model = _request(kb), kb.first(F.ModelConfig, role=None)
    if req is None:
        return
    s = _shape(kb)
    if model is None:
        yield Derived("plan", "kv_cells", Unknown("needs --config-json (or --layers/--kv-heads/--head-dim) for the "
                                                  "KV shape"), "plan.kv-cells", (req,))
        return
    stated = model.fields.get("torch_dtype") or model.fields.get("dtype") or (
        req.weight_dtype if req.weight_dtype and element_size(req.weight_dtype) == 2 else None)
    kv_dtype = req.kv_dtype if req.kv_dtype and req.kv_dtype != "auto" else stated
    elem = element_size(kv_dtype)
    if elem is None:
        yield Derived("plan", "kv_cells", Unknown(f"unknown KV dtype {kv_dtype!r}" if kv_dtype else
                                                  "no dtype is stated for `auto` KV (give --kv-dtype)"),
                      "plan.kv-cells", (req, model))
        return
    attention = s.attention if s is not None else kv_shape(model.fields)
    if attention is None:
        found = kb.get("plan", "shape")
        yield Derived("plan", "kv_cells", Unknown(found.value.reason if found is not None and not found.known else
                                                  "config.json lacks the attention shape"), "plan.kv-cells", (req, model))
        return
    tp = tp_of(req)
    dev = kb.get("plan", "device")
    hip = dev is not None and dev.detail.get("vendor") == "amd" and req.framework == "sglang"
    cells = tuple(kv_cell_of(a, elem, tp, raw_latent=hip) for a in attention)
    recurrent = state_of(s.recurrent, element_size(stated) or elem, tp) if s is not None and s.recurrent else None
    formula = "; ".join(c.formula for c in cells) + (f"; state a request: {recurrent.formula}" if recurrent else "")
    per_token = sum(c.bytes for c in cells)
    yield Derived("plan", "kv_cells", per_token, "plan.kv-cells", (req, model),
                  f"{formula} = {per_token:,.0f} B a token", {"cells": cells, "state": recurrent, "element": elem,
                                                             "dtype": kv_dtype})


@rule("plan.settings", reads=(F.PlanRequest, F.ModelConfig, "plan:device"), concludes=("plan:settings",))
def settings(kb):
    """What it concludes: `plan.settings`: the settings the framework would run with.

    How: what is given (`--fraction`, `--context`, `--set KEY=VALUE`, `--framework-version`), and
    for the rest the framework's own defaults: SGLang computes mem_fraction_static from the GPU's
    memory and the parallel size; vLLM's gpu_memory_utilization is 0.9; the context is the
    model's max_position_embeddings; vLLM's batched tokens and sequences follow the GPU's class.

    Example: SGLang on an H100 (81559 MiB), TP 1, chunked prefill 8192: (81559 − 12936) / 81559
    = 0.841."""
    req, model, dev = _request(kb), kb.first(F.ModelConfig, role=None), kb.get("plan", "device")
    if req is None or dev is None:
        return
    tp, notes = tp_of(req), []
    out: dict[str, Any] = {"version": req.version}
    context = (req.contexts[0] if req.contexts else None) or setting(req, "context_len", "max_model_len")
    if context is None and model is not None and isinstance(model.fields.get("max_position_embeddings"), int):
        context = model.fields["max_position_embeddings"]
        notes.append(f"context {context:,}: the model's max_position_embeddings (the framework's default)")
    out["context"] = context
    fraction = req.fraction if req.fraction is not None else setting(req, "mem_fraction_static", "gpu_memory_utilization")
    smi_mib = dev.detail.get("smi_mib") or (dev.value * 1024 if dev.known else None)
    if req.framework == "sglang":
        out["page"] = setting(req, "page_size") or 1
        out["requests"] = setting(req, "max_running_requests")
        if fraction is None and smi_mib:
            fraction, how = sg.default_fraction(smi_mib, tp, 1, setting(req, "chunked_prefill_size"))
            notes.append(how)
    else:
        version = vl.release(req.version)
        out["release"] = version
        if fraction is None:
            fraction = VLLM_DEFAULT_UTILIZATION
            notes.append(f"gpu_memory_utilization {fraction}: vLLM's default")
        tokens, seqs, why = vl.scheduler_defaults(version, dev.value if dev.known else 0, dev.detail.get("name", ""),
                                                  context)
        given_tokens, given_seqs = setting(req, "max_num_batched_tokens"), setting(req, "max_num_seqs", "max_running_requests")
        if given_tokens is None or given_seqs is None:
            notes.append(why + ("" if req.version else f" (vLLM {version[0]}.{version[1]}, the newest modelled: "
                                                       "give --framework-version for another)"))
        out["batched_tokens"] = given_tokens or tokens
        out["requests"] = given_seqs or seqs
        out["block"] = setting(req, "block_size")
        out["eager"] = bool(setting(req, "enforce_eager"))
    out["fraction"] = fraction
    if fraction is None:
        yield Derived("plan", "settings", Unknown("the fraction: give --fraction, or --gpu for SGLang's own default"),
                      "plan.settings", (req, dev))
        return
    yield Derived("plan", "settings", out, "plan.settings", (req, dev) + ((model,) if model else ()),
                  "; ".join(notes) or "as given", {"notes": tuple(notes)})


def _sglang_budget(kb, req, dev, w, st):
    vendor, alias = dev.detail.get("vendor"), dev.detail.get("alias")
    context, how_c = measured.median_term("sglang", "context", f"CUDA context on the {alias}", gpu=alias)
    if context is None:
        context, how_c = measured.median_term("sglang", "context", "CUDA context",
                                              **({"vendor": vendor} if vendor else {}))
    dist, how_d = measured.by_tp("sglang", "distributed", "distributed init", vendor, tp_of(req))
    if context is None or dist is None:
        return Unknown(how_c if context is None else how_d), "", {}
    pre = dev.value - context - dist
    rest = pre * st["fraction"] - w.value
    return rest, (f"free before the weights = {dev.value} − {context:.2f} ({how_c}) − {dist:.2f} ({how_d}) = "
                  f"{pre:.2f} GiB; rest = {pre:.2f} × {st['fraction']} − weights {w.value} = {rest:.2f} GiB"), \
        {"pre_gib": pre, "context_gib": context, "distributed_gib": dist}


def _vllm_budget(kb, req, dev, w, st, s):
    version, vendor, tp = st["release"], dev.detail.get("vendor"), tp_of(req)
    v0 = version < vl.V1_FROM
    term = "non_torch_v0" if v0 else "non_torch"
    non_torch, how_n = measured.by_tp("vllm", term, "non-torch memory", vendor, tp)
    if non_torch is None:
        non_torch, how_n = measured.by_tp("vllm", term, "non-torch memory", "nvidia", tp)
    if s is None:
        return Unknown("the activation peak needs config.json (hidden size, MLP width, vocabulary)"), "", {}
    act, how_a = vl.activation_peak(st["batched_tokens"], st["requests"], s.hidden, s.intermediate / tp, s.vocab,
                                    element_size(s.dtype) or 2, version, s.topk, s.expert_intermediate / tp)
    graphs, how_g = 0.0, "no CUDA-graph estimate in the budget" + (" (eager)" if st["eager"] else " before 0.21")
    if version >= vl.GRAPH_ESTIMATE_FROM and not st["eager"]:
        graphs, how_g = measured.median_term("vllm", "graphs", "CUDA-graph estimate")
        graphs = graphs or 0.0
    if v0:
        graphs, how_g = 0.0, "V0 captures graphs after sizing the cache"
    nccl, how_x = 0.0, ""
    if vl.NCCL_IN_BUDGET[0] <= version < vl.NCCL_IN_BUDGET[1] and tp > 1:
        shared = vl.nvls(dev.detail.get("name", ""), tp)
        nccl, how_x = measured.median_term("vllm", "nccl_init", "NCCL's initialisation" + (" with NVLS" if shared else ""),
                                           nvls=shared)
        nccl = nccl or 0.0
        how_x = f" − {nccl:.2f} ({how_x}; counted in 0.9–0.10)"
    available = vl.available_gib(dev.value, st["fraction"], w.value, (non_torch or 0.0) + nccl, act, graphs)
    return available, (f"available = {dev.value} × {st['fraction']} − weights {w.value} − {how_n}{how_x} − activation "
                       f"{act:.2f} ({how_a}) − {graphs:.2f} ({how_g}) = {available:.2f} GiB"), \
        {"non_torch_gib": (non_torch or 0.0) + nccl, "activation_gib": act, "graphs_gib": graphs}


@rule("plan.budget",
      reads=(F.PlanRequest, "plan:device", "plan:weights", "plan:settings", "plan:shape"),
      concludes=("plan:budget",))
def budget(kb):
    """What it concludes: `plan.budget`: the GiB each GPU's KV pool (and Mamba state) is sized from.

    How: SGLang: free before the weights (total − CUDA context − distributed init, both measured
    by vendor and TP) × mem_fraction_static − weights. vLLM: total × gpu_memory_utilization −
    weights − non-torch memory (measured by TP) − the profiling run's activation peak (the
    larger of the MLP over the batched tokens and the dummy sampler) − the CUDA-graph estimate
    (0.21+, unless eager; measured).

    Example: SGLang, Llama-3.1-8B on an H100 at 0.88: (79.19 − 0.52 − 0.09) × 0.88 − 15.07 =
    54.08 GiB."""
    req, dev, w, st = _request(kb), kb.get("plan", "device"), kb.get("plan", "weights"), kb.get("plan", "settings")
    if req is None or dev is None or w is None or st is None:
        return
    missing = [d for d in (dev, w, st) if not d.known]
    if missing:
        yield Derived("plan", "budget", Unknown(missing[0].value.reason), "plan.budget", tuple(missing))
        return
    if req.framework == "sglang":
        value, formula, detail = _sglang_budget(kb, req, dev, w, st.value)
    else:
        value, formula, detail = _vllm_budget(kb, req, dev, w, st.value, _shape(kb))
    yield Derived("plan", "budget", round(value, 2) if isinstance(value, float) else value, "plan.budget",
                  (dev, w, st), formula, detail)


@rule("plan.pool",
      reads=(F.PlanRequest, "plan:budget", "plan:kv_cells", "plan:settings", "plan:shape"),
      concludes=("plan:pool",))
def pool(kb):
    """What it concludes: `plan.pool`: the KV pool each GPU would allocate — its GiB, its tokens
    as the framework prints them (SGLang's max_total_num_tokens, vLLM's GPU KV cache size), and
    the request limit.

    How: SGLang splits rest into the Mamba state (0.9/1.9 of it, in whole request slots), the
    sliding-window pool (0.8 of the full pool's tokens) and the full-attention pool, rounded to
    the page; vLLM's blocks of `block_size` tokens in every layer of a KV-cache group, and
    tokens as the release counts them (capdiag.memory.sglang / .vllm).

    Example: SGLang, 54.08 GiB at 131072 B a token: 443,037 tokens."""
    req, b, cells, st = _request(kb), kb.get("plan", "budget"), kb.get("plan", "kv_cells"), kb.get("plan", "settings")
    if req is None or b is None or cells is None or st is None:
        return
    if not (b.known and cells.known and st.known):
        reason = next(d.value.reason for d in (b, cells, st) if not d.known)
        yield Derived("plan", "pool", Unknown(reason), "plan.pool", (b, cells, st))
        return
    s = _shape(kb)
    state = cells.detail["state"]
    settings_ = st.value
    if req.framework == "sglang":
        result = sg.pool(b.value, cells.detail["cells"], settings_["page"], state,
                         hybrid_swa=s is None or s.model_type not in sg.NO_HYBRID_SWA)
        requests, how = sg.max_running_requests(result.tokens, settings_["context"], settings_["requests"],
                                                state_cap=result.request_cap)
        value = {"kv_tokens": result.tokens, "kv_cache_gib": round(result.kv_gib, 2),
                 "state_gib": round(result.state_gib, 2) if state else None, "state_slots": result.state_slots,
                 "swa_tokens": result.swa_tokens, "max_running_requests": requests,
                 "concurrency": None}
        lines = result.lines + (f"max_running_requests = {how}",)
    else:
        result = vl.pool(b.value, cells.detail["cells"], settings_["release"], settings_["context"], state,
                         settings_["block"], settings_["batched_tokens"])
        value = {"kv_tokens": result.tokens, "kv_cache_gib": round(result.kv_gib, 2),
                 "state_gib": None, "state_slots": None, "swa_tokens": None,
                 "max_running_requests": settings_["requests"], "concurrency": result.concurrency,
                 "blocks": result.blocks, "block_size": result.block_size}
        lines = result.lines
    yield Derived("plan", "pool", value, "plan.pool", (b, cells, st), "; ".join(lines))


def _head_constraint(s, tp: int) -> Optional[str]:
    if s is None:
        return None
    if s.heads % tp:
        return f"TP {tp} does not divide the model's {s.heads} attention heads (both frameworks refuse the layout)"
    if s.kv_heads and s.kv_heads > tp and s.kv_heads % tp:
        return f"TP {tp} does not divide the model's {s.kv_heads} KV heads (both frameworks refuse the layout)"
    return None


@rule("plan.verdict",
      reads=(F.PlanRequest, "plan:pool", "plan:budget", "plan:weights", "plan:device", "plan:settings", "plan:shape",
             "plan:kv_cells"),
      concludes=("plan:verdict",))
def verdict(kb):
    """What it concludes: `plan.verdict`: fits, does not fit, or unknown — whether the framework
    would start with this layout, and how many requests at the context fit.

    How: does not fit when TP does not divide the attention heads; when the weights alone exceed
    the GPU; when nothing is left for the KV pool (SGLang: "Not enough memory"; vLLM: "No
    available memory for the cache blocks"); when vLLM's pool cannot hold one request of
    max_model_len (it refuses to start); when a `--workload` needs more tokens or requests than
    the pool and the request limit hold. Unknown, with the reason, when an input the judgement
    needs is unknown. Requests at the context = min(tokens // context, the request limit) for
    SGLang, vLLM's own concurrency (the largest whole number) for vLLM.

    Example: 443,037 tokens at a 131,072 context: 3 requests; fits."""
    req = _request(kb)
    if req is None or req.training:
        return
    p, b, w, dev, st = (kb.get("plan", k) for k in ("pool", "budget", "weights", "device", "settings"))
    s = _shape(kb)
    premises = tuple(d for d in (p, b, w, dev, st) if d is not None)
    layout = _head_constraint(s, tp_of(req))
    if layout:
        yield Derived("plan", "verdict", {"verdict": "does_not_fit", "reason": layout, "max_concurrent": None},
                      "plan.verdict", premises, layout)
        return
    if w is not None and w.known and dev is not None and dev.known and w.value >= dev.value:
        why = f"the weights alone ({w.value} GiB a GPU) exceed the GPU's {dev.value} GiB"
        yield Derived("plan", "verdict", {"verdict": "does_not_fit", "reason": why, "max_concurrent": None},
                      "plan.verdict", premises, why)
        return
    if b is not None and b.known and b.value <= 0:
        why = (f"nothing is left for the KV cache: the budget is {b.value} GiB ("
               + ("SGLang refuses: Not enough memory; raise --mem-fraction-static" if req.framework == "sglang"
                  else "vLLM refuses: No available memory for the cache blocks") + ")")
        yield Derived("plan", "verdict", {"verdict": "does_not_fit", "reason": why, "max_concurrent": 0},
                      "plan.verdict", premises, why)
        return
    cells = kb.get("plan", "kv_cells")
    if (p is None or not p.known) and b is not None and b.known and cells is not None and not cells.known \
            and not req.workloads:
        why = (f"the weights leave {b.value} GiB a GPU for the KV cache; how many tokens that holds needs the "
               f"model's attention shape ({cells.value.reason})")
        yield Derived("plan", "verdict", {"verdict": "fits", "reason": why, "max_concurrent": None},
                      "plan.verdict", premises + (cells,), why)
        return
    if p is None or not p.known:
        why = p.value.reason if p is not None else "cannot size the pool"
        yield Derived("plan", "verdict", {"verdict": "unknown", "reason": why, "max_concurrent": None},
                      "plan.verdict", premises, why)
        return
    pool_ = p.value
    context = st.value.get("context") if st is not None and st.known else None
    limit = pool_["max_running_requests"]
    if req.framework == "vllm" and pool_["concurrency"] is not None:
        at_context = math.floor(pool_["concurrency"])
        formula = f"vLLM's concurrency at {context:,} tokens: {pool_['concurrency']:.2f}"
    elif context:
        at_context = pool_["kv_tokens"] // context
        formula = f"{pool_['kv_tokens']:,} tokens // {context:,}"
    else:
        at_context, formula = None, "no context length to judge"
    if at_context is not None and limit is not None:
        formula += f", at most the request limit {limit}"
        at_context = min(at_context, limit)
    status, why = "fits", f"the pool holds {pool_['kv_tokens']:,} tokens: {formula} = {at_context} request(s) at once"
    if req.framework == "vllm" and context and pool_["concurrency"] is not None and pool_["concurrency"] < 1:
        status, why = "does_not_fit", (f"the pool cannot hold one request of max_model_len {context:,} "
                                       f"({pool_['concurrency']:.2f}×): vLLM refuses to start")
    need = sum(c * n for c, n in req.workloads)
    if req.workloads and status == "fits":
        requests = sum(n for _, n in req.workloads)
        if need > pool_["kv_tokens"]:
            status, why = "does_not_fit", f"the workload needs {need:,} tokens; the pool holds {pool_['kv_tokens']:,}"
        elif limit is not None and requests > limit:
            status, why = "does_not_fit", f"the workload runs {requests} requests at once; the limit is {limit}"
        else:
            why += f"; the workload's {need:,} tokens fit"
    yield Derived("plan", "verdict", {"verdict": status, "reason": why, "max_concurrent": at_context},
                  "plan.verdict", premises, why)


@rule("plan.training", reads=(F.PlanRequest, "plan:parameters", "plan:weights", "plan:device"),
      concludes=("plan:training",))
def training(kb):
    """What it concludes: `plan.training`: with `--training`, the optimizer state each GPU holds
    and whether a fine-tune fits.

    How: full fine-tuning with mixed-precision AdamW keeps 18 B per parameter (2 B weights, fp32
    gradients, master weights and two moments); LoRA trains about 1% of the parameters at 18 B;
    sharded over the GPUs. Activations depend on batch and sequence length and are not counted;
    `--headroom` (default 15%) of the GPU is kept for them.

    Example: 70 B parameters, full, 16 GPUs: 70 × 10^9 × 16 B / 2^30 / 16 = 65.19 GiB a GPU of state."""
    req, params, w, dev = _request(kb), kb.get("plan", "parameters"), kb.get("plan", "weights"), kb.get("plan", "device")
    if req is None or not req.training or params is None:
        return
    if not params.known:
        yield Derived("plan", "training", Unknown(params.value.reason), "plan.training", (params,))
        return
    gpus = tp_of(req)
    if req.training == "full":
        state = params.value * (TRAINING_BYTES["full"] - 2) / GIB
        formula = (f"{params.value / 1e9:g} B × {TRAINING_BYTES['full'] - 2} B (fp32 gradients, master weights and two "
                   f"Adam moments; with the weights, {TRAINING_BYTES['full']} B per parameter = "
                   f"{params.value * TRAINING_BYTES['full'] / GIB:,.1f} GiB in all)")
    else:
        state = params.value * LORA_TRAINABLE * TRAINING_BYTES["full"] / GIB
        formula = (f"LoRA adapters ≈ {LORA_TRAINABLE:.0%} of {params.value / 1e9:g} B parameters × "
                   f"{TRAINING_BYTES['full']} B (frozen weights are in the weights)")
    per_gpu = state / gpus
    value: dict[str, Any] = {"state_gib": round(per_gpu, 2), "total_gib": round(params.value * TRAINING_BYTES["full"]
                                                                             / GIB, 2) if req.training == "full" else None}
    if w is not None and w.known and dev is not None and dev.known:
        weights_gib = round(w.detail.get("parameter_gib", w.value), 2)
        need = weights_gib + per_gpu
        usable = dev.value * (1 - req.headroom)
        value.update(verdict="fits" if need <= usable else "does_not_fit", need_gib=round(need, 2),
                     usable_gib=round(usable, 2))
        formula += (f"; ÷ {gpus} GPUs = {per_gpu:.2f} GiB; weights {weights_gib} + state {per_gpu:.2f} = {need:.2f} GiB "
                    f"against {dev.value} × (1 − {req.headroom}) = {usable:.2f} GiB")
    yield Derived("plan", "training", value, "plan.training", tuple(d for d in (req, params, w, dev) if d is not None),
                  formula)
