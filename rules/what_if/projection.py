"""What-if projections: the start-up re-sized under changed settings, through the memory model
`plan` runs forwards (capdiag.memory) — not a proportional guess. What the inputs cannot support
is listed as not projected, with the reason.

SGLang: rest = free after weights − free before weights × (1 − mem_fraction_static) (both the
minimum over ranks); the pools split rest as SGLang does (a hybrid model's Mamba state slots
first, at the log's state a request), tokens rounded down to the page.
vLLM: the KV budget moves with total × gpu_memory_utilization, everything else in the budget
(weights, activation peak, non-torch, graph estimate) staying as measured; blocks and tokens as
the release counts them.

A projection concludes `what_if` with the conclusions the changes replace (`detail["pins"]`):
the changed settings and the projected pool. The counterfactual run (counterfactual.py) pins
them and re-runs every rule, so the findings that would appear or go away are the rules' own.
"""
from __future__ import annotations

from typing import Any, Optional

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.memory import sglang as sg, vllm as vl
from capdiag.memory.kv import Cell, State
from capdiag.rules._common import context_of, gib, is_vllm, request_lengths
from capdiag.rules.derive.concurrency import limits, refused
from capdiag.rules.derive.kv_theory import model_dtype
from capdiag.memory.kv import pool_cell
from capdiag.vocabulary import GIB, element_size

_FRAMEWORK_KEYS = {"sglang": ("mem_fraction_static", "max_running_requests", "context_len"),
                   "vllm": ("gpu_memory_utilization", "max_num_seqs", "max_model_len")}


def _min_reading(kb, kind, attr) -> tuple[Optional[float], list]:
    """The smallest reading over ranks (SGLang sizes every pool from the minimum)."""
    facts = [f for f in kb.of(kind) if getattr(f, attr) is not None]
    return (min(getattr(f, attr) for f in facts), facts) if facts else (None, [])


class _Projection:
    """Collects the projected figures, their derivation lines, what could not be projected, and
    the conclusions the counterfactual run pins: (topic, key) -> (value, formula, detail)."""

    def __init__(self, rule_name: str, changes: dict[str, Any]):
        self.rule, self.changes, self.lines, self.not_projected, self.values = rule_name, changes, [], [], {}
        self.pins: dict[tuple, tuple] = {}

    def note(self, text: str):
        self.lines.append(text)

    def refuse(self, key: str, why: str):
        self.not_projected.append({"change": key, "reason": why})

    def applied(self, key: str) -> bool:
        return key in self.changes and key not in {n["change"] for n in self.not_projected}

    def pin(self, topic: str, key: Any, value: Any, formula: str, detail: Optional[dict] = None):
        self.pins[(topic, key)] = (value, formula, detail or {})

    def pin_settings(self, names: dict[str, str]):
        """The changed settings that were projected, as the configuration they replace."""
        for change, key in names.items():
            if self.applied(change):
                self.pin("config", key, self.changes[change], f"--what-if {change}={self.changes[change]}")

    def refuse_all(self, missing: list[str], premises) -> Derived:
        """Nothing can be projected: every change not refused already needs what is missing."""
        refused = {n["change"] for n in self.not_projected}
        for key in self.changes:
            if key not in refused:
                self.refuse(key, "needs " + ", ".join(missing))
        return _conclude(self, premises)


# the changes that re-size the pool (and so need the log's memory readings to project)
_POOL_KEYS = ("mem_fraction_static", "gpu_memory_utilization", "kv_cache_dtype", "tp_size", "page_size")


def _resizes_pool(changes: dict[str, Any]) -> bool:
    return any(k in changes for k in _POOL_KEYS)


def _foreign_keys(p: _Projection, framework: str):
    other = "vllm" if framework == "sglang" else "sglang"
    for key in _FRAMEWORK_KEYS[other]:
        if key in p.changes:
            p.refuse(key, f"a {other} setting; this log is {framework}'s")


