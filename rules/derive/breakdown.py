"""Where the target rank's GPU memory went, category by category.

Each row is `measured` (a figure the log prints), `derived` (arithmetic on printed figures,
shown in the row) or `unknown` (with the reason). SGLang's "GB" are GiB throughout.
"""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import dsv4_built, gib, line_ref, target
from capdiag.rules.derive.device import avail_caveat
from capdiag.vocabulary import GIB, HELD_SINCE_WEIGHTS

# the lines each reading draws on (its declared reads)
_WEIGHT_LINES = (F.LoadWeightBegin, F.LoadWeightEnd, F.MemoryProfiling, F.WeightsCommitted)
_KV_LINES = (F.PostCaptureKVSizing, F.KVCacheAllocated, F.SWAKVPoolUsage, F.DSV4MemoryCalculation, F.DSV4PoolSizes,
             F.LoadWeightEnd, F.MemoryPoolEnd, F.MambaCacheAllocated)
_GRAPH_LINES = (F.GraphCaptureEnd, F.GraphCaptureBegin, F.ServerArgs)
# said of a log and of a server's endpoints alike: neither is named, the missing figure is
BEFORE_WEIGHTS_UNSTATED = ("the free memory before the weights load is not stated for this rank "
                           "(the start-up log's `Load weight begin` line)")


def row(category, value, status, rule_name, premises, formula):
    return Derived("breakdown", category, value, rule_name, tuple(p for p in premises if p is not None),
                   formula, {"status": status})


def _weights(kb, rank, role, category, rule_name):
    begin = kb.first(F.LoadWeightBegin, rank, role)
    end = kb.first(F.LoadWeightEnd, rank, role)
    if end is not None and end.mem_usage_gib is not None:
        return row(category, end.mem_usage_gib, "measured", rule_name, (end,),
                   f"`mem usage` of Load weight end ({line_ref(end)})")
    if begin is not None and end is not None and end.avail_gib is not None:
        return row(category, gib(begin.avail_gib - end.avail_gib), "derived", rule_name, (begin, end),
                   f"free before load {begin.avail_gib} − free after load {end.avail_gib} GiB")
    profiling = kb.first(F.MemoryProfiling, rank, role)
    if profiling is not None and None not in (profiling.total_gpu_memory_gib, profiling.available_gpu_memory_gib):
        return row(category, gib(profiling.total_gpu_memory_gib - profiling.available_gpu_memory_gib), "derived",
                   rule_name, (profiling,), f"`Memory profiling:` free before weights (total_gpu_memory) "
                   f"{profiling.total_gpu_memory_gib} − free after (available_gpu_memory) "
                   f"{profiling.available_gpu_memory_gib} GiB; both are minima over ranks ({line_ref(profiling)})")
    if kb.of(F.WeightsCommitted, rank=rank, role=None):
        return row(category, Unknown("weights load in overlap mode: the end line carries no memory "
                                     "figure"), "unknown", rule_name, kb.of(F.WeightsCommitted, rank=rank, role=None), "")
    return row(category, Unknown("no completed weight load with a memory figure is stated "
                                 "for this rank"), "unknown", rule_name, (begin, end), "")


@rule("breakdown.weights", frameworks=("sglang",),
      reads=(*_WEIGHT_LINES, "target_rank"),
      concludes=("breakdown:weights",))
def weights(kb):
    """What it concludes: `breakdown.weights`: the GiB the target model's weights took on the rank.

    How: The `mem usage` of `Load weight end`, else free memory before the load minus free memory
    after it (from `Load weight begin/end`, or the DeepSeek-V4 branch's `Memory profiling:` line,
    whose total_gpu_memory is the free memory before weights). With `--startup-weight-load-mode
    overlap` the end line has no figure, and the row stays unknown rather than trusting a short load
    time.

    Example: `Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.44 GB, mem
    usage=14.99 GB.`"""
    rank = target(kb)
    if rank is not None:
        yield _weights(kb, rank, "target", "weights", "breakdown.weights")


