"""One token's KV and one request's recurrent state on a rank, per attention kind, as SGLang
and vLLM size them.

- MHA/GQA (full or sliding-window layers): `max(1, kv_heads // attn_tp) × (head_dim +
  v_head_dim) × element` per layer; with fewer KV heads than ranks each rank keeps one head.
- MLA: one latent of `kv_lora_rank + qk_rope_head_dim` elements per layer on every rank (not
  split by TP); DSA with an fp8 cache stores the latent as fp8 with fp32 scales per 128, the
  rope part in bf16, and an fp8 indexer key with its scales: `lora + lora/128·4 + rope·2 +
  index + index/128·4` bytes.
- Recurrent layers (Gated DeltaNet, Mamba-2) keep, per request, a convolution window
  (`conv_channels / tp × (kernel − 1)` elements of the model dtype) and an SSM state
  (`heads / tp × head_dim × state_dim` elements, fp32 unless the config says otherwise).
Pipeline stages hold their share of the layers, rounded up.
"""
from __future__ import annotations

from typing import Optional

from capdiag.frozen import frozen
from capdiag.memory.shape import Attention, Recurrent


@frozen
class Cell:
    """The bytes one token takes in the layers of one attention kind on one rank."""
    kind: str
    layers: int  # on this rank
    per_layer: float  # bytes per token in one layer
    kv_heads_per_rank: int
    replication: int  # copies of each KV head across the attention ranks
    window: Optional[int]
    formula: str

    @property
    def bytes(self) -> float:
        return whole(self.per_layer * self.layers)


def whole(value: float) -> float:
    """A byte count as an int when it is one (131072, not 131072.0, in every report)."""
    return int(value) if float(value).is_integer() else value


def cell(attention: Attention, element: float, attn_tp: int = 1, pp: int = 1, raw_latent: bool = False) -> Cell:
    """`raw_latent`: SGLang on ROCm sizes a DSA fp8 pool by the raw latent (lora + rope bytes, no
    scales) plus the indexer (sglang/001: 3,262,823 tokens from 167.8 GiB at 708 B a layer)."""
    layers = -(-len(attention.layers) // pp)
    stage = f" ÷ {pp} stages" if pp > 1 else ""
    if attention.kind == "mla":
        lora, rope, index = attention.kv_lora_rank, attention.rope_dim, attention.index_head_dim
        if index and element == 1 and raw_latent:
            per = lora + rope + index + index // 128 * 4
            formula = f"DSA fp8 as SGLang on ROCm sizes it: ({lora} + {rope} + indexer {index} + {index}/128×4) × {layers} layers"
        elif index and element == 1:
            per = lora + lora // 128 * 4 + rope * 2 + index + index // 128 * 4
            formula = f"DSA fp8: ({lora} + {lora}/128×4 + {rope}×2 + indexer {index} + {index}/128×4) × {layers} layers"
        else:
            per = (lora + rope) * element
            formula = f"MLA: ({lora} + {rope}) × {layers} layers × {element:g} B"
        return Cell("mla", layers, per, 0, 1, None, f"{formula}{stage}; not split by TP: every rank holds the latent")
    heads = attention.kv_heads
    per_rank = max(1, heads // attn_tp)
    copies = attn_tp // heads if heads < attn_tp else 1
    per = per_rank * (attention.head_dim + attention.v_head_dim) * element
    kind = "" if attention.kind == "full" else f" {attention.kind}"
    formula = (f"max(1, {heads} KV heads // attn_tp {attn_tp}) = {per_rank} × ({attention.head_dim} + "
               f"{attention.v_head_dim}) × {layers}{kind} layers{stage} × {element:g} B")
    if copies > 1:
        formula += f"; {heads} KV heads over {attn_tp} ranks: each head is stored {copies} times"
    return Cell(attention.kind, layers, per, per_rank, copies, attention.window, formula)


@frozen
class State:
    """One request's recurrent state on one rank."""
    layers: int
    conv_bytes: float  # per layer
    ssm_bytes: float  # per layer
    formula: str

    @property
    def bytes(self) -> float:
        return whole((self.conv_bytes + self.ssm_bytes) * self.layers)


def state(recurrent: Recurrent, dtype_bytes: float, tp: int = 1, pp: int = 1) -> State:
    layers = -(-len(recurrent.layers) // pp)
    conv = recurrent.conv_channels / tp * (recurrent.conv_kernel - 1) * dtype_bytes
    ssm = recurrent.ssm_heads / tp * recurrent.head_dim * recurrent.state_dim * recurrent.ssm_bytes
    return State(layers, conv, ssm,
                 f"{layers} {recurrent.kind} layers × (conv {recurrent.conv_channels}/{tp} × {recurrent.conv_kernel - 1}"
                 f" × {dtype_bytes:g} B + SSM {recurrent.ssm_heads}/{tp} × {recurrent.head_dim} × "
                 f"{recurrent.state_dim} × {recurrent.ssm_bytes:g} B)")


@frozen
class PoolCell:
    """The cell of a framework's main (full-attention) token pool from config.json: what one
    token takes there on one rank, with the attention's shape; sliding-window layers, which
    hybrid pools hold apart, are counted beside it."""
    bytes: float
    formula: str
    attention: str  # "mla" or "mha"
    layers: int
    kv_heads_per_rank: Optional[int]
    replication: int
    sliding_bytes: float = 0.0


def pool_cell(cfg: dict, element: float, attn_tp: int = 1, pp: int = 1) -> Optional[PoolCell]:
    """None when config.json lacks the attention shape."""
    from capdiag.memory.shape import kv_layers

    found = kv_layers(cfg)
    if not found or not found[0]:
        return None
    attention, read = found
    cells = [cell(a, element, attn_tp, pp) for a in attention]
    main = [c for c in cells if c.kind != "sliding"] or cells
    sliding = sum(c.bytes for c in cells if c.kind == "sliding") if main is not cells else 0.0
    first = main[0]
    formula = " + ".join(c.formula for c in main)
    if read != "every layer is full attention":
        formula += f" ({read})"
    if sliding:
        formula += f"; the sliding-window layers' {sliding:,.0f} B a token sit in their own pool"
    return PoolCell(whole(sum(c.bytes for c in main)), formula, "mla" if first.kind == "mla" else "mha",
                    sum(c.layers for c in main), first.kv_heads_per_rank if first.kind != "mla" else None,
                    first.replication, sliding)
