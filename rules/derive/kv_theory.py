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

from typing import Optional

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import line_ref
from capdiag.memory.kv import pool_cell
from capdiag.vocabulary import element_size


def _is_compressed_swa(cfg: dict) -> bool:
    text = " ".join(str(cfg.get(k, "")) for k in ("model_type", "architectures")).lower()
    return "deepseek_v4" in text or "deepseekv4" in text or "compress_ratios" in cfg


@rule("kv-pool.theoretical",
      reads=(F.ModelConfig, "kv_pool:dtype", "config:tp_size", "config:pp_size", "config:dp_size", "config:enable_dp_attention?"),
      concludes=("kv_pool:theoretical_bytes_per_token",))
def theoretical(kb):
    """What it concludes: `kv_pool.theoretical_bytes_per_token`: what one token's KV should take per
    rank, from config.json.

    How: Theoretical KV bytes per token per rank from config.json (see the module text for the
    formulas), with the KV dtype the log states (else the model's dtype for `auto`). Says how many
    copies of a KV head exist when kv_heads < TP, and refuses a figure for DeepSeek-V4's compressed
    KV, whose `bytes_per_full_token` the log prints instead.

    Example: Llama-3.1-8B: 8 KV heads × (128 + 128) × 32 layers × 2 B = 131072 B."""
    model = kb.first(F.ModelConfig, role=None)
    if model is None:
        return
    cfg = model.fields
    if _is_compressed_swa(cfg):
        yield Derived("kv_pool", "theoretical_bytes_per_token", Unknown(
            "DeepSeek-V4 compresses KV (CSA/HCA sliding windows): no per-token cell to compute; the log's "
            "bytes_per_full_token already holds the compression (for V4.1, 528 B / 288 B are the stored per-token "
            "payload and scale values, not the allocation after page padding)"), "kv-pool.theoretical", (model,))
        return
    dtype_d = kb.get("kv_pool", "dtype")
    elem = element_size(dtype_d.value) if dtype_d is not None and dtype_d.known else None
    if elem is None:
        yield Derived("kv_pool", "theoretical_bytes_per_token",
                      Unknown("the KV element size is unknown (dtype not stated, or fp4 with block scales)"),
                      "kv-pool.theoretical", (model,) + ((dtype_d,) if dtype_d else ()))
        return
    premises = tuple(p for p in (model, dtype_d, kb.get("config", "tp_size")) if p is not None)
    split = _split(kb)
    if split is None:
        yield Derived("kv_pool", "theoretical_bytes_per_token", Unknown(_UNSPLIT), "kv-pool.theoretical", premises)
        return
    cell = pool_cell(cfg, elem, *split)
    if cell is None:
        yield Derived("kv_pool", "theoretical_bytes_per_token", Unknown(
            "config.json lacks the attention shape (num_attention_heads, and head_dim or hidden_size)"),
            "kv-pool.theoretical", premises)
        return
    detail = ({"attention": "mla", "layers": cell.layers, "replication": 1} if cell.attention == "mla" else
              {"attention": "mha", "kv_heads_per_rank": cell.kv_heads_per_rank, "replication": cell.replication,
               "layers": cell.layers})
    yield Derived("kv_pool", "theoretical_bytes_per_token", cell.bytes, "kv-pool.theoretical", premises, cell.formula,
                  detail)


def _split(kb) -> Optional[tuple[int, int]]:
    """(attention ranks a layer's heads are split over, pipeline stages); None when the log does
    not state the TP or PP size (a rank's heads and layers depend on both: no default of 1). DP
    matters only under DP attention, which states it."""
    tp, pp = kb.value("config", "tp_size"), kb.value("config", "pp_size")
    if not isinstance(tp, int) or not isinstance(pp, int) or tp < 1 or pp < 1:
        return None
    dp = kb.value("config", "dp_size")
    if kb.value("config", "enable_dp_attention") and isinstance(dp, int) and dp > 1:
        return tp // dp, pp
    return tp, pp


_UNSPLIT = "needs the log's tp_size and pp_size: the KV heads and layers a rank holds depend on them"


def model_dtype(kb) -> Optional[tuple[F.Fact, str, str]]:
    """(fact, dtype, where it is stated) of the model's dtype, which `auto` KV takes: the
    weight-load line, vLLM's engine config, or config.json; None when none states one."""
    loaded = next((f for f in kb.of(F.LoadWeightEnd, role=None) if f.dtype), None)
    engine = kb.first(F.VllmEngineConfig, role=None)
    model = kb.first(F.ModelConfig, role=None)
    candidates = [(loaded, loaded.dtype if loaded else None, "the weights' dtype (Load weight end)"),
                  (engine, engine.fields.get("dtype") if engine else None, "the model dtype (engine config)"),
                  (model, (model.fields.get("torch_dtype") or model.fields.get("dtype")) if model else None,
                   "the model's dtype (config.json)")]
    return next(((fact, dtype, what) for fact, dtype, what in candidates
                 if isinstance(dtype, str) and element_size(dtype) is not None), None)


@rule("kv-pool.dtype",
      reads=(F.KVCacheAllocated, F.KVCacheDtype, F.LoadWeightEnd, F.VllmEngineConfig, F.ModelConfig, "config:kv_cache_dtype",
             "kv_pool:bytes_per_token?", "config:tp_size?", "config:pp_size?", "config:dp_size?",
             "config:enable_dp_attention?"),
      concludes=("kv_pool:dtype",))
