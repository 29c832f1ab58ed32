"""A model's shape from config.json, as SGLang and vLLM build it: which layers hold KV (full,
sliding-window, MLA), which hold recurrent state (Gated DeltaNet, Mamba-2), and the parameter
groups of every layer with the way tensor parallelism splits them.

Parameter groups carry the module names checkpoints use (`model.layers.3.self_attn.q_proj`,
`lm_head`), because a quantized checkpoint's config lists the modules it left unconverted by
those names. A group is split one of four ways over TP ranks:
- `tp`: column- or row-parallel linears, routed experts (TP-sharded or, with expert
  parallelism, whole experts per rank: the bytes per rank are the same), vocab-parallel
  embeddings (the vocabulary padded to a multiple of 64 per rank);
- `kv`: K and V projections, whose heads are split but never below one per rank (with fewer KV
  heads than ranks, each rank keeps one head: `max(1, heads // tp)` of `heads`);
- `replicated`: norms, routers, MLA's down-projections (`q_a_proj`, `kv_a_proj_with_mqa`), the
  DSA indexer, which every rank holds whole;
- `vocab`: embeddings and the LM head (padded vocabulary, then split).

What the shape cannot tell (an architecture whose layers it does not know) is an error string,
never a guess.
"""
from __future__ import annotations

from typing import Optional

import attrs

from capdiag.frozen import frozen

VOCAB_PADDING = 64  # vLLM and SGLang pad a vocab-parallel table to a multiple of 64 rows per rank


@frozen
class Params:
    """One parameter tensor group: its module name, its parameter count in the whole model, how
    TP splits it, and whether quantization may convert it (a linear layer's weight matrix)."""
    name: str
    count: int
    split: str  # "tp" | "kv" | "replicated" | "vocab"
    linear: bool = True
    parts: int = 0  # "kv": the KV heads the count holds; "vocab": the table's rows
    expert: bool = False
    dims: tuple[int, ...] = ()  # routed experts: (hidden, intermediate), which some formats pad


@frozen
class Attention:
    """One kind of attention layer and what one token of it stores: heads × (K dim + V dim), or
    MLA's one latent (kv_lora_rank + qk_rope_head_dim elements, not split by TP)."""
    kind: str  # "full" | "sliding" | "mla"
    layers: tuple[int, ...]  # the layer indices of this kind
    kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    window: Optional[int] = None
    kv_lora_rank: int = 0
    rope_dim: int = 0
    index_head_dim: int = 0  # DSA's indexer (an fp8 key per token and layer)


@frozen
class Recurrent:
    """Linear-attention or Mamba-2 layers: the state one request keeps in each, at TP 1 — a
    convolution window (conv_channels × (kernel − 1) elements of the model dtype) and an SSM
    state (heads × head_dim × state_dim elements of `ssm_bytes`)."""
    kind: str  # "gdn" | "mamba2"
    layers: tuple[int, ...]
    conv_channels: int
    conv_kernel: int
    ssm_heads: int
    head_dim: int
    state_dim: int
    ssm_bytes: float


@frozen
class Shape:
    model_type: str
    hidden: int
    layers: int
    vocab: int
    dtype: Optional[str]  # the checkpoint's dtype as config.json names it
    attention: tuple[Attention, ...]
    recurrent: Optional[Recurrent]
    params: tuple[Params, ...]
    heads: int  # query heads (a TP size must divide them)
    kv_heads: int  # KV heads of the full-attention layers (0 for MLA)
    experts: int
    max_position: Optional[int]
    intermediate: int  # the dense MLP's width (0 when every layer is MoE)
    topk: int = 0  # experts a token is routed to
    expert_intermediate: int = 0
    notes: tuple[str, ...] = ()

    @property
    def attention_layers(self) -> int:
        return sum(len(a.layers) for a in self.attention)

    def of(self, kind: str) -> Optional[Attention]:
        return next((a for a in self.attention if a.kind == kind), None)

    @property
    def parameters(self) -> int:
        return sum(p.count for p in self.params)


