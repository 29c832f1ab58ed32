"""What the KV cache should cost per token, from config.json, beside what the log implies.

The per-rank cell, as SGLang and vLLM size it:
- MHA/GQA: max(1, kv_heads // attn_tp) × (head_dim + v_head_dim) × layers × element size.
  When kv_heads < attn_tp each rank keeps one head, replicated attn_tp // kv_heads times.
- MLA (DeepSeek-V2/V3, Kimi-K2): (kv_lora_rank + qk_rope_head_dim) × layers × element size,
  on every rank (not split by TP). DSA (with an indexer) adds fp8 scales and the indexer row.
- Hybrid models count only their full-attention layers; PP stages only their own layers.
- DeepSeek-V4's compressed sliding-window KV has no per-token cell to compute.
"""
from __future__ import annotations

from typing import Callable, Optional

import attrs

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import line_ref

_ELEMENT = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "bf16 or fp16": 2}


# A KV dtype told only by its width (kv-pool.dtype infers one from the log's bytes per token;
# no KV cache of SGLang or vLLM is 1 byte wide but fp8's)
_BY_WIDTH = {1: "fp8", 2: "bf16 or fp16", 4: "fp32"}


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


def _is_compressed_swa(cfg: dict) -> bool:
    text = " ".join(str(cfg.get(k, "")) for k in ("model_type", "architectures")).lower()
    return "deepseek_v4" in text or "deepseekv4" in text or "compress_ratios" in cfg


@attrs.frozen
class _Cell:
    """The KV elements one token takes on one rank, and how they were counted: `formula(elem)`
    is the arithmetic with an element size of `elem` bytes."""

    elements: int
    formula: Callable[[float], str]
    detail: dict
    note: str  # how the layers were counted, as " (…)", or ""