def _kv_dtype_factor(kb, p: _Projection) -> Optional[float]:
    new = p.changes.get("kv_cache_dtype")
    if new is None:
        return 1.0
    current = kb.get("kv_pool", "dtype")
    stated = model_dtype(kb) if new == "auto" else None  # `auto` takes the model's dtype, never a default
    dtype = stated[1] if stated is not None else None if new == "auto" else new
    new_elem = element_size(dtype)
    old_elem = element_size(current.value) if current is not None and current.known else None
    if old_elem is None or new_elem is None:
        p.refuse("kv_cache_dtype", "the current or the new KV element size is unknown")
        return None
    p.note(f"kv_cache_dtype {current.value} → {new}: bytes per token × {new_elem}/{old_elem}")
    p.pin("kv_pool", "dtype", dtype, f"--what-if kv_cache_dtype={new}" + (f" ({stated[2]})" if stated else ""))
    return new_elem / old_elem


def _tp_change(kb, p: _Projection, cell: float) -> tuple[float, float]:
    """(weights saved per rank in GiB, new cell) for a TP change; needs config.json."""
    new_tp = p.changes.get("tp_size")
    if new_tp is None:
        return 0.0, cell
    model = kb.first(F.ModelConfig, role=None)
    tp = kb.value("config", "tp_size")
    weights = kb.get("breakdown", "weights")
    theory = kb.get("kv_pool", "theoretical_bytes_per_token")
    if model is None or not isinstance(tp, int) or weights is None or not weights.known or theory is None \
            or not theory.known:
        p.refuse("tp_size", "needs --config-json, the current tp_size and measured weights")
        return 0.0, cell
    if theory.detail.get("attention") == "mha":  # the heads on a rank change; layers and element size do not
        new_cell = theory.value / theory.detail["kv_heads_per_rank"] * pool_cell(model.fields, 1, new_tp).kv_heads_per_rank
    else:
        new_cell = theory.value  # MLA: every rank holds the latent
    saved = weights.value - weights.value * tp / new_tp
    p.pin("breakdown", "weights", gib(weights.value * tp / new_tp), f"{weights.value} × {tp} / {new_tp} GiB",
          {"status": "projected"})
    p.note(f"tp_size {tp} → {new_tp}: weights per rank {weights.value} → {weights.value * tp / new_tp:.2f} GiB "
           f"(sharded evenly; embeddings included), bytes per token {theory.value} → {new_cell:.0f} "
           "(free memory before weights assumed unchanged)")
    return saved, new_cell * (cell / theory.value)


def _context(kb, p: _Projection, tokens: int, context_key: str):
    context = p.changes.get(context_key, kb.value("config", "max_model_len") or kb.value("config", "context_len"))
    if isinstance(context, int) and context > 0:
        p.values["full_context_requests"] = tokens // context
        p.note(f"context {context}: {tokens // context} full-length request(s) fit")


def _pin_pool(p: _Projection, tokens: int, kv_gib: float, cell: float, per_token: Derived):
    """The projected pool: its tokens and GiB, and its bytes per token where a change moved it."""
    p.pin("kv_pool", "tokens", tokens, "projected token capacity")
    p.pin("breakdown", "kv_cache", kv_gib, "projected KV pool", {"status": "projected"})
    if cell != per_token.value:
        p.pin("kv_pool", "bytes_per_token", round(cell), f"{per_token.value} B re-sized to {cell:.2f} B")


@rule("what-if.sglang", frameworks=("sglang",),
      reads=(F.WhatIf, F.Options, F.LoadWeightBegin, F.LoadWeightEnd, F.MemoryProfiling, F.DSV4MemoryCalculation,
             F.MambaCacheAllocated, F.ModelConfig, F.VllmEngineConfig, F.TokenBudget, "breakdown:free",
             "breakdown:mamba_state?",
             "breakdown:kv_cache", "breakdown:weights", "config:context_len", "config:max_model_len?",
             "config:max_running_requests", "config:mem_fraction_static", "config:page_size", "config:tp_size",
             "config:dp_size", "kv_pool:bytes_per_token", "kv_pool:dtype", "kv_pool:tokens",
             "kv_pool:theoretical_bytes_per_token"),
      concludes=("what_if",))