def kv_dtype(kb):
    """What it concludes: `kv_pool.dtype`: the KV cache's element type.

    How: The KV element type in use: what the log's KV lines print, else the configured
    kv_cache_dtype, else — for a stated `auto` — the model's dtype (the weight-load line, vLLM's
    engine config, or config.json). A log that states neither leaves it unknown: `auto` is never
    assumed. With config.json, the width is then read from the log's own bytes per token
    instead: the one of 1, 2 or 4 bytes whose cell falls inside the printed rounding of that
    figure, when exactly one does.

    Example: `KV Cache is allocated. dtype: torch.bfloat16, #tokens: 415615`, or
    `kv_cache_dtype='auto'` with `Load weight end. … dtype=torch.bfloat16`."""
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
    found = model_dtype(kb)
    if found is not None:
        fact, dtype, what = found
        premises = (fact,) + ((configured,) if configured is not None else ())
        yield Derived("kv_pool", "dtype", dtype, "kv-pool.dtype", premises, f"auto: {what}")
        return
    if kb.first(F.ModelConfig, role=None) is not None:
        yield _by_width(kb, "no KV dtype printed or configured, and config.json names no dtype")


# A KV dtype told only by its width (no KV cache of SGLang or vLLM is 1 byte wide but fp8's)
_BY_WIDTH = {1: "fp8", 2: "bf16 or fp16", 4: "fp32"}


def _by_width(kb, unstated: str) -> Derived:
    """The KV dtype by its width: the log's bytes per token over config.json's elements per
    token, when exactly one of 1, 2 and 4 bytes fits the printed rounding (and the pool's
    padding page, as kv-pool.compare allows); else unknown, saying why."""
    model = kb.first(F.ModelConfig, role=None)
    if model is None:  # (the bytes per token not even read: nothing to read them against)
        return Derived("kv_pool", "dtype", Unknown(unstated), "kv-pool.dtype", ())
    log = kb.get("kv_pool", "bytes_per_token")
    if log is None or not log.known or not log.value:
        return Derived("kv_pool", "dtype", Unknown(f"{unstated}; the log prints no KV size and token count to read "
                                                   "its width from"), "kv-pool.dtype", (model,))
    cfg = model.fields
    why = ("DeepSeek-V4 compresses KV: no per-token cell" if _is_compressed_swa(cfg) else
           "DSA's cell holds fp8 scales and an indexer row, not a whole number of elements"
           if cfg.get("kv_lora_rank") and cfg.get("index_head_dim") else None)
    split = _split(kb)
    why = why or (None if split is not None else _UNSPLIT)
    cells = {} if why else {w: pool_cell(cfg, w, *split) for w in _BY_WIDTH}
    if not why and None in cells.values():
        why = "config.json lacks the attention shape (num_attention_heads, and head_dim or hidden_size)"
    if why:
        return Derived("kv_pool", "dtype", Unknown(f"{unstated}; no width to read: {why}"), "kv-pool.dtype",
                       (model, log))
    low, high = log.detail.get("low", log.value), log.detail.get("high", log.value)
    fits = [w for w, cell in cells.items() if low / 1.002 <= cell.bytes <= high * 1.002]
    band = f"{log.value} B a token (printed rounding {low}–{high} B)"
    if len(fits) != 1:
        elements = cells[1].bytes
        why = (f"{' and '.join(f'{w} B' for w in fits)} all fit" if fits else
               f"{log.value / elements:.3g} B an element, no width of 1, 2 or 4 B")
        return Derived("kv_pool", "dtype", Unknown(f"{unstated}; the log's {band} over config.json's {elements} "
                                                   f"elements a token: {why}"), "kv-pool.dtype", (model, log))
    cell = cells[fits[0]]
    return Derived("kv_pool", "dtype", _BY_WIDTH[fits[0]], "kv-pool.dtype", (model, log),
                   f"by width: config.json's cell {cell.formula} = {cell.bytes} B fits the log's {band}; only "
                   f"{fits[0]} B an element does", {"inferred": True})


@rule("kv-pool.compare",
      reads=(F.ModelConfig, "kv_pool:bytes_per_token", "kv_pool:theoretical_bytes_per_token", "breakdown:draft_kv_cache?"),
      concludes=("kv_pool:comparison",))
def compare(kb):
    """What it concludes: `kv_pool.comparison`: the log's implied bytes per token against the
    theoretical figure, and what explains a difference.

    How: The log's implied bytes per token against the theoretical figure, and what explains a
    difference: SGLang's pool holds one padding page (K size covers tokens + page); a draft model,
    hybrid or sliding-window layers, or a different KV dtype change the cell; anything else is
    reported as unexplained.

    Example: 131087 B implied against 131072 B theoretical: within the printed rounding and the
    padding page."""
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
            theory.detail["layers"] != kb.first(F.ModelConfig, role=None).fields["num_hidden_layers"]:
        why = "the model is hybrid: the figure counts full-attention layers only, the log's pool may hold more"
    else:
        why = "unexplained: check the KV dtype, the TP/DP attention split and the layer count"
    yield Derived("kv_pool", "comparison", {"ratio": round(ratio, 4), "explanation": why}, "kv-pool.compare",
                  (log, theory), f"log {log.value} B / theoretical {theory.value} B = {ratio:.4f}: {why}")