def _cell(kb, model: F.ModelConfig) -> "_Cell | str":
    """The per-rank KV cell of the model config.json describes, without the element size;
    the reason as a string when there is none to compute (DeepSeek-V4's compressed KV, DSA's
    fp8-only cell, no attention shape)."""
    cfg = model.fields
    if _is_compressed_swa(cfg):
        return ("DeepSeek-V4 compresses KV (CSA/HCA sliding windows): no per-token cell to compute; the log's "
                "bytes_per_full_token already holds the compression (for V4.1, 528 B / 288 B are the stored per-token "
                "payload and scale values, not the allocation after page padding)")
    tp = kb.value("config", "tp_size") or 1
    pp = kb.value("config", "pp_size") or 1
    dp = kb.value("config", "dp_size") or 1
    attn_tp = tp // dp if kb.value("config", "enable_dp_attention") and dp > 1 else tp
    layers, counted = attention_layers(cfg)
    if pp > 1:
        layers = -(-layers // pp)
        counted = "; ".join(c for c in (counted, f"÷ {pp} PP stages, rounded up (even split assumed)") if c)
    note = f" ({counted})" if counted else ""
    if cfg.get("kv_lora_rank"):
        lora, rope = cfg["kv_lora_rank"], cfg.get("qk_rope_head_dim", 0)
        return _Cell((lora + rope) * layers,
                     lambda elem: f"MLA: ({lora} + {rope}) × {layers} layers × {elem} B{note}; not split by TP: every "
                                  "rank holds the latent", {"attention": "mla", "layers": layers, "replication": 1},
                     note)
    shape = attention_shape(cfg)
    if shape is None:
        return "config.json lacks the attention shape (num_attention_heads, and head_dim or hidden_size)"
    heads, head_dim = shape
    v_head_dim = cfg.get("v_head_dim") or head_dim
    per_rank = max(1, heads // attn_tp)
    copies = attn_tp // heads if heads < attn_tp else 1
    shared = f"; {heads} KV heads over {attn_tp} ranks: each head is stored {copies} times" if copies > 1 else ""
    return _Cell(per_rank * (head_dim + v_head_dim) * layers,
                 lambda elem: f"max(1, {heads} KV heads // attn_tp {attn_tp}) = {per_rank} × ({head_dim} + {v_head_dim}) "
                              f"× {layers} layers × {elem} B{note}{shared}",
                 {"attention": "mha", "kv_heads_per_rank": per_rank, "replication": copies, "layers": layers}, note)


@rule("kv-pool.theoretical",
      reads=(F.ModelConfig, "kv_pool:dtype", "config:tp_size", "config:pp_size", "config:dp_size", "config:enable_dp_attention?"),
      concludes=("kv_pool:theoretical_bytes_per_token",))
def theoretical(kb):
    """Theoretical KV bytes per token per rank from config.json (see the module text for the
    formulas), with the KV dtype the log states (else the model's dtype for `auto`). Says how
    many copies of a KV head exist when kv_heads < TP, and refuses a figure for DeepSeek-V4's
    compressed KV, whose `bytes_per_full_token` the log prints instead."""
    model = kb.first(F.ModelConfig, role=None)
    if model is None:
        return
    cfg = model.fields
    if _is_compressed_swa(cfg):
        yield Derived("kv_pool", "theoretical_bytes_per_token", Unknown(_cell(kb, model)), "kv-pool.theoretical", (model,))
        return
    dtype_d = kb.get("kv_pool", "dtype")
    elem = element_size(dtype_d.value) if dtype_d is not None and dtype_d.known else None
    if elem is None:
        yield Derived("kv_pool", "theoretical_bytes_per_token",
                      Unknown("the KV element size is unknown (dtype not stated, or fp4 with block scales)"),
                      "kv-pool.theoretical", (model,) + ((dtype_d,) if dtype_d else ()))
        return
    cell = _cell(kb, model)
    premises = tuple(p for p in (model, dtype_d, kb.get("config", "tp_size")) if p is not None)
    if isinstance(cell, str):
        yield Derived("kv_pool", "theoretical_bytes_per_token", Unknown(cell), "kv-pool.theoretical", premises)
        return
    if cfg.get("kv_lora_rank") and cfg.get("index_head_dim") and elem == 1:
        lora, rope, idx = cfg["kv_lora_rank"], cfg.get("qk_rope_head_dim", 0), cfg["index_head_dim"]
        layers = cell.detail["layers"]
        row = lora + lora // 128 * 4 + rope * 2 + idx + idx // 128 * 4
        yield Derived("kv_pool", "theoretical_bytes_per_token", row * layers, "kv-pool.theoretical", premises,
                      f"DSA fp8: ({lora} + {lora}/128×4 + {rope}×2 + indexer {idx} + {idx}/128×4) × {layers} layers"
                      f"{cell.note}; not split by TP: every rank holds the latent", cell.detail)
        return
    yield Derived("kv_pool", "theoretical_bytes_per_token", cell.elements * elem, "kv-pool.theoretical", premises,
                  cell.formula(elem), cell.detail)


@rule("kv-pool.dtype",
      reads=(F.KVCacheAllocated, F.KVCacheDtype, F.LoadWeightEnd, F.VllmEngineConfig, F.ModelConfig, "config:kv_cache_dtype",
             "kv_pool:bytes_per_token?", "config:tp_size?", "config:pp_size?", "config:dp_size?",
             "config:enable_dp_attention?"),
      concludes=("kv_pool:dtype",))
def kv_dtype(kb):
    """The KV element type in use: what the log's KV lines print, else the configured
    kv_cache_dtype, else — for a stated `auto` — the model's dtype (the weight-load line, vLLM's
    engine config, or config.json). A log that states neither leaves it unknown: `auto` is
    never assumed. With config.json, the width is then read from the log's own bytes per token
    instead: the one of 1, 2 or 4 bytes whose cell falls inside the printed rounding of that
    figure, when exactly one does."""
    printed = next((f for f in kb.of(F.KVCacheAllocated, F.KVCacheDtype, role=None) if getattr(f, "dtype", None)),
                   None)
    if printed is not None:
        yield Derived("kv_pool", "dtype", printed.dtype, "kv-pool.dtype", (printed,), f"printed ({line_ref(printed)})")
        return
    configured = kb.get("config", "kv_cache_dtype")
    if configured is not None and configured.known and str(configured.value) != "auto":
        yield Derived("kv_pool", "dtype", configured.value, "kv-pool.dtype", (configured,), "configured kv_cache_dtype")
        return
    if configured is None or not configured.known:  # `auto` is a setting the log must state, not a default to assume
        yield _by_width(kb, "the log prints no KV dtype and states no kv_cache_dtype")
        return
    loaded = next((f for f in kb.of(F.LoadWeightEnd, role=None) if f.dtype), None)
    engine = kb.first(F.VllmEngineConfig, role=None)
    model = kb.first(F.ModelConfig, role=None)
    candidates = [(loaded, loaded.dtype if loaded else None, "the weights' dtype (Load weight end)"),
                  (engine, engine.fields.get("dtype") if engine else None, "the model dtype (engine config)"),
                  (model, (model.fields.get("torch_dtype") or model.fields.get("dtype")) if model else None,
                   "the model's dtype (config.json)")]
    for fact, dtype, what in candidates:
        if isinstance(dtype, str) and element_size(dtype) is not None:
            premises = (fact,) + ((configured,) if configured is not None else ())
            yield Derived("kv_pool", "dtype", dtype, "kv-pool.dtype", premises, f"auto: {what}")
            return
    if model is not None:
        yield _by_width(kb, "no KV dtype printed or configured, and config.json names no dtype")


def _by_width(kb, unstated: str) -> Derived:
    """The KV dtype by its width: the log's bytes per token over config.json's elements per
    token, when exactly one of 1, 2 and 4 bytes fits the printed rounding (and the pool's
    padding page, as kv-pool.compare allows); else unknown, saying why."""
    model, log = kb.first(F.ModelConfig, role=None), kb.get("kv_pool", "bytes_per_token")
    if model is None:
        return Derived("kv_pool", "dtype", Unknown(unstated), "kv-pool.dtype", ())
    if log is None or not log.known or not log.value:
        return Derived("kv_pool", "dtype", Unknown(f"{unstated}; the log prints no KV size and token count to read "
                                                   "its width from"), "kv-pool.dtype", (model,))
    cell = _cell(kb, model)
    if isinstance(cell, str):
        return Derived("kv_pool", "dtype", Unknown(f"{unstated}; no width to read: {cell}"), "kv-pool.dtype", (model, log))
    if cell.detail.get("attention") == "mla" and model.fields.get("index_head_dim"):
        return Derived("kv_pool", "dtype", Unknown(f"{unstated}; DSA's cell holds fp8 scales and an indexer row: "
                                                   "its width is not a multiple of one element"), "kv-pool.dtype",
                       (model, log))
    low, high = log.detail.get("low", log.value) / 1.002, log.detail.get("high", log.value) * 1.002
    fits = [w for w in sorted(_BY_WIDTH) if low <= cell.elements * w <= high]
    band = f"{log.value} B a token (printed rounding {log.detail.get('low', log.value)}–{log.detail.get('high', log.value)} B)"
    if len(fits) != 1:
        why = (f"{' and '.join(f'{w} B' for w in fits)} all fit" if fits else
               f"{log.value / cell.elements:.3g} B an element, no width of 1, 2 or 4 B")
        return Derived("kv_pool", "dtype", Unknown(f"{unstated}; the log's {band} over config.json's "
                                                   f"{cell.elements} elements a token: {why}"), "kv-pool.dtype",
                       (model, log))
    width = fits[0]
    return Derived("kv_pool", "dtype", _BY_WIDTH[width], "kv-pool.dtype", (model, log),
                   f"by width: config.json's cell {cell.formula(width)} = {cell.elements * width} B fits the log's "
                   f"{band}; only {width} B an element does", {"inferred": True})


@rule("kv-pool.compare",
      reads=(F.ModelConfig, "kv_pool:bytes_per_token", "kv_pool:theoretical_bytes_per_token", "breakdown:draft_kv_cache?"),
      concludes=("kv_pool:comparison",))
def compare(kb):
    """The log's implied bytes per token against the theoretical figure, and what explains a
    difference: SGLang's pool holds one padding page (K size covers tokens + page); a draft
    model, hybrid or sliding-window layers, or a different KV dtype change the cell; anything
    else is reported as unexplained."""
    log = kb.get("kv_pool", "bytes_per_token")
    theory = kb.get("kv_pool", "theoretical_bytes_per_token")
    if log is None or theory is None or not log.known or not theory.known or not theory.value:
        return
    ratio = log.value / theory.value
    low, high = log.detail.get("low", log.value), log.detail.get("high", log.value)
    if low <= theory.value * 1.002 and high >= theory.value * 0.998 or abs(ratio - 1) <= 0.002:
        why = "matches within the printed rounding and the pool's padding page"
    elif 1 < ratio <= 1.01:
        why = "slightly above: the padding page and block/page rounding"
    elif kb.get("breakdown", "draft_kv_cache") is not None:
        why = "a draft model's layers share the token budget"
    elif theory.detail.get("layers") and kb.first(F.ModelConfig, role=None) is not None and \
            attention_layers(kb.first(F.ModelConfig, role=None).fields)[0] != \
            kb.first(F.ModelConfig, role=None).fields["num_hidden_layers"]:
        why = "the model is hybrid: the figure counts full-attention layers only, the log's pool may hold more"
    else:
        why = "unexplained: check the KV dtype, the TP/DP attention split and the layer count"
    yield Derived("kv_pool", "comparison", {"ratio": round(ratio, 4), "explanation": why}, "kv-pool.compare",
                  (log, theory), f"log {log.value} B / theoretical {theory.value} B = {ratio:.4f}: {why}")