def sglang(kb):
    """What it concludes: `what_if`: the SGLang start-up re-sized under the `--what-if` changes, and
    the conclusions the changes replace, which the counterfactual run pins.

    How: it projects mem_fraction_static, kv_cache_dtype, page_size, tp_size (with config.json),
    max_running_requests, context_len. KV pool bytes, token capacity (page-aligned), the Mamba state
    slots of a hybrid model and the request limit they set, the concurrency table and the free
    memory after capture follow from SGLang's formula (capdiag.memory.sglang, the one `plan` runs);
    CUDA graphs and everything else stay as measured.

    Example: `--what-if mem_fraction_static=0.95` on the bundled example: rest = 63.44 − 78.43 × (1
    − 0.95) = 59.5185 GiB, 487,519 tokens, 3.16 GiB free after capture."""
    request = kb.first(F.WhatIf, role=None)
    if request is None or is_vllm(kb):
        return
    p = _Projection("what-if.sglang", request.changes)
    _foreign_keys(p, "sglang")
    pre, pre_facts = _min_reading(kb, F.LoadWeightBegin, "avail_gib")
    after, after_facts = _min_reading(kb, F.LoadWeightEnd, "avail_gib")
    profiling = kb.first(F.MemoryProfiling, role=None)
    if profiling is not None and None not in (profiling.total_gpu_memory_gib, profiling.available_gpu_memory_gib):
        pre, after, pre_facts, after_facts = (profiling.total_gpu_memory_gib, profiling.available_gpu_memory_gib,
                                              [profiling], [])
    fraction = kb.get("config", "mem_fraction_static")
    tokens = kb.get("kv_pool", "tokens")
    per_token = kb.get("kv_pool", "bytes_per_token")
    dsv4 = kb.first(F.DSV4MemoryCalculation, role=None)
    free_row = kb.get("breakdown", "free")
    premises = tuple(x for x in (request, fraction, tokens, per_token, free_row, dsv4, *pre_facts[:1],
                                 *after_facts[:1]) if x is not None)
    missing = [name for name, v in (("free memory before weights", pre), ("free memory after weights", after),
                                    ("mem_fraction_static", fraction.value if fraction and fraction.known else None),
                                    ("the pool's bytes per token", per_token.value if per_token and per_token.known
                                     else None)) if v is None]
    if missing and _resizes_pool(p.changes):
        yield p.refuse_all(missing, premises)
        return
    if missing:  # only the request limit or the context: the pool stays as the log sized it
        p.pin_settings({"max_running_requests": "max_running_requests", "context_len": "context_len"})
        if tokens is not None and tokens.known:
            if p.applied("max_running_requests"):
                _pin_concurrency(kb, p, tokens.value)
            _context(kb, p, tokens.value, "context_len")
        yield _conclude(p, premises)
        return
    f_new = p.changes.get("mem_fraction_static", fraction.value)
    cell = float(per_token.value)
    factor = _kv_dtype_factor(kb, p)
    if factor is not None and factor != 1.0:
        if dsv4 is not None:
            p.refuse("kv_cache_dtype", "DeepSeek-V4's bytes_per_full_token mixes fp8 and bf16 parts")
            p.pins.pop(("kv_pool", "dtype"))
        else:
            cell *= factor
    saved, cell = _tp_change(kb, p, cell)
    page = p.changes.get("page_size", kb.value("config", "page_size") or 1)
    fixed = sum(dsv4.fixed_gib.values()) if dsv4 is not None else 0.0
    rest = sg.rest_gib(pre, after + saved, f_new)
    p.note(f"rest = free after weights {after}{f' + {saved:.2f} saved' if saved else ''} − free before weights "
           f"{pre} × (1 − {f_new}) = {rest:.4f} GiB")
    state = _log_state(kb)
    if rest - fixed <= 0:
        p.note("rest ≤ 0: SGLang would refuse to start (Not enough memory; raise the fraction)")
        new_tokens, slots = 0, None
    else:
        pool = sg.pool(rest - fixed, [log_cell(cell)], page, state)
        new_tokens, slots = pool.tokens, pool.state_slots
        for line in pool.lines[1:]:
            p.note(line)
        if state is not None:
            p.values["mamba_slots"] = slots
            p.values["request_cap"] = pool.request_cap
            p.pin("breakdown", "mamba_state", gib(pool.state_gib), "projected Mamba state", {"status": "projected"})
    kv_now = kb.get("breakdown", "kv_cache")
    kv_new = gib(new_tokens * cell / GIB)
    state_now = kb.get("breakdown", "mamba_state")
    state_change = (p.pins[("breakdown", "mamba_state")][0] - state_now.value
                    if ("breakdown", "mamba_state") in p.pins and state_now is not None and state_now.known else 0.0)
    p.values.update({"kv_cache_gib": kv_new, "max_total_num_tokens": new_tokens,
                     "tokens_before": tokens.value if tokens is not None and tokens.known else None})
    free_after = None
    if free_row is not None and free_row.known and kv_now is not None and kv_now.known:
        free_after = gib(free_row.value - (kv_new - kv_now.value) - state_change + saved)
        p.note(f"free after capture = {free_row.value} − (KV {kv_new} − {kv_now.value})"
               f"{f' − Mamba state change {state_change:.2f}' if state_change else ''}{f' + {saved:.2f}' if saved else ''}"
               f" = {free_after} GiB (graphs unchanged)")
    p.values["free_after_capture_gib"] = free_after
    p.pin_settings({"mem_fraction_static": "mem_fraction_static", "page_size": "page_size", "tp_size": "tp_size",
                    "max_running_requests": "max_running_requests", "context_len": "context_len"})
    if any(p.applied(k) for k in ("mem_fraction_static", "kv_cache_dtype", "page_size", "tp_size")):
        _pin_pool(p, new_tokens, kv_new, cell, per_token)
        p.pin("breakdown", "free", Unknown("the projection needs today's free memory and KV pool")
              if free_after is None else free_after, "projected free memory after capture", {"status": "projected"})
    resized = ("kv_pool", "tokens") in p.pins
    pool = new_tokens if resized else tokens.value if tokens is not None and tokens.known else None
    if pool is not None and (resized or p.applied("max_running_requests")):
        _pin_concurrency(kb, p, pool)
    _context(kb, p, new_tokens, "context_len")
    yield _conclude(p, premises)