@rule("breakdown.draft-weights", frameworks=("sglang",),
      reads=(*_WEIGHT_LINES, "target_rank"),
      concludes=("breakdown:draft_weights",))
def draft_weights(kb):
    """What it concludes: `breakdown.draft_weights`: the GiB of a speculative-decoding draft model's
    weights.

    How: The draft worker's own weight-load lines.

    Example: after the target's, the draft's `Load weight end. type=LlamaForCausalLMEagle, … mem
    usage=1.00 GB.`"""
    rank = target(kb)
    if rank is not None and kb.of(F.LoadWeightBegin, F.LoadWeightEnd, rank=rank, role="draft"):
        yield _weights(kb, rank, "draft", "draft_weights", "breakdown.draft-weights")


def _kv(kb, rank, role, category, rule_name):
    post = kb.last(F.PostCaptureKVSizing, rank, role)
    if post is not None and post.kv_gib is not None:
        return row(category, post.kv_gib, "measured", rule_name, (post,),
                   f"`Post-capture KV sizing: KV cache allocated` KV size ({line_ref(post)}); "
                   "supersedes the pre-capture reservation")
    lines = [f for f in kb.of(F.KVCacheAllocated, rank=rank, role=role) if not f.va_upper_bound]
    sized = [f for f in lines if f.total_gib is not None]
    if sized:
        total = gib(sum(f.total_gib for f in sized))
        parts = " + ".join(
            (f"K {f.k_gib} + V {f.v_gib}" if f.kv_gib is None else f"KV {f.kv_gib}")
            + (f" ({f.label})" if f.label else "") + f" [{line_ref(f)}]" for f in sized)
        return row(category, total, "measured", rule_name, sized, f"KV Cache is allocated: {parts} GiB")
    swa = kb.first(F.SWAKVPoolUsage, rank, role)
    if swa is not None and swa.gib is not None and not swa.va_upper_bound:
        return row(category, swa.gib, "measured", rule_name, (swa,),
                   f"SWAKVPool mem usage (full + SWA sub-pools, {line_ref(swa)})")
    if role == "draft":
        return None
    built = dsv4_built(kb, rank, role)
    if built is not None and built[0].bytes_per_full_token is not None and built[2].full < built[1].full:
        calc, first, sizes = built
        fixed = gib(sum(calc.fixed_gib.values()))
        return row(category, gib(sizes.full * calc.bytes_per_full_token / GIB + fixed), "derived", rule_name,
                   (calc, first, sizes),
                   f"DeepSeek-V4 pools print no KV line: the memory bought {first.full:,} tokens ({line_ref(first)}), "
                   f"built for {sizes.full:,} ({line_ref(sizes)}, a limit cut them): {sizes.full:,} × "
                   f"{calc.bytes_per_full_token} B + fixed {fixed} GiB")
    dsv4 = kb.first(F.DSV4MemoryCalculation, rank, role)
    if dsv4 is not None and dsv4.available_bytes_gib is not None:
        return row(category, dsv4.available_bytes_gib, "derived", rule_name, (dsv4,),
                   f"DeepSeek-V4 pools print no KV line: the budget they were sized from, "
                   f"available_bytes ({line_ref(dsv4)}); the pools fill it to within a page")
    end = kb.first(F.LoadWeightEnd, rank, role)
    pool = kb.first(F.MemoryPoolEnd, rank, role)
    if end is not None and end.avail_gib is not None and pool is not None:
        mamba = kb.first(F.MambaCacheAllocated, rank, role)
        state = mamba.total_gib if mamba is not None and mamba.total_gib is not None else 0.0
        formula = (f"free after weights {end.avail_gib} − free after pools {pool.avail_gib}"
                   + (f" − mamba state {state}" if state else "")
                   + " GiB: the drop across pool allocation (includes the small request-to-token table)")
        return row(category, gib(end.avail_gib - pool.avail_gib - state), "derived", rule_name,
                   (end, pool, mamba), formula)
    return row(category, Unknown("no KV allocation line, and no free-memory readings around the "
                                 "pool allocation"), "unknown", rule_name, (), "")


