"""The words every layer shares, written once: the memory categories a GPU's start-up memory is
split into, the configuration keys a report states, the request lengths the concurrency table
uses when none are given, and the KV
cache's bytes per token — the per-rank cell config.json implies, and the figure a log implies
with the band its printed rounding leaves.

Rules, the plan worksheet, what-if, the report and the bars read these; the templates get the
categories through the report and the bars. Nothing here reads a log or a fact.
"""
from __future__ import annotations

from typing import Optional

import attrs

GIB = 1 << 30

# What a start-up leaves resident on a GPU, bottom to top of a rank's stacked bar.
HELD = ("framework", "weights", "kv_cache", "mamba_state", "cuda_graph", "draft_weights", "draft_kv_cache",
        "draft_cuda_graph")
# A rank's bar: what is held, then what no log line explains (measured against nvidia-smi), then free.
SEGMENTS = HELD + ("other", "free")
# The breakdown table's rows: vLLM's profiled activation peak sits with the target model's
# rows; `unattributed` is what free-before-weights minus the rows leaves.
BREAKDOWN = HELD[:5] + ("activation",) + HELD[5:] + ("unattributed", "other", "free")
# Held since the weights began to load: free memory before the weights load, less these and the
# free memory at the end, is what no row explains (the framework's part came before).
HELD_SINCE_WEIGHTS = ("weights", "kv_cache", "cuda_graph", "mamba_state", "draft_weights", "draft_kv_cache",
                      "draft_cuda_graph")

# The serving configuration a report states and a diff compares, in the report's order.
CONFIG_KEYS = ("framework_version", "model", "tp_size", "pp_size", "dp_size", "ep_size", "mem_fraction_static",
               "gpu_memory_utilization", "kv_cache_dtype", "max_model_len", "context_len",
               "max_running_requests", "page_size", "block_size", "quantization")

# Request lengths (tokens) of the concurrency table when `--token-lengths` is not given.
DEFAULT_TOKEN_LENGTHS = (4096, 6144, 8192)

# The printed KV sizes carry two decimals of GiB (SGLang's "GB" is GiB; vLLM's GiB): ± half of that.
PRINTED_GIB_ROUNDING = 0.005

_ELEMENT = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
            "bf16 or fp16": 2}  # the last: a width read from the log (kv-pool.dtype)


def element_size(dtype: Optional[str]) -> Optional[float]:
    """Bytes per KV element for a dtype as configs and logs spell it; None for fp4 and unknowns."""
    if not dtype:
        return None
    name = str(dtype).lower().replace("torch.", "")
    if "fp4" in name or "float4" in name or "nvfp4" in name:
        return None
    if "fp8" in name or "float8" in name or name in ("mxfp8", "int8", "uint8"):
        return 1
    return _ELEMENT.get(name)


def attention_layers(cfg: dict) -> tuple[int, str]:
    """(layers whose KV the token pool holds, how that was counted)."""
    total = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        full = sum(1 for t in types if str(t) in ("full_attention", "attention"))
        other = sorted({str(t) for t in types} - {"full_attention", "attention"})
        return full, f"{full} of {len(types)} layers are full attention (the rest: {', '.join(other) or 'none'})"
    interval = cfg.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0:
        return total // interval, f"every {interval}th of {total} layers is full attention"
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return pattern.count("*"), f"{pattern.count('*')} attention layers in hybrid_override_pattern"
    blocks = cfg.get("layers_block_type")
    if isinstance(blocks, list) and blocks:
        full = sum(1 for b in blocks if str(b) == "attention")
        return full, f"{full} of {len(blocks)} layers are attention (layers_block_type)"
    return total, ""


def attention_shape(cfg: dict) -> Optional[tuple[int, int]]:
    """(KV heads, head_dim) of an MHA/GQA layer; None when config.json lacks them (no
    num_attention_heads, or neither head_dim nor hidden_size)."""
    heads = cfg.get("num_key_value_heads") or cfg.get("num_attention_heads")
    if not heads or not (cfg.get("head_dim") or (cfg.get("hidden_size") and cfg.get("num_attention_heads"))):
        return None
    return heads, cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


