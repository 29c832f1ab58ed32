"""What the weights should weigh per rank, from config.json, beside what the log measured.

Parameters are counted for the standard decoder shapes (Llama/Qwen/Mistral/Mixtral-style
attention and gated MLPs, DeepSeek MLA and MoE); norms and biases are left out (well under
1%). Bytes per weight come from the checkpoint's dtype and quantization: fp8 → 1, 4-bit →
0.5 plus one 2-byte scale per group; embeddings and the LM head stay in the model dtype.
Per rank ≈ total / (TP × PP): TP shards every matrix (vocab-parallel embeddings included),
PP gives each stage its layers.
"""
from __future__ import annotations

from typing import Optional

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.vocabulary import GIB, element_size

TOLERANCE = 0.15  # within ±15% the measured weights agree with the estimate


def _attention(cfg: dict) -> int:
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    if cfg.get("kv_lora_rank"):
        nope, rope = cfg.get("qk_nope_head_dim", 128), cfg.get("qk_rope_head_dim", 64)
        v = cfg.get("v_head_dim", 128)
        q_lora = cfg.get("q_lora_rank")
        q = h * q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
        kv = h * (cfg["kv_lora_rank"] + rope) + cfg["kv_lora_rank"] * heads * (nope + v)
        return q + kv + heads * v * h
    hd = cfg.get("head_dim") or h // heads
    kv_heads = cfg.get("num_key_value_heads") or heads
    return h * heads * hd * 2 + h * kv_heads * hd * 2


def _experts(cfg: dict) -> int:
    return cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0


def _mlp(cfg: dict, layer: int) -> int:
    h = cfg["hidden_size"]
    experts = _experts(cfg)
    dense_first = cfg.get("first_k_dense_replace", 0)
    sparse_step = cfg.get("decoder_sparse_step", 1) or 1
    if experts and layer >= dense_first and (layer + 1) % sparse_step == 0 and layer not in cfg.get("mlp_only_layers", []):
        inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
        shared = (cfg.get("n_shared_experts") or 0) * 3 * h * inter
        if cfg.get("shared_expert_intermediate_size"):
            shared = 3 * h * cfg["shared_expert_intermediate_size"]
        return experts * 3 * h * inter + shared + h * experts
    return 3 * h * cfg["intermediate_size"]


def parameter_count(cfg: dict) -> tuple[Optional[int], str]:
    """(parameters of the language model, how counted); None with the reason when the shape is
    one this estimate does not cover."""
    needed = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size")
    missing = [k for k in needed if not isinstance(cfg.get(k), int)]
    if missing:
        return None, f"config.json lacks {', '.join(missing)}"
    if cfg.get("layer_types") or cfg.get("full_attention_interval") or cfg.get("hybrid_override_pattern") \
            or cfg.get("layers_block_type"):
        return None, "hybrid linear-attention/Mamba layers are not estimated"
    layers = cfg["num_hidden_layers"]
    body = sum(_attention(cfg) + _mlp(cfg, i) for i in range(layers))
    embed = cfg["vocab_size"] * cfg["hidden_size"]
    head = 0 if cfg.get("tie_word_embeddings") else embed
    how = (f"{layers} layers × (attention + {'MoE' if _experts(cfg) else 'gated'} MLP) + embeddings"
           + ("" if cfg.get("tie_word_embeddings") else " + LM head"))
    return body + embed + head, how


def bytes_per_weight(cfg: dict) -> tuple[Optional[float], str]:
    quant = cfg.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    bits = quant.get("bits") or quant.get("w_bit")
    groups = quant.get("config_groups") or {}
    for group in groups.values() if isinstance(groups, dict) else []:
        weights = group.get("weights") if isinstance(group, dict) else None
        bits = bits or (weights.get("num_bits") if isinstance(weights, dict) else None)
    if method == "fp8" or "fp8" in str(quant.get("fmt", "")).lower() or bits == 8:
        return 1.0, f"{method or 'int8/fp8'} 8-bit weights"
    if bits == 4 or method in ("awq", "gptq", "nvfp4", "mxfp4"):
        group = quant.get("group_size") or quant.get("q_group_size") or 128
        if isinstance(group, bool) or not isinstance(group, int) or group <= 0:
            return None, f"quantization group size {group!r} is not a positive whole number"
        return 0.5 + 2 / group, f"4-bit weights + a 2-byte scale per {group}"
    if method:
        return None, f"quantization {method!r} is not estimated"
    elem = element_size(cfg.get("torch_dtype") or cfg.get("dtype"))
    return (float(elem), f"{cfg.get('torch_dtype') or cfg.get('dtype')} weights") if elem else (None, "no dtype")


@rule("weights.theoretical",
      reads=(F.ModelConfig, "breakdown:weights", "config:tp_size", "config:pp_size"),
      concludes=("weights:theoretical_gib",))
def theoretical(kb):
    """What it concludes: `weights.theoretical_gib`: the weights each rank should hold, from
    config.json, against the measured row.

    How: Expected weights per rank from config.json: parameters × bytes per weight / (TP × PP),
    against the measured `weights` row. Within ±15% they agree; beyond, the report lists what
    usually explains it (a vision tower or MTP/draft layers the count leaves out, layers kept
    unquantized, experts not sharded by TP) — or says it is unexplained.

    Example: 8.03 B parameters × 2 B (bfloat16) / 1 rank = 14.96 GiB; measured 14.99 GiB: agrees."""
    model = kb.first(F.ModelConfig, role=None)
    if model is None:
        return
    params, how = parameter_count(model.fields)
    per_weight, what = bytes_per_weight(model.fields)
    measured = kb.get("breakdown", "weights")
    if params is None or per_weight is None:
        yield Derived("weights", "theoretical_gib", Unknown(how if params is None else what), "weights.theoretical",
                      (model,))
        return
    shards = (kb.value("config", "tp_size") or 1) * (kb.value("config", "pp_size") or 1)
    embed = model.fields["vocab_size"] * model.fields["hidden_size"] * (1 if model.fields.get("tie_word_embeddings") else 2)
    dtype_bytes = element_size(model.fields.get("torch_dtype") or model.fields.get("dtype")) or 2
    total_bytes = (params - embed) * per_weight + embed * dtype_bytes
    value = round(total_bytes / shards / GIB, 2)
    formula = (f"{params / 1e9:.2f} B parameters ({how}) × {per_weight:g} B ({what}; embeddings at {dtype_bytes} B) "
               f"/ {shards} rank(s) = {value} GiB")
    detail = {"parameters": params}
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