@rule("breakdown.kv-cache", frameworks=("sglang",),
      reads=(*_KV_LINES, "target_rank"),
      concludes=("breakdown:kv_cache",))
def kv_cache(kb):
    """What it concludes: `breakdown.kv_cache`: the GiB of the target model's KV pool on the rank.

    How: The final `Post-capture KV sizing` size when post-capture sizing ran; else the sum of the
    `KV Cache is allocated` lines (K+V, or KV for MLA; Full plus SWA sub-pools), never the `VA upper
    bound` reservation; else the `SWAKVPool` total (never added to its sub-pools); else
    DeepSeek-V4's `available_bytes`; else the drop in free memory across the pool phase. The row
    says which.

    Example: `KV Cache is allocated. #tokens: 415615, K size: 25.37 GB, V size: 25.37 GB`: 50.74
    GiB."""
    rank = target(kb)
    if rank is not None:
        yield _kv(kb, rank, "target", "kv_cache", "breakdown.kv-cache")


@rule("breakdown.draft-kv-cache", frameworks=("sglang",),
      reads=(*_KV_LINES, "target_rank"),
      concludes=("breakdown:draft_kv_cache",))
def draft_kv_cache(kb):
    """What it concludes: `breakdown.draft_kv_cache`: the GiB of the draft model's KV pool.

    How: The draft worker's own KV lines (same #tokens as the target pool).

    Example: the draft's `KV Cache is allocated. #tokens: 300000, K size: 0.57 GB, V size: 0.57 GB`:
    1.14 GiB."""
    rank = target(kb)
    if rank is not None:
        found = _kv(kb, rank, "draft", "draft_kv_cache", "breakdown.draft-kv-cache")
        if found is not None:
            yield found


def _graphs(kb, rank, role, category, rule_name):
    ends = kb.of(F.GraphCaptureEnd, rank=rank, role=role)
    begins = kb.of(F.GraphCaptureBegin, rank=rank, role=role)
    if not ends:
        args = kb.first(F.ServerArgs, role=None)
        if role == "target" and args is not None and args.fields.get("disable_cuda_graph") is True:
            return row(category, 0.0, "derived", rule_name, (args,), "server_args disable_cuda_graph=True")
        if begins:
            return row(category, Unknown("capture began but no capture finished"),
                       "unknown", rule_name, begins, "")
        return None if role == "draft" else row(
            category, Unknown("no graph capture is stated for this rank"), "unknown", rule_name, (), "")
    known = [e for e in ends if e.mem_usage_gib is not None]
    if not known:
        return row(category, Unknown("the capture-end lines print no memory figure (before v0.4.3.post3)"),
                   "unknown", rule_name, ends, "")
    parts = " + ".join(f"{e.graph} {e.mem_usage_gib} [{line_ref(e)}]" for e in known)
    missing = len(ends) - len(known)
    formula = f"Σ capture-end `mem usage`: {parts} GiB" + (
        f"; {missing} capture line(s) print no figure" if missing else "")
    return row(category, gib(sum(e.mem_usage_gib for e in known)), "measured", rule_name, known, formula)


@rule("breakdown.cuda-graph", frameworks=("sglang",),
      reads=(*_GRAPH_LINES, "target_rank"),
      concludes=("breakdown:cuda_graph",))
def cuda_graph(kb):
    """What it concludes: `breakdown.cuda_graph`: the GiB CUDA-graph capture took on the rank.

    How: The sum of `mem usage` over every capture of the target model on this rank (decode or
    verify, prefill, piecewise). Each figure is a difference of two free-memory readings, so it also
    holds whatever else allocated during capture.

    Example: `Capture cuda graph end. Time elapsed: 7.31 s. mem usage=0.58 GB. avail mem=11.94 GB.`"""
    rank = target(kb)
    if rank is not None:
        yield _graphs(kb, rank, "target", "cuda_graph", "breakdown.cuda-graph")


@rule("breakdown.draft-cuda-graph", frameworks=("sglang",),
      reads=(*_GRAPH_LINES, "target_rank"),
      concludes=("breakdown:draft_cuda_graph",))