def log_cell(bytes_per_token: float) -> Cell:
    """The pool's cell as the log implies it (its bytes per token), for the memory model."""
    return Cell("full", 1, bytes_per_token, 0, 1, None, f"{bytes_per_token:,.0f} B a token (the log's)")


def _log_state(kb) -> Optional[State]:
    """One request's Mamba state as the log sized it: the state pool's GiB over its slots + 1."""
    mamba = kb.first(F.MambaCacheAllocated, role=None)
    if mamba is None or not mamba.max_cache_size or mamba.conv_gib is None or mamba.ssm_gib is None:
        return None
    slots = mamba.max_cache_size + 1
    return State(1, mamba.conv_gib * GIB / slots, mamba.ssm_gib * GIB / slots,
                 f"({mamba.conv_gib} + {mamba.ssm_gib}) GiB / {slots} slots (the log's)")


def _pin_concurrency(kb, p: _Projection, pool: int):
    """SGLang's concurrency rows read the `max_total_num_tokens` line itself, so the projection
    sizes them, with the rule's own arithmetic, from the projected pool and request limit — the
    Mamba state slots' cap included."""
    budget = kb.first(F.TokenBudget, role=None)
    limit = p.changes.get("max_running_requests", budget.max_running_requests if budget is not None else None)
    cap = p.values.get("request_cap")
    if cap is not None and (limit is None or cap < limit):
        limit = cap
    context = context_of(kb)
    for length in request_lengths(kb):
        value, formula, detail = limits(pool, limit, length, kb.value("config", "dp_size"))
        formula, detail = refused(formula, detail, length, context)
        p.pin("concurrency", length, value, f"{formula} (projected)", detail)


@rule("what-if.vllm", frameworks=("vllm",),
      reads=(F.WhatIf, F.Options, F.ModelConfig, F.LoadWeightEnd, F.VllmEngineConfig, "gpu:total_gib",
             "config:gpu_memory_utilization", "breakdown:kv_cache", "breakdown:weights", "kv_pool:bytes_per_token",
             "kv_pool:dtype", "kv_pool:theoretical_bytes_per_token", "config:block_size",
             "config:max_running_requests", "config:max_model_len", "config:context_len?", "config:tp_size",
             "config:framework_version?", "kv_pool:tokens?"),
      concludes=("what_if",))
