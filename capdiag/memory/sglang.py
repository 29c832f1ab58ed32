"""SGLang's memory budget, as SGLang computes it (research/memory-models.md §A, from the 0.5.23
wheel: `mem_cache/kv_cache_configurator.py`, `model_executor/pool_configurator.py`,
`arg_groups/memory_hook.py`; older releases in research/sglang-log-spec.md §3).

    pre  = free memory after torch.distributed init, before the weights load (min over ranks)
    post = free memory after the weights (the draft's too, v0.5.14+) load
    rest = post − pre × (1 − mem_fraction_static)

`mem_fraction_static × pre` holds the weights and the pools (KV, Mamba state); what the fraction
leaves out of `pre` is for activations, CUDA graphs and the request-to-token table, which are
allocated outside it. The pools split `rest`:
- full attention (and MLA): tokens = ⌊rest / cell⌋ rounded down to the page;
- hybrid sliding-window models: one full token costs the full layers' cell plus
  `swa_full_tokens_ratio` (default 0.8) sliding tokens; the sliding pool holds that ratio of
  the full pool's tokens (Gemma-2/3 turn this off: every layer is sized as full);
- hybrid linear-attention models: `rest × 0.9 / 1.9` is the Mamba state budget, K state
  slots of one request each (`(budget − per) // per`), K + 1 charged; the KV pool takes the rest,
  and the request limit is capped at K // 3 (three slots a request with the radix cache).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from capdiag.frozen import frozen
from capdiag.memory.kv import Cell, State

GIB = 1 << 30
SWA_FULL_TOKENS_RATIO = 0.8  # `--swa-full-tokens-ratio` default (arg_groups/fields/schedule.py)
MAMBA_FULL_MEMORY_RATIO = 0.9  # `mamba_full_memory_ratio` default: state gets 0.9 / 1.9 of rest
MAMBA_SLOTS_PER_REQUEST = 3  # with the radix cache (MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO)
NO_HYBRID_SWA = ("gemma2", "gemma3", "gemma3_text", "gemma3n")  # sized as full attention


def rest_gib(pre_gib: float, post_gib: float, fraction: float) -> float:
    """What the pools may take: free after the weights − free before × (1 − fraction)."""
    return post_gib - pre_gib * (1 - fraction)


@frozen
class Pool:
    """The pools SGLang allocates from `rest`."""
    tokens: int  # max_total_num_tokens: the full-attention pool's tokens
    kv_bytes: float  # every KV pool (full and sliding)
    swa_tokens: Optional[int]
    state_slots: Optional[int]  # max_mamba_cache_size
    state_bytes: float
    request_cap: Optional[int]  # the request limit the state slots set
    lines: tuple[str, ...]

    @property
    def kv_gib(self) -> float:
        return self.kv_bytes / GIB

    @property
    def state_gib(self) -> float:
        return self.state_bytes / GIB


def pool(rest: float, cells: Sequence[Cell], page: int = 1, state: Optional[State] = None,
         hybrid_swa: bool = True, swa_ratio: float = SWA_FULL_TOKENS_RATIO) -> Pool:
    """The pools `rest` GiB buys: `cells` per attention kind (full/MLA and sliding), `state` one
    request's recurrent state, `page` the page size the token counts are rounded to."""
    lines = [f"rest {rest:.2f} GiB"]
    budget = rest * GIB
    slots = cap = None
    state_bytes = 0.0
    if state is not None and state.bytes > 0:
        share = budget * MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO)
        slots = max(0, int((share - state.bytes) // state.bytes))
        state_bytes = (slots + 1) * state.bytes
        cap = slots // MAMBA_SLOTS_PER_REQUEST
        lines.append(f"Mamba state: {MAMBA_FULL_MEMORY_RATIO}/{1 + MAMBA_FULL_MEMORY_RATIO:g} of rest = "
                     f"{share / GIB:.2f} GiB; {state.bytes / (1 << 20):.2f} MiB a request ({state.formula}) → "
                     f"{slots} slots (+1 padding) = {state_bytes / GIB:.2f} GiB; request limit ≤ {slots} // "
                     f"{MAMBA_SLOTS_PER_REQUEST} = {cap}")
        budget -= state_bytes
    full = [c for c in cells if c.kind != "sliding"]
    sliding = [c for c in cells if c.kind == "sliding"]
    if sliding and not hybrid_swa:
        full, sliding = full + sliding, []
        lines.append("sliding-window layers sized as full attention (this model turns the hybrid SWA pool off)")
    per_full = sum(c.bytes for c in full)
    per_swa = sum(c.bytes for c in sliding)
    if sliding and per_full:
        unit = per_full + swa_ratio * per_swa
        tokens = int(max(budget, 0) // unit) // page * page
        swa = int(tokens * swa_ratio) // page * page
        kv_bytes = tokens * per_full + swa * per_swa
        lines.append(f"hybrid SWA: a full token costs {per_full:,.0f} B + {swa_ratio} × {per_swa:,.0f} B = "
                     f"{unit:,.0f} B → {tokens:,} full tokens, {swa:,} sliding tokens")
        return Pool(tokens, kv_bytes, swa, slots, state_bytes, cap, tuple(lines))
    per = per_full + per_swa
    if per <= 0:
        return Pool(0, 0.0, None, slots, state_bytes, cap, tuple(lines + ["no KV layers"]))
    tokens = int(max(budget, 0) // per) // page * page
    lines.append(f"tokens = ⌊{max(budget, 0) / GIB:.2f} GiB / {per:,.0f} B⌋" + (f" to the page of {page}" if page > 1 else "")
                 + f" = {tokens:,}")
    return Pool(tokens, tokens * per, None, slots, state_bytes, cap, tuple(lines))


def max_running_requests(tokens: int, context_len: Optional[int], stated: Optional[int] = None,
                         dp: int = 1, state_cap: Optional[int] = None) -> tuple[Optional[int], str]:
    """The request limit SGLang sets (0.5.23 `resolve_max_num_reqs`): the stated one (per DP
    worker, at most tokens // 2), else clamp(tokens / context × 512, 2048, 4096) at most
    tokens // 2; then the Mamba state cap."""
    if stated is not None:
        value, how = min(max(1, stated // max(dp, 1)), tokens // 2), f"stated {stated}, at most {tokens} // 2"
    elif context_len:
        estimate = min(max(int(tokens / context_len * 512), 2048), 4096)
        value, how = min(estimate, tokens // 2), (f"clamp({tokens} / {context_len} × 512, 2048, 4096) = {estimate}, "
                                                  f"at most {tokens} // 2")
    else:
        return None, "needs the context length"
    if state_cap is not None and state_cap < value:
        value, how = state_cap, how + f"; capped to {state_cap} by the Mamba state slots"
    return value, how


# GPU classes by memory (MiB): (below, chunked_prefill_size, decode max_bs at TP < 4, at TP ≥ 4)
_CLASSES = ((20 * 1024, 2048, 8, 8), (35 * 1024, 4096, 48, 160), (60 * 1024, 4096, 32, 160),
            (90 * 1024, 8192, 256, 512), (160 * 1024, 8192, 256, 512), (math.inf, 16384, 512, 512))


def default_fraction(total_mib: float, tp: int = 1, pp: int = 1, chunked: Optional[int] = None,
                     max_bs: Optional[int] = None) -> tuple[float, str]:
    """SGLang's own `mem_fraction_static` when none is given (0.5.16+ `handle_gpu_memory_settings`):
    reserved MiB = 512 + 1.5 × max(chunked prefill, 2048) + 1024 × tp × pp / 8 + 2 × decode
    max_bs, at least 10240 on a GPU over 60 GiB; fraction = round((total − reserved) / total, 3).
    The chunked-prefill size and max_bs default by the GPU's memory class."""
    _, class_chunk, small, large = next(c for c in _CLASSES if total_mib < c[0])
    chunk = chunked or class_chunk
    bs = max_bs or (small if tp < 4 else large)
    reserved = 512 + 1.5 * max(chunk, 2048) + 1024 * tp * pp / 8 + 2 * bs
    floor = total_mib > 60 * 1024
    if floor:
        reserved = max(reserved, 10240)
    value = round((total_mib - reserved) / total_mib, 3)
    return value, (f"SGLang's default: reserved = 512 + 1.5 × {max(chunk, 2048)} (chunked prefill) + 1024 × "
                   f"{tp * pp} / 8 + 2 × {bs} (decode graphs) = {512 + 1.5 * max(chunk, 2048) + 128 * tp * pp + 2 * bs:.0f} "
                   f"MiB{' (at least 10240 above 60 GiB)' if floor else ''}; ({total_mib:.0f} − {reserved:.0f}) / "
                   f"{total_mib:.0f} = {value}")


def req_to_token_bytes(requests: int, context_len: int) -> int:
    """The request-to-token table, allocated outside the static fraction: (R + 1) rows of
    context + 4 int32 entries."""
    return (requests + 1) * (context_len + 4) * 4