def draft_cuda_graph(kb):
    """What it concludes: `breakdown.draft_cuda_graph`: the GiB of the draft model's CUDA-graph
    captures.

    How: Every draft capture (decode, extend) on this rank. From v0.5.14 only TP rank 0 prints them.

    Example: the draft's `Capture cuda graph end. Time elapsed: 12.00 s. avail mem=22.10 GB. mem
    usage=0.80 GB.`"""
    rank = target(kb)
    if rank is not None:
        found = _graphs(kb, rank, "draft", "draft_cuda_graph", "breakdown.draft-cuda-graph")
        if found is not None:
            yield found


@rule("breakdown.mamba-state", frameworks=("sglang",),
      reads=(F.MambaCacheAllocated, "target_rank"),
      concludes=("breakdown:mamba_state",))
def mamba_state(kb):
    """What it concludes: `breakdown.mamba_state`: the GiB of a hybrid linear-attention model's Mamba
    state.

    How: Conv + SSM state (+ the speculative intermediate caches) from `Mamba Cache is allocated`.

    Example: `Mamba Cache is allocated. conv_state size: 1.00GB, ssm_state size: 3.00GB`: 4.00 GiB."""
    rank = target(kb)
    mamba = kb.first(F.MambaCacheAllocated, rank) if rank is not None else None
    if mamba is not None and mamba.total_gib is not None:
        extra = [x for x in (mamba.intermediate_ssm_gib, mamba.intermediate_conv_gib) if x is not None]
        yield row("mamba_state", mamba.total_gib, "measured", "breakdown.mamba-state", (mamba,),
                  f"conv_state {mamba.conv_gib} + ssm_state {mamba.ssm_gib}"
                  + "".join(f" + {x}" for x in extra) + f" GiB ({line_ref(mamba)})")


@rule("breakdown.framework", frameworks=("sglang",),
      reads=(F.LoadWeightBegin, "target_rank", "gpu:total_gib", "device:name?"),
      concludes=("breakdown:framework",))
def framework(kb):
    """What it concludes: `breakdown.framework`: the GiB in use before the weights load.

    How: Memory in use before the weights load — CUDA context, NCCL and custom all-reduce buffers,
    and any other process on the GPU — as the GPU total minus the free memory `Load weight begin`
    reports. Needs the GPU total (`--gpu` or `--gpu-total-gib`). Unknown on a device whose `avail
    mem` is not its free memory (XPU: total − PyTorch-allocated; CPU): memory outside PyTorch is
    then in no reading.

    Example: `Load weight begin. avail mem=78.43 GB` on an H100 SXM (`--gpu h100_sxm`, 79.65 GiB):
    1.22 GiB."""
    rank = target(kb)
    if rank is None:
        return
    begin = kb.first(F.LoadWeightBegin, rank)
    if begin is None:
        yield row("framework", Unknown(BEFORE_WEIGHTS_UNSTATED),
                  "unknown", "breakdown.framework", (), "")
        return
    caveat = avail_caveat(kb)
    if caveat is not None:
        yield row("framework", Unknown(f"`avail mem` on this device is {caveat}, so the memory in use before "
                                       "the weights is in no reading"),
                  "unknown", "breakdown.framework", (begin, kb.get("device", "name")), "")
        return
    total = kb.get("gpu", "total_gib")
    if total is None:
        return
    if not total.known:
        yield row("framework", Unknown(f"needs the GPU's total memory: {total.value.reason}"),
                  "unknown", "breakdown.framework", (begin, total), "")
    else:
        yield row("framework", gib(total.value - begin.avail_gib), "derived", "breakdown.framework",
                  (total, begin), f"GPU total {total.value} − free before weights {begin.avail_gib} GiB")


@rule("breakdown.free", frameworks=("sglang",),
      reads=(F.TokenBudget, F.GraphCaptureEnd, F.MemoryPoolEnd, "target_rank", "device:name?"),
      concludes=("breakdown:free",))