def vllm(kb):
    """What it concludes: `what_if`: the vLLM start-up re-sized under the `--what-if` changes, and the
    conclusions the changes replace, which the counterfactual run pins.

    How: it projects gpu_memory_utilization, kv_cache_dtype, tp_size (with config.json), max_num_seqs,
    max_model_len. The KV budget grows or shrinks by total × Δutilization while weights, activation
    peak, non-torch memory and the graph estimate stay as measured; tokens = KV bytes / bytes per
    token, in whole blocks where the block size is stated.

    Example: `--what-if gpu_memory_utilization=0.97` at 0.9 of 23.58 GiB with 2.89 GiB of KV: KV =
    2.89 + 23.58 × 0.07 = 4.54 GiB, 0.71 GiB outside the budget."""
    request = kb.first(F.WhatIf, role=None)
    if request is None or not is_vllm(kb):
        return
    p = _Projection("what-if.vllm", request.changes)
    _foreign_keys(p, "vllm")
    total = kb.get("gpu", "total_gib")
    util = kb.get("config", "gpu_memory_utilization")
    kv = kb.get("breakdown", "kv_cache")
    per_token = kb.get("kv_pool", "bytes_per_token")
    premises = tuple(x for x in (request, total, util, kv, per_token) if x is not None)
    # the total only moves the budget when the utilization changes; a dtype or TP change re-sizes
    # the pool the log printed
    needed = ((("the GPU total", total), ("gpu_memory_utilization", util)) if "gpu_memory_utilization" in p.changes
              else ()) + (("the available KV memory", kv), ("the pool's bytes per token", per_token))
    missing = [name for name, d in needed if d is None or not d.known]
    if missing and _resizes_pool(p.changes):
        yield p.refuse_all(missing, premises)
        return
    if missing:  # only the request limit or the context: the pool stays as the log sized it
        p.pin_settings({"max_num_seqs": "max_running_requests", "max_model_len": "max_model_len"})
        tokens = kb.get("kv_pool", "tokens")
        if tokens is not None and tokens.known:
            _context(kb, p, tokens.value, "max_model_len")
        yield _conclude(p, premises)
        return
    moved = "gpu_memory_utilization" in p.changes
    u_new = p.changes["gpu_memory_utilization"] if moved else util.value if util is not None and util.known else None
    cell = float(per_token.value)
    factor = _kv_dtype_factor(kb, p)
    cell *= factor or 1.0
    saved, cell = _tp_change(kb, p, cell)
    kv_new = kv.value + (total.value * (u_new - util.value) if moved else 0.0) + saved
    p.note((f"KV = {kv.value} + total {total.value} × ({u_new} − {util.value})" if moved else f"KV = {kv.value}")
           + (f" + {saved:.2f} saved" if saved else "") + f" = {kv_new:.2f} GiB")
    block = kb.value("config", "block_size")
    context = p.changes.get("max_model_len", kb.value("config", "max_model_len"))
    pool = vl.pool(max(kv_new, 0.0), [log_cell(cell)], vl.release(kb.value("config", "framework_version")),
                   context if isinstance(context, int) else None, block_size=block if isinstance(block, int) else 1)
    new_tokens = pool.tokens
    p.note(f"tokens = ⌊{kv_new:.2f} GiB × 2^30 / {cell:.0f} B⌋{f' in blocks of {block}' if isinstance(block, int) else ''}"
           f" = {new_tokens}")
    if kv_new <= 0:
        p.note("KV ≤ 0: vLLM would refuse to start (No available memory for the cache blocks)")
    free_after = gib(total.value * (1 - u_new)) if total is not None and total.known and u_new is not None else None
    if free_after is not None:
        p.note(f"outside the budget: total {total.value} × (1 − {u_new}) = {free_after} GiB")
    p.values.update({"kv_cache_gib": gib(kv_new), "kv_cache_tokens": new_tokens, "free_after_capture_gib": free_after})
    p.pin_settings({"gpu_memory_utilization": "gpu_memory_utilization", "tp_size": "tp_size",
                    "max_num_seqs": "max_running_requests", "max_model_len": "max_model_len"})
    if any(p.applied(k) for k in ("gpu_memory_utilization", "kv_cache_dtype", "tp_size")):
        _pin_pool(p, new_tokens, gib(max(kv_new, 0.0)), cell, per_token)  # no pool at all below zero
    if p.applied("gpu_memory_utilization"):
        p.pin("breakdown", "budget", gib(total.value * u_new), f"total {total.value} × gpu_memory_utilization {u_new}",
              {"status": "projected"})
    _context(kb, p, new_tokens, "max_model_len")
    yield _conclude(p, premises)


def _conclude(p: _Projection, premises) -> Derived:
    value = {"changes": p.changes, **p.values, "not_projected": p.not_projected}
    return Derived("what_if", None, value, p.rule, premises, "; ".join(p.lines),
                   {"derivation": p.lines, "pins": p.pins})
