"""vLLM's memory budget, as vLLM computes it (research/memory-models.md §B, from the 0.32.0
sources: `v1/worker/gpu_worker.py` `determine_available_memory`, `v1/core/kv_cache_utils.py`,
`v1/kv_cache_interface.py`; older releases in research/vllm-log-spec.md §5–6).

    available = total × gpu_memory_utilization − (weights + non-torch increase + activation peak)
                − the CUDA-graph estimate (applied by default from 0.21, unless eager)

The KV cache takes `available` in blocks. A block holds `block_size` tokens of every layer of one
KV-cache group; layers of one kind (full attention, sliding window, Mamba) are grouped in equal
sizes, so one block costs `group size × page`, and the pool has `available // that` blocks shared
by the groups. A request needs, per group, its length in blocks (full attention), its window in
blocks plus one (sliding), or one block (Mamba state). Then

    concurrency = blocks / Σ blocks one full-length request needs
    tokens      = blocks // groups × block_size            (0.9 – 0.19)
                = int(concurrency × max_model_len)          (0.20+)

which for a model of full-attention layers only is `blocks × block_size` in both. A hybrid model
with Mamba layers raises the attention block size until one attention page matches a Mamba page.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from capdiag.frozen import frozen
from capdiag.memory.kv import Cell, State

GIB = 1 << 30
NEWEST = (0, 32)  # the newest release this model was read from; a plan without a version is for it
GRAPH_ESTIMATE_FROM = (0, 21)  # the CUDA-graph estimate is taken out of the budget by default
# "GPU KV cache size" = int(concurrency × max_model_len): so printed by 0.20.1 (vllm/014) and 0.20.2,
# while 0.19.2rc1 (vllm/016, vllm/617) still printed blocks // groups × block_size
CONCURRENCY_TOKENS_FROM = (0, 20)
HYBRID_ALLOCATOR_FROM = (0, 9)  # before 0.9.1 every layer, sliding-window ones too, is sized as full
V1_FROM = (0, 8)
DEFAULT_BLOCK = 16
MAMBA_ALIGN = 16  # the attention block size of a Mamba hybrid is a multiple of this
# the sorting sampler's peak per (request × vocabulary entry): vllm/017:97,111 (v0.27.1) measured a
# 1.36 GiB transient peak for 256 requests × 248,320 entries (the MLP's was 0.14 GiB) = 23 B
SORTING_SAMPLER_BYTES = 23
LARGE_GPU_GIB, HUGE_GPU_GIB = 70, 160  # vLLM's larger scheduling defaults apply from here (not on an A100)


def release(version: Optional[str]) -> tuple[int, int]:
    """(major, minor) of `0.10.1.1`, `0.26.1rc1.dev156+g…`; NEWEST when no version is given, or
    for setuptools-scm's `0.1.devN+g…` (a checkout built without its tags, which says nothing of
    the release it is)."""
    if not version or str(version).startswith("0.1.dev"):
        return NEWEST
    parts = []
    for piece in str(version).lstrip("v").split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isascii() and ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits or len(digits) > 6:
            break
        parts.append(int(digits))
    return (parts[0], parts[1] if len(parts) > 1 else 0) if parts else NEWEST


def scheduler_defaults(version: tuple[int, int], device_gib: float, device_name: str,
                       max_model_len: Optional[int]) -> tuple[int, int, str]:
    """(max_num_batched_tokens, max_num_seqs, why) that `vllm serve` takes when neither is given
    (`EngineArgs._set_default_args` / `get_batch_defaults`, 0.8.5–0.32): 8192 tokens and 1024
    sequences on a GPU of 70 GiB or more that is not an A100, 16384 from 160 GiB (0.28+), else
    2048 and 256; from 0.12 the tokens are at most sequences × max_model_len. V0 (before 0.8)
    batches a whole max_model_len (at least 2048) without chunked prefill."""
    if version < V1_FROM:
        tokens = max(max_model_len or 2048, 2048)
        return tokens, 256, f"V0 default: max(max_model_len, 2048) = {tokens} tokens, 256 sequences"
    if version >= (0, 28) and device_gib >= HUGE_GPU_GIB:
        tokens, seqs, tier = 16384, 1024, f"≥ {HUGE_GPU_GIB} GiB"
    elif device_gib >= LARGE_GPU_GIB and "a100" not in device_name.lower():
        tokens, seqs, tier = 8192, 1024, f"≥ {LARGE_GPU_GIB} GiB, not an A100"
    else:
        tokens, seqs, tier = 2048, 256, f"< {LARGE_GPU_GIB} GiB or an A100"
    if version >= (0, 12) and max_model_len:
        tokens = min(tokens, seqs * max_model_len)
    why = f"vllm serve's default on a GPU of {tier}: {tokens} batched tokens, {seqs} sequences"
    if not device_name and LARGE_GPU_GIB <= device_gib < HUGE_GPU_GIB:
        # an 80 GB A100 and an H100 both show ~79.2 GiB: only the name tells the tiers apart
        why += ("; the GPU is not named, and an A100 of this size takes 2048 tokens and 256 sequences "
                "(a smaller activation peak, a larger pool): give --gpu")
    return tokens, seqs, why


def sampler_bytes(version: tuple[int, int]) -> tuple[int, str]:
    """Bytes per (request × vocabulary entry) the dummy sampler run holds at its peak: FlashInfer's
    sampler (the default up to 0.11) keeps the logits and an fp32 copy (~6 B); from 0.12 the
    native top-k/top-p path sorts them (fp32 values, int64 indices, softmax, masks), and from
    0.22 a second warm-up runs that path even with FlashInfer (research: vllm-budget §2)."""
    return (6, "FlashInfer sampler") if version < (0, 12) else (SORTING_SAMPLER_BYTES, "sorting top-k/top-p sampler")


def activation_peak(tokens: int, seqs: int, hidden: int, mlp_per_rank: float, vocab: int, dtype_bytes: float,
                    version: tuple[int, int] = NEWEST, topk: int = 0, expert_per_rank: float = 0) -> tuple[float, str]:
    """The profiling run's torch peak above the weights, estimated: the larger of its widest
    step — `tokens` through a dense MLP (the gate/up output and the activated half, 3 ×
    intermediate, beside four hidden-wide buffers), or through the fused MoE (per token and
    chosen expert, max(I', H) + max(2I', H) elements: `fused_experts_impl`'s caches) — and the
    dummy sampler over min(tokens, seqs) requests of the whole vocabulary (the forward's
    buffers are freed by then)."""
    if topk and expert_per_rank:
        mlp = tokens * (topk * (max(expert_per_rank, hidden) + max(2 * expert_per_rank, hidden)) + hidden) * dtype_bytes
        step = (f"MoE {tokens} tokens × ({topk} × (max({expert_per_rank:.0f}, {hidden}) + max({2 * expert_per_rank:.0f}, "
                f"{hidden})) + {hidden}) × {dtype_bytes:g} B")
    else:
        mlp = tokens * (3 * mlp_per_rank + 4 * hidden) * dtype_bytes
        step = f"MLP {tokens} tokens × (3 × {mlp_per_rank:.0f} + 4 × {hidden}) × {dtype_bytes:g} B"
    rows = min(tokens, seqs)
    per, path = sampler_bytes(version)
    sampler = rows * vocab * per
    peak = max(mlp, sampler)
    return peak / GIB, f"max({step} = {mlp / GIB:.2f} GiB, {path} {rows} × {vocab} × {per} B = {sampler / GIB:.2f} GiB)"


NCCL_IN_BUDGET = ((0, 9), (0, 11))  # releases whose memory snapshot precedes NCCL's initialisation
NVLS_GPUS = ("h100", "h200", "h800", "h20", "gh200", "b200", "b300", "gb200", "gb300")


def nvls(device_name: str, tp: int) -> bool:
    """Whether NCCL sets up NVLink SHARP buffers: NVSwitch Hopper/Blackwell GPUs, more than 2."""
    return tp > 2 and any(g in device_name.lower() for g in NVLS_GPUS)


def available_gib(total: float, utilization: float, weights: float, non_torch: float, activation: float,
                  graphs: float) -> float:
    return total * utilization - weights - non_torch - activation - graphs


@frozen
class Pool:
    blocks: int
    block_size: int
    groups: int
    tokens: int  # as the release prints "GPU KV cache size"
    concurrency: Optional[float]  # full-length requests at once
    kv_bytes: float
    lines: tuple[str, ...]

    @property
    def kv_gib(self) -> float:
        return self.kv_bytes / GIB


def pool(available: float, cells: Sequence[Cell], version: tuple[int, int], max_model_len: Optional[int],
         state: Optional[State] = None, block_size: Optional[int] = None,
         batched_tokens: Optional[int] = None) -> Pool:
    """The KV cache `available` GiB buys, as the release sizes and prints it. Groups of different
    kinds share one page size: a kind whose token takes fewer bytes gets a larger block (Gemma-4's
    global layers, 4096 B a token beside the sliding layers' 8192 B, take 32-token blocks)."""
    if version < HYBRID_ALLOCATOR_FROM:
        cells = [Cell("full", c.layers, c.per_layer, c.kv_heads_per_rank, c.replication, None, c.formula)
                 for c in cells]
    kinds = [(c.kind, c.layers, c.per_layer, c.window) for c in cells if c.layers]
    lines = []
    block = block_size or DEFAULT_BLOCK
    if state is not None and state.layers:
        mamba_page = state.conv_bytes + state.ssm_bytes
        attention_per_token = max((per for _, _, per, _ in kinds), default=0)
        if attention_per_token:
            block = MAMBA_ALIGN * math.ceil(mamba_page / (MAMBA_ALIGN * attention_per_token))
            lines.append(f"attention block raised to {block} tokens: one page ({block} × {attention_per_token:,.0f} B) "
                         f"holds a Mamba state ({mamba_page:,.0f} B)")
        kinds.append(("mamba", state.layers, mamba_page, None))
    if not kinds:
        return Pool(0, block, 0, 0, None, 0.0, ("no KV layers",))
    page = max(per * block if kind != "mamba" else per for kind, _, per, _ in kinds)
    group = min(layers for _, layers, _, _ in kinds)
    groups = []  # (kind, tokens a block, window)
    for kind, layers, per, window in kinds:
        tokens_a_block = block if kind == "mamba" or per <= 0 else max(block, int(page // per))
        groups += [(kind, tokens_a_block, window)] * math.ceil(layers / group)
    per_block = group * page
    if per_block <= 0 or not max_model_len and max_model_len is not None:
        return Pool(0, block, len(groups), 0, None, 0.0, tuple(lines + ["no KV bytes a token: no blocks"]))
    blocks = max(0, int(available * GIB // per_block))
    lines.append(f"{len(groups)} KV-cache group(s) of {group} layers; a block is {group} × {page:,.0f} B page = "
                 f"{per_block / (1 << 20):.2f} MiB; {available:.2f} GiB → {blocks:,} blocks")
    concurrency = None
    if max_model_len:
        need = 0
        for kind, tokens_a_block, window in groups:
            if kind == "mamba":
                need += 1
            elif kind == "sliding" and window:
                need += math.ceil(min(window - 1 + (batched_tokens or 0), max_model_len) / tokens_a_block) + 1
            else:
                need += math.ceil(max_model_len / tokens_a_block)
        concurrency = blocks / need if need else None
        lines.append(f"one {max_model_len:,}-token request needs {need} blocks: {concurrency:.2f} at once")
    if version >= CONCURRENCY_TOKENS_FROM and concurrency is not None:
        tokens = int(concurrency * max_model_len)
        lines.append(f"tokens = int({concurrency:.4f} × {max_model_len:,}) (0.20+)")
    elif len(groups) == 1:
        tokens = blocks * groups[0][1]
    else:
        tokens = blocks // len(groups) * block
        lines.append(f"tokens = {blocks:,} // {len(groups)} groups × {block} (before 0.20)")
    return Pool(blocks, block, len(groups), tokens, concurrency, blocks * per_block, tuple(lines))