def _int(cfg: dict, *keys: str, default: Optional[int] = None) -> Optional[int]:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def _layer_kinds(cfg: dict, layers: int) -> tuple[list[str], str]:
    """Each layer's mixer: "full", "sliding", "linear" (Gated DeltaNet, KDA), "mamba", or "mlp"
    for a layer that is only an MLP (Nemotron-H), and how that was read."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        table = {"full_attention": "full", "attention": "full", "sliding_attention": "sliding",
                 "chunked_attention": "sliding", "linear_attention": "linear", "mamba": "mamba", "mamba2": "mamba"}
        kinds = [table.get(str(t), "?" + str(t)) for t in types]
        return kinds, "layer_types"
    interval = _int(cfg, "full_attention_interval")
    if interval:
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(layers)], \
            f"every {interval}th of {layers} layers is full attention (full_attention_interval)"
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) == layers:  # Nemotron-H: one block a layer, MLPs their own
        table = {"*": "full", "M": "mamba", "-": "mlp", "E": "mlp"}
        return [table.get(c, "?" + c) for c in pattern], "hybrid_override_pattern"
    blocks = cfg.get("layers_block_type")
    if isinstance(blocks, list) and len(blocks) == layers:
        return ["full" if str(b) == "attention" else "mamba" for b in blocks], "layers_block_type"
    model_type = str(cfg.get("model_type", ""))
    window = _int(cfg, "sliding_window")
    if model_type == "gemma2" and window:
        return ["sliding" if i % 2 == 0 else "full" for i in range(layers)], "Gemma-2: every other layer slides"
    if model_type.startswith("gemma3") and window:
        every = _int(cfg, "sliding_window_pattern", default=6)
        return ["full" if (i + 1) % every == 0 else "sliding" for i in range(layers)], \
            f"Gemma-3: every {every}th layer is full attention"
    if window and cfg.get("use_sliding_window") is True and model_type.startswith(("mistral", "mixtral")):
        return ["sliding"] * layers, "sliding_window on every layer"
    return ["full"] * layers, "every layer is full attention"


def experts_of(cfg: dict) -> int:
    """Routed experts a layer of this config holds (0 for a dense model)."""
    return _int(cfg, "n_routed_experts", "num_local_experts", "num_experts", default=0) or 0


def _is_moe_layer(cfg: dict, i: int) -> bool:
    if not experts_of(cfg) or cfg.get("enable_moe_block") is False:
        return False
    if i < (_int(cfg, "first_k_dense_replace", default=0) or 0):
        return False
    if i in (cfg.get("mlp_only_layers") or []):
        return False
    step = _int(cfg, "decoder_sparse_step", "moe_layer_freq", default=1) or 1
    return (i + 1) % step == 0


def _mlp(cfg: dict, i: int, h: int, prefix: str) -> list[Params]:
    model_type = str(cfg.get("model_type", ""))
    if not _is_moe_layer(cfg, i):
        inter = _int(cfg, "intermediate_size")
        return [Params(f"{prefix}.mlp.gate_up_proj", 2 * h * inter, "tp"),
                Params(f"{prefix}.mlp.down_proj", inter * h, "tp")]
    experts = experts_of(cfg)
    inter = _int(cfg, "moe_intermediate_size", "expert_intermediate_size", "intermediate_size")
    block = "block_sparse_moe" if model_type.startswith(("mixtral", "minimax")) else "mlp"
    router = f"{prefix}.mlp.router" if model_type == "gpt_oss" else f"{prefix}.{block}.gate"
    out = [Params(f"{prefix}.{block}.experts", experts * 3 * h * inter, "tp", expert=True, dims=(h, inter)),
           Params(router, h * experts, "replicated")]
    shared = _int(cfg, "shared_expert_intermediate_size")
    if shared:
        out.append(Params(f"{prefix}.mlp.shared_expert", 3 * h * shared, "tp"))
    elif (n := _int(cfg, "n_shared_experts", default=0)):
        out.append(Params(f"{prefix}.mlp.shared_experts", n * 3 * h * inter, "tp"))
    return out


def _gqa(cfg: dict, h: int, heads: int, kv: int, hd: int, prefix: str, v_proj: bool = True) -> list[Params]:
    gate = 2 if cfg.get("attn_output_gate") else 1  # Qwen3-Next/3.5: the query projection also gives a gate
    bias = cfg.get("attention_bias") is True or str(cfg.get("model_type", "")) == "qwen2"
    out = [Params(f"{prefix}.self_attn.q_proj", gate * h * heads * hd + (heads * hd if bias else 0), "tp"),
           Params(f"{prefix}.self_attn.k_proj", h * kv * hd + (kv * hd if bias else 0), "kv", parts=kv),
           Params(f"{prefix}.self_attn.o_proj", heads * hd * h, "tp")]
    if v_proj:
        out.append(Params(f"{prefix}.self_attn.v_proj", h * kv * hd + (kv * hd if bias else 0), "kv", parts=kv))
    if "qk_norm" in cfg or str(cfg.get("model_type", "")).startswith(("qwen3", "gemma3", "gemma4")):
        out.append(Params(f"{prefix}.self_attn.qk_norm", 2 * hd, "replicated", linear=False))
    if str(cfg.get("model_type", "")) == "gpt_oss":
        out.append(Params(f"{prefix}.self_attn.sinks", heads, "tp", linear=False))
    return out


def _mla(cfg: dict, h: int, heads: int, prefix: str) -> list[Params]:
    lora, rope = cfg["kv_lora_rank"], _int(cfg, "qk_rope_head_dim", default=0)
    nope = _int(cfg, "qk_nope_head_dim", default=0)
    v = _int(cfg, "v_head_dim", default=nope)
    q_lora = _int(cfg, "q_lora_rank")
    out = []
    if q_lora:
        out += [Params(f"{prefix}.self_attn.q_a_proj", h * q_lora, "replicated"),
                Params(f"{prefix}.self_attn.q_a_layernorm", q_lora, "replicated", linear=False),
                Params(f"{prefix}.self_attn.q_b_proj", q_lora * heads * (nope + rope), "tp")]
    else:
        out.append(Params(f"{prefix}.self_attn.q_proj", h * heads * (nope + rope), "tp"))
    out += [Params(f"{prefix}.self_attn.kv_a_proj_with_mqa", h * (lora + rope), "replicated"),
            Params(f"{prefix}.self_attn.kv_a_layernorm", lora, "replicated", linear=False),
            Params(f"{prefix}.self_attn.kv_b_proj", lora * heads * (nope + v), "tp"),
            Params(f"{prefix}.self_attn.o_proj", heads * v * h, "tp")]
    index_dim, index_heads = _int(cfg, "index_head_dim"), _int(cfg, "index_n_heads")
    if index_dim and index_heads:  # DSA (DeepSeek-V3.2, GLM-5): a small replicated indexer per layer
        out += [Params(f"{prefix}.self_attn.indexer.wq_b", (q_lora or h) * index_heads * index_dim, "replicated"),
                Params(f"{prefix}.self_attn.indexer.wk", h * index_dim, "replicated"),
                Params(f"{prefix}.self_attn.indexer.weights_proj", h * index_heads, "replicated", linear=False)]
    return out


def _gdn(cfg: dict, h: int, prefix: str) -> tuple[list[Params], Recurrent]:
    nk, dk = cfg["linear_num_key_heads"], cfg["linear_key_head_dim"]
    nv, dv = cfg["linear_num_value_heads"], cfg["linear_value_head_dim"]
    kernel = _int(cfg, "linear_conv_kernel_dim", default=4)
    key, value = nk * dk, nv * dv
    conv = 2 * key + value
    params = [Params(f"{prefix}.linear_attn.in_proj_qkvz", h * (2 * key + 2 * value), "tp"),
              Params(f"{prefix}.linear_attn.in_proj_ba", h * 2 * nv, "tp"),
              Params(f"{prefix}.linear_attn.conv1d", conv * kernel, "tp", linear=False),
              Params(f"{prefix}.linear_attn.dt_A_norm", 2 * nv + dv, "tp", linear=False),
              Params(f"{prefix}.linear_attn.out_proj", value * h, "tp")]
    ssm_bytes = 4 if str(cfg.get("mamba_ssm_dtype", "float32")) in ("float32", "fp32") else 2
    return params, Recurrent("gdn", (), conv, kernel, nv, dk, dv, ssm_bytes)


def _mamba2(cfg: dict, h: int, prefix: str) -> Optional[tuple[list[Params], Recurrent]]:
    heads = _int(cfg, "mamba_num_heads")
    head_dim = _int(cfg, "mamba_head_dim")
    state = _int(cfg, "ssm_state_size", "mamba_d_state", "state_size")
    groups = _int(cfg, "n_groups", "mamba_n_groups", default=1)
    kernel = _int(cfg, "conv_kernel", "mamba_d_conv", default=4)
    if not heads and (expand := _int(cfg, "mamba_expand", "expand")) and head_dim:
        heads = expand * h // head_dim
    if not (heads and head_dim and state):
        return None
    inner = heads * head_dim
    conv = inner + 2 * groups * state
    params = [Params(f"{prefix}.mixer.in_proj", h * (2 * inner + 2 * groups * state + heads), "tp"),
              Params(f"{prefix}.mixer.conv1d", conv * kernel, "tp", linear=False),
              Params(f"{prefix}.mixer.out_proj", inner * h, "tp")]
    return params, Recurrent("mamba2", (), conv, kernel, heads, head_dim, state, 4)


def _vision(cfg: dict, text_hidden: int) -> list[Params]:
    """A multimodal checkpoint's vision tower, which the server loads beside the language model:
    its blocks (attention 4h² + MLP 2·h·inter) and a projector into the text width."""
    vision = cfg.get("vision_config")
    if not isinstance(vision, dict):
        return []
    depth = _int(vision, "depth", "num_hidden_layers", "vt_num_hidden_layers")
    vh = _int(vision, "hidden_size", "embed_dim", "vt_hidden_size")
    inter = _int(vision, "intermediate_size", "vt_intermediate_size", default=4 * (vh or 0))
    if not (depth and vh):
        return []
    kernel = vision.get("merge_kernel_size")
    merge = (_int(vision, "spatial_merge_size", default=1) or 1) if not isinstance(kernel, list) else \
        int(kernel[0]) if kernel and isinstance(kernel[0], int) else 1
    out = _int(vision, "out_hidden_size", "text_hidden_size", default=text_hidden)
    patch = (_int(vision, "patch_size", default=14) or 14) ** 2 * (_int(vision, "in_channels", "num_channels", default=3) or 3)
    return [Params("vision_tower.blocks", depth * (4 * vh * vh + 2 * vh * inter), "tp"),
            Params("vision_tower.patch_embed", patch * vh, "replicated"),
            Params("multi_modal_projector", merge * merge * vh * out, "tp")]


def _attention(cfg: dict, kinds: list[str]) -> tuple[Attention, ...]:
    heads = _int(cfg, "num_attention_heads")
    kv = _int(cfg, "num_key_value_heads", default=heads)
    hd = _int(cfg, "head_dim") or (cfg["hidden_size"] // heads if _int(cfg, "hidden_size") and heads else None)
    full = [i for i, k in enumerate(kinds) if k == "full"]
    sliding = [i for i, k in enumerate(kinds) if k == "sliding"]
    if _int(cfg, "kv_lora_rank"):
        return (Attention("mla", tuple(full + sliding), kv_lora_rank=cfg["kv_lora_rank"],
                          rope_dim=_int(cfg, "qk_rope_head_dim", default=0),
                          index_head_dim=_int(cfg, "index_head_dim", default=0) or 0),)
    out = []
    global_kv, global_hd = _int(cfg, "num_global_key_value_heads"), _int(cfg, "global_head_dim")
    if full:
        fk, fd = (global_kv, global_hd) if global_kv and global_hd else (kv, hd)
        out.append(Attention("full", tuple(full), fk, fd, _int(cfg, "v_head_dim", default=fd)))
    if sliding:
        out.append(Attention("sliding", tuple(sliding), kv, hd, _int(cfg, "v_head_dim", default=hd),
                             window=_int(cfg, "sliding_window")))
    return tuple(out)


def kv_shape(cfg: dict) -> Optional[tuple[Attention, ...]]:
    """The attention layers alone, for a config that gives only their shape (the plan's
    `--layers --kv-heads --head-dim`); None when even that is missing."""
    found = kv_layers(cfg)
    return found[0] if found else None


def kv_layers(cfg: dict) -> Optional[tuple[tuple[Attention, ...], str]]:
    """(the attention layers, how their kinds were read), or None."""
    layers = _int(cfg, "num_hidden_layers")
    heads = _int(cfg, "num_key_value_heads", "num_attention_heads")
    if not layers or not heads or not (_int(cfg, "head_dim") or _int(cfg, "kv_lora_rank")
                                       or (_int(cfg, "hidden_size") and _int(cfg, "num_attention_heads"))):
        return None
    cfg = {"num_attention_heads": heads, **cfg}
    kinds, read = _layer_kinds(cfg, layers)
    if any(k.startswith("?") for k in kinds):
        return None
    return _attention(cfg, kinds), read


def model_shape(cfg: dict) -> tuple[Optional[Shape], str]:
    """(the shape, how it was read) from config.json's fields (a multimodal config's
    text_config already lifted, as capdiag.parsing.model_config does); (None, why) when the
    config lacks what the frameworks would need."""
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    missing = [k for k in need if not _int(cfg, k)]
    if missing:
        return None, f"config.json lacks {', '.join(missing)}"
    h, layers, heads, vocab = (cfg[k] for k in need)
    kinds, read = _layer_kinds(cfg, layers)
    odd = sorted({k for k in kinds if k.startswith("?")})
    if odd:
        return None, f"layer_types holds kinds the model does not know: {', '.join(k[1:] for k in odd)}"
    if not _int(cfg, "intermediate_size") and not _int(cfg, "moe_intermediate_size"):
        return None, "config.json lacks intermediate_size"
    model_type = str(cfg.get("model_type", ""))
    kv = _int(cfg, "num_key_value_heads", default=heads)
    hd = _int(cfg, "head_dim") or h // heads
    params: list[Params] = []
    recurrent: Optional[Recurrent] = None
    recurrent_layers: list[int] = []
    notes: list[str] = []
    mla = bool(_int(cfg, "kv_lora_rank"))
    global_kv = _int(cfg, "num_global_key_value_heads")
    global_hd = _int(cfg, "global_head_dim")
    for i, kind in enumerate(kinds):
        prefix = f"model.layers.{i}"
        params.append(Params(f"{prefix}.input_layernorm", 2 * h, "replicated", linear=False))
        if kind in ("linear", "mamba"):
            built = (_gdn(cfg, h, prefix) if kind == "linear" and "linear_num_key_heads" in cfg
                     else _mamba2(cfg, h, prefix) if kind == "mamba" else None)
            if built is None:
                return None, (f"layer {i} is a {'linear-attention' if kind == 'linear' else 'Mamba'} layer whose "
                              "state shape config.json does not give (linear_num_key_heads …, or mamba_num_heads, "
                              "mamba_head_dim and ssm_state_size)")
            layer_params, recurrent = built
            params += layer_params
            recurrent_layers.append(i)
        elif kind == "full" and global_kv and global_hd:  # Gemma-4's global layers have their own heads
            params += _gqa(cfg, h, heads, global_kv, global_hd, prefix, v_proj=not cfg.get("attention_k_eq_v"))
        elif kind in ("full", "sliding"):
            params += _mla(cfg, h, heads, prefix) if mla else _gqa(cfg, h, heads, kv, hd, prefix)
        if kind == "mlp" or not isinstance(cfg.get("hybrid_override_pattern"), str):
            params += _mlp(cfg, i, h, prefix)
    params.append(Params("model.embed_tokens", vocab * h, "vocab", linear=False, parts=vocab))
    if not cfg.get("tie_word_embeddings"):
        params.append(Params("lm_head", vocab * h, "vocab", parts=vocab))
    per_layer = _int(cfg, "hidden_size_per_layer_input", default=0)
    if per_layer:  # Gemma-3n/4 small models: a per-layer embedding table
        rows = _int(cfg, "vocab_size_per_layer_input", default=vocab)
        params.append(Params("model.embed_tokens_per_layer", rows * layers * per_layer, "vocab", linear=False,
                             parts=rows))
    params.append(Params("model.norm", h, "replicated", linear=False))
    vision = _vision(cfg, h)
    if vision:
        params += vision
        notes.append("the vision tower is counted from vision_config (blocks and projector, an estimate)")
    if recurrent is not None:
        recurrent = attrs.evolve(recurrent, layers=tuple(recurrent_layers))
    experts = experts_of(cfg)
    topk = (_int(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk", default=0) or 0) if experts else 0
    expert_width = (_int(cfg, "moe_intermediate_size", "expert_intermediate_size", "intermediate_size", default=0)
                    or 0) if experts else 0
    dense = (_int(cfg, "intermediate_size", default=0) or 0) if any(not _is_moe_layer(cfg, i) for i in range(layers)) \
        else 0
    summary = (f"{layers} layers ({read}"
               + (f"; {len(recurrent_layers)} {recurrent.kind} state layers" if recurrent else "")
               + f"), hidden {h}, {heads} heads"
               + (f", MLA latent {cfg['kv_lora_rank']}+{_int(cfg, 'qk_rope_head_dim', default=0)}" if mla else
                  f", {kv} KV heads × {hd}")
               + (f", {experts} experts" if experts else "") + f", vocab {vocab}")
    return Shape(model_type, h, layers, vocab, cfg.get("torch_dtype") or cfg.get("dtype"), _attention(cfg, kinds),
                 recurrent, tuple(params), heads, 0 if mla else kv, experts,
                 _int(cfg, "max_position_embeddings"), dense, topk, expert_width, tuple(notes)), summary


def padded_vocab_rows(rows: int, tp: int) -> int:
    """Rows of a vocab-parallel table on one rank: the vocabulary padded to a multiple of 64,
    split evenly (vLLM's and SGLang's `pad_vocab_size`)."""
    padded = -(-rows // VOCAB_PADDING) * VOCAB_PADDING
    return -(-padded // tp)