@attrs.frozen
class KVCell:
    """One token's KV on one rank: its bytes, how they were counted, and the attention's shape."""
    bytes: float
    formula: str
    attention: str  # "mla": a latent every rank holds whole; "mha": heads split over attention TP
    layers: int
    kv_heads_per_rank: Optional[int] = None
    replication: int = 1  # copies of each KV head across the attention-TP ranks


def kv_cell(cfg: dict, element: float, attn_tp: int = 1, pp: int = 1) -> Optional[KVCell]:
    """The per-rank KV cell from config.json, as SGLang and vLLM size it, for KV elements of
    `element` bytes over `attn_tp` attention ranks and `pp` pipeline stages; None when
    config.json lacks the attention shape.

    - MHA/GQA: max(1, kv_heads // attn_tp) × (head_dim + v_head_dim) × layers × element; when
      kv_heads < attn_tp each rank keeps one head, stored attn_tp // kv_heads times.
    - MLA: (kv_lora_rank + qk_rope_head_dim) × layers × element on every rank; DSA (an indexer,
      fp8) adds the fp8 scales and the indexer row.
    - Hybrid models count their full-attention layers only; PP stages their share, rounded up.
    """
    layers, counted = attention_layers(cfg)
    if pp > 1:
        layers = -(-layers // pp)
        counted = "; ".join(c for c in (counted, f"÷ {pp} PP stages, rounded up (even split assumed)") if c)
    counted = f" ({counted})" if counted else ""
    if cfg.get("kv_lora_rank"):
        lora, rope = cfg["kv_lora_rank"], cfg.get("qk_rope_head_dim", 0)
        value, formula = (lora + rope) * layers * element, f"MLA: ({lora} + {rope}) × {layers} layers × {element} B"
        if cfg.get("index_head_dim") and element == 1:
            idx = cfg["index_head_dim"]
            value = (lora + lora // 128 * 4 + rope * 2 + idx + idx // 128 * 4) * layers
            formula = f"DSA fp8: ({lora} + {lora}/128×4 + {rope}×2 + indexer {idx} + {idx}/128×4) × {layers} layers"
        return KVCell(value, formula + counted + "; not split by TP: every rank holds the latent", "mla", layers)
    shape = attention_shape(cfg)
    if shape is None:
        return None
    heads, head_dim = shape
    v_head_dim = cfg.get("v_head_dim") or head_dim
    per_rank = max(1, heads // attn_tp)
    copies = attn_tp // heads if heads < attn_tp else 1
    formula = (f"max(1, {heads} KV heads // attn_tp {attn_tp}) = {per_rank} × ({head_dim} + {v_head_dim}) × "
               f"{layers} layers × {element} B" + counted)
    if copies > 1:
        formula += f"; {heads} KV heads over {attn_tp} ranks: each head is stored {copies} times"
    return KVCell(per_rank * (head_dim + v_head_dim) * layers * element, formula, "mha", layers, per_rank, copies)


@attrs.frozen
class ImpliedCell:
    """The bytes per token a printed KV size and token count imply, and the band the size's
    printed rounding leaves around it."""
    bytes: int
    low: int
    high: int
    formula: str


def implied_bytes_per_token(kv_gib: float, tokens: int) -> ImpliedCell:
    """KV bytes / tokens for a KV size printed in GiB to two decimals (± 0.005 GiB)."""
    low = (kv_gib - PRINTED_GIB_ROUNDING) * GIB / tokens
    high = (kv_gib + PRINTED_GIB_ROUNDING) * GIB / tokens
    value = round(kv_gib * GIB / tokens)
    return ImpliedCell(value, round(low), round(high),
                       f"{kv_gib} GiB × 2^30 / {tokens} tokens = {value} B (printed rounding: {low:.0f}–{high:.0f} B)")