def free(kb):
    """What it concludes: `breakdown.free`: the GiB the rank had left at the end of start-up.

    How: What the rank had left at the end of start-up — the `available_gpu_mem` of the
    `max_total_num_tokens` line (TP 0 only), else the last capture-end reading, else the `Memory
    pool end` reading. Unknown on a device whose readings are not its free memory (`device.name`:
    XPU's total − PyTorch-allocated, CPU's host memory), so no advice rests on memory not shown.

    Example: `max_total_num_tokens=415615, …, available_gpu_mem=11.94 GB`."""
    rank = target(kb)
    if rank is None:
        return
    budget = next((b for b in kb.of(F.TokenBudget, rank=rank, role=None)
                   if b.available_gpu_mem_gib is not None), None)
    ends = [e for e in kb.of(F.GraphCaptureEnd, rank=rank, role=None) if e.avail_gib is not None]
    pools = kb.of(F.MemoryPoolEnd, rank=rank, role=None)
    last = max(ends + pools, key=lambda f: f.evidence.line, default=None)
    caveat = avail_caveat(kb)
    reading = budget or last
    if reading is not None and caveat is not None:
        printed = reading.available_gpu_mem_gib if reading is budget else reading.avail_gib
        yield row("free", Unknown(f"the last reading, {printed} GiB ({line_ref(reading)}), is {caveat}"),
                  "unknown", "breakdown.free", (reading, kb.get("device", "name")), "")
        return
    if budget is not None:
        yield row("free", budget.available_gpu_mem_gib, "measured", "breakdown.free", (budget,),
                  f"available_gpu_mem ({line_ref(budget)})")
        return
    if last is not None:
        yield row("free", last.avail_gib, "measured", "breakdown.free", (last,),
                  f"free memory at the last reading of start-up ({line_ref(last)})")
    else:
        yield row("free", Unknown("no free-memory reading after the pools is stated"),
                  "unknown", "breakdown.free", (), "")



@rule("breakdown.unattributed", frameworks=("sglang",),
      reads=(F.LoadWeightBegin, "target_rank", "breakdown:free", *(f"breakdown:{c}" for c in HELD_SINCE_WEIGHTS)),
      concludes=("breakdown:unattributed",))
def unattributed(kb):
    """What it concludes: `breakdown.unattributed`: the GiB the free memory fell by during start-up
    that no line names.

    How: How much the free memory fell during start-up beyond what the lines name — free before
    weights − free at the end − every category above. It holds the request-to-token table, attention
    workspaces, allocator slack and anything allocated between readings. Computed only when every
    figure it needs is known.

    Example: free before weights 78.43 − free at the end 11.94 − weights 14.99 − KV 50.74 − graphs
    0.58 = 0.18 GiB."""
    rank = target(kb)
    begin = kb.first(F.LoadWeightBegin, rank) if rank is not None else None
    rows = [kb.get("breakdown", c) for c in ("free",) + HELD_SINCE_WEIGHTS]
    present = [r for r in rows if r is not None]
    if rank is None:
        return
    if begin is None:
        yield row("unattributed", Unknown(BEFORE_WEIGHTS_UNSTATED), "unknown",
                  "breakdown.unattributed", present, "")
        return
    if rows[0] is None or rows[3] is None:
        gone = "free" if rows[0] is None else "cuda_graph"
        yield row("unattributed", Unknown(f"needs every category: no {gone} row"), "unknown",
                  "breakdown.unattributed", (begin, *present), "")
        return
    if not all(r.known for r in present):
        missing = ", ".join(r.key for r in present if not r.known)
        yield row("unattributed", Unknown(f"needs every category: {missing} unknown"), "unknown",
                  "breakdown.unattributed", (begin, *present), "")
        return
    free_row, parts = present[0], present[1:]
    value = gib(begin.avail_gib - free_row.value - sum(r.value for r in parts))
    yield row("unattributed", value, "derived", "breakdown.unattributed", (begin, *present),
              f"free before weights {begin.avail_gib} − free at end {free_row.value} − "
              + " − ".join(f"{r.key} {r.value}" for r in parts) + " GiB")
