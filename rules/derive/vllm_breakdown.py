"""Where the target rank's GPU memory went under vLLM, category by category.

vLLM states its figures in GiB ("GB" in releases up to 0.8.2, computed as GiB). Rows are
`measured` (printed), `derived` (arithmetic shown) or `unknown` (reason shown).
"""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Unknown, rule
from capdiag.rules._common import breakdown_rows, gib, line_ref, target
from capdiag.rules.derive.breakdown import row
from capdiag.vocabulary import NAMED


def lines_of(kb, kind) -> list:
    """The target rank's lines of a kind; where it printed none, the lines of the rank that
    stands in for it (rules/stand_in.py)."""
    stand = kb.get("stand_in", kind.__name__)
    return kb.of(kind, rank=stand.value if stand is not None and stand.known else target(kb))


def via(kb, *facts) -> tuple:
    """The facts, each followed by the stand-in conclusion that chose its rank, if one did."""
    out: list = []
    for fact in facts:
        if fact is None:
            continue
        out.append(fact)
        stand = kb.get("stand_in", type(fact).__name__)
        if stand is not None and stand.known and fact.rank.key() == stand.value:
            out.append(stand)
    return tuple(out)


def from_rank(kb, fact) -> str:
    """Whose line gave the figure, when a stand-in rank's did; else nothing."""
    stand = kb.get("stand_in", type(fact).__name__)
    if stand is None or not stand.known or fact.rank.key() != stand.value:
        return ""
    return f", printed by {stand.detail['rank']} (stand-in: the target printed none)"


def silent(kb, *kinds) -> str:
    """Why the target has none of these lines when other ranks printed them and disagree."""
    reasons = [kb.get("stand_in", k.__name__) for k in kinds]
    return next((f"; {d.value.reason}" for d in reasons if d is not None and not d.known), "")


def _profile(kb, key):
    """The first memory-profiling statement of `key` for the target, as (fact, value)."""
    for p in lines_of(kb, F.VllmMemoryProfile):
        if key in p.values:
            return p, p.values[key]
    return None, None


def _startup(kb, attr):
    s = next((s for s in lines_of(kb, F.VllmStartupMemory) if not s.error and getattr(s, attr) is not None), None)
    return (s, getattr(s, attr)) if s is not None else (None, None)


@rule("vllm.breakdown.weights", frameworks=("vllm",),
      reads=(F.VllmModelLoading, F.VllmMemoryProfile, F.VllmStartupMemory, "target_rank", "stand_in"),
      concludes=("breakdown:weights",))
def weights(kb):
    """What it concludes: `breakdown.weights`: the GiB vLLM's model load took on the rank.

    How: `Model loading took X GiB` (torch memory the load allocated on this rank; older releases
    print "GB" for the same GiB figure), else the profiling record's `model weights take`, else the
    `Free memory on device` report's weight figure.

    Example: `Model loading took 14.99 GiB and 4.2 seconds`."""
    if target(kb) is None:
        return
    load = next(iter(lines_of(kb, F.VllmModelLoading)), None)
    if load is not None:
        note = " (printed \"GB\", computed as GiB)" if load.unit == "GB" else ""
        yield row("weights", load.gib, "measured", "vllm.breakdown.weights", via(kb, load),
                  f"Model loading took {load.gib} {load.unit or 'GiB'}{note} ({line_ref(load)}){from_rank(kb, load)}")
        return
    for fact, value, what in (_profile(kb, "weights_gib") + ("profiling record: model weights take",),
                              _startup(kb, "weights_gib") + ("`Free memory on device` report",)):
        if fact is not None:
            yield row("weights", value, "measured", "vllm.breakdown.weights", via(kb, fact),
                      f"{what} ({line_ref(fact)}){from_rank(kb, fact)}")
            return
    yield row("weights", Unknown("no model-loading figure is stated for this rank"
                                 + silent(kb, F.VllmModelLoading, F.VllmMemoryProfile)), "unknown",
              "vllm.breakdown.weights", (), "")


@rule("vllm.breakdown.kv-cache", frameworks=("vllm",),
      reads=(F.VllmAvailableKV, F.VllmMemoryProfile, F.VllmInitialFree, F.VllmCpuKVSpace, "target_rank", "stand_in",
             "config:gpu_memory_utilization?"),
      concludes=("breakdown:kv_cache",))
def kv_cache(kb):
    """What it concludes: `breakdown.kv_cache`: the GiB vLLM turned into KV blocks.

    How: `Available KV cache memory` (the bytes turned into blocks), else the profiling record's KV
    figure (`the rest of the memory reserved for KV Cache`, `kv_cache_size=`; HPU's `reserved for
    KV cache`, TPU's `total_hbm_avail_gb`), else the CPU backend's KV space (`Auto set (K/N) GiB
    for KV cache on node 0` or `Explicitly set`, VLLM_CPU_KVCACHE_SPACE), else the explicit
    `--kv-cache-memory` reservation, else on XPU (which prints no KV figure) what xpu_worker.py
    gives it: total × gpu_memory_utilization − the profiling run's peak, when the log states all
    three.

    Example: `Available KV cache memory: 34.64 GiB`."""
    if target(kb) is None:
        return
    available = next(iter(lines_of(kb, F.VllmAvailableKV)), None)
    fact, value = _profile(kb, "kv_cache_gib")
    reserved = next((i for i in lines_of(kb, F.VllmInitialFree) if i.reserved_kv_gib is not None), None)
    cpu = next(iter(lines_of(kb, F.VllmCpuKVSpace)), None)
    if available is not None:
        yield row("kv_cache", available.gib, "measured", "vllm.breakdown.kv-cache", via(kb, available),
                  f"Available KV cache memory ({line_ref(available)}){from_rank(kb, available)}")
    elif fact is not None:
        yield row("kv_cache", value, "measured", "vllm.breakdown.kv-cache", via(kb, fact),
                  f"profiling record: memory reserved for the KV cache ({line_ref(fact)}){from_rank(kb, fact)}")
    elif cpu is not None:
        yield row("kv_cache", cpu.kv_gib, "measured", "vllm.breakdown.kv-cache", via(kb, cpu),
                  f"CPU backend: {cpu.mode} KV cache space on node {cpu.node} of its {cpu.node_total_gib} GiB "
                  f"({line_ref(cpu)}){from_rank(kb, cpu)}")
    elif reserved is not None:
        yield row("kv_cache", reserved.reserved_kv_gib, "measured", "vllm.breakdown.kv-cache", via(kb, reserved),
                  f"explicit --kv-cache-memory reservation ({line_ref(reserved)}){from_rank(kb, reserved)}")
    elif (xpu := _xpu_kv(kb)) is not None:
        value, facts, formula = xpu
        yield row("kv_cache", value, "derived", "vllm.breakdown.kv-cache", facts, formula)
    else:
        yield row("kv_cache", Unknown("no KV-cache memory figure is stated for this rank"
                                      + silent(kb, F.VllmAvailableKV, F.VllmMemoryProfile)), "unknown",
                  "vllm.breakdown.kv-cache", (), "")


def _xpu_kv(kb):
    """(GiB, premises, formula) of XPU's KV budget, total × utilization − peak; None when the log
    does not state all three."""
    util = kb.get("config", "gpu_memory_utilization")
    profiles = [p for p in lines_of(kb, F.VllmMemoryProfile) if p.form == "xpu"]
    total = next((p for p in profiles if "total_gpu_memory_gib" in p.values), None)
    peak = next((p for p in profiles if "peak_gib" in p.values), None)
    if util is None or not util.known or total is None or peak is None:
        return None
    t, u, k = total.values["total_gpu_memory_gib"], util.value, peak.values["peak_gib"]
    return (gib(t * u - k), via(kb, total, peak) + (util,),
            f"XPU: total {t} × gpu_memory_utilization {u} − profiling peak {k} GiB, as xpu_worker.py sizes it "
            f"({line_ref(total)}, {line_ref(peak)})")


@rule("vllm.breakdown.cuda-graph", frameworks=("vllm",),
      reads=(F.VllmGraphCapture, F.VllmGraphPool, F.VllmGraphEstimate, "target_rank", "stand_in", "config:enforce_eager",
             F.VllmCpuKVSpace),
      concludes=("breakdown:cuda_graph",))
def cuda_graph(kb):
    """What it concludes: `breakdown.cuda_graph`: the GiB vLLM's CUDA-graph capture took.

    How: `Graph capturing finished …, took X GiB` (free memory before minus after capture), else the
    0.18+ `CUDA graph pool memory … (actual)`, else the pre-capture estimate (stated as an
    estimate). A negative capture figure is a measurement artefact (free memory rose during capture)
    and is not used as a size. `enforce_eager` or the CPU backend → none.

    Example: `Graph capturing finished in 16 secs, took 0.53 GiB`."""
    if target(kb) is None:
        return
    capture = next((g for g in lines_of(kb, F.VllmGraphCapture) if g.gib is not None), None)
    pool = next(iter(lines_of(kb, F.VllmGraphPool)), None)
    estimate = next(iter(lines_of(kb, F.VllmGraphEstimate)), None)
    if capture is not None and capture.gib >= 0:
        yield row("cuda_graph", capture.gib, "measured", "vllm.breakdown.cuda-graph", via(kb, capture),
                  f"Graph capturing took {capture.gib} GiB ({line_ref(capture)}){from_rank(kb, capture)}")
    elif pool is not None:
        yield row("cuda_graph", pool.actual_gib, "measured", "vllm.breakdown.cuda-graph", via(kb, pool),
                  f"CUDA graph pool memory (actual) ({line_ref(pool)}){from_rank(kb, pool)}")
    elif capture is not None:
        yield row("cuda_graph", Unknown(f"the capture line prints {capture.gib} GiB: free memory rose during "
                                        "capture, a measurement artefact, not a size"), "unknown",
                  "vllm.breakdown.cuda-graph", via(kb, capture), "")
    elif estimate is not None:
        yield row("cuda_graph", estimate.gib, "derived", "vllm.breakdown.cuda-graph", via(kb, estimate),
                  f"vLLM's estimate before capture ({line_ref(estimate)}); no measured figure{from_rank(kb, estimate)}")
    elif kb.value("config", "enforce_eager") is True:
        yield row("cuda_graph", 0.0, "derived", "vllm.breakdown.cuda-graph", (kb.get("config", "enforce_eager"),),
                  "enforce_eager=True: no graphs")
    elif (cpu := next(iter(lines_of(kb, F.VllmCpuKVSpace)), None)) is not None:
        yield row("cuda_graph", 0.0, "derived", "vllm.breakdown.cuda-graph", via(kb, cpu),
                  f"the CPU backend ({line_ref(cpu)}) captures no CUDA graphs")
    else:
        yield row("cuda_graph", Unknown("no graph-capture figure is stated for this rank"
                                        + silent(kb, F.VllmGraphCapture, F.VllmGraphPool)), "unknown",
                  "vllm.breakdown.cuda-graph", (), "")


@rule("vllm.breakdown.activation", frameworks=("vllm",),
      reads=(F.VllmMemoryProfile, F.VllmStartupMemory, "target_rank", "stand_in"),
      concludes=("breakdown:activation",))
def activation(kb):
    """What it concludes: `breakdown.activation`: the peak activation memory vLLM's profiling pass
    measured.

    How: The peak activation memory of the profiling forward pass, where printed (V0 record, 0.10.2+
    `Free memory on device` report). vLLM reserves it inside the budget.

    Example: `torch peak memory increase: 1.19GiB` of the profiling record."""
    if target(kb) is None:
        return
    for fact, value, what in (_profile(kb, "activation_peak_gib") + ("profiling record",),
                              _startup(kb, "activation_gib") + ("`Free memory on device` report",)):
        if fact is not None:
            yield row("activation", value, "measured", "vllm.breakdown.activation", via(kb, fact),
                      f"peak activation, {what} ({line_ref(fact)}){from_rank(kb, fact)}")
            return


@rule("vllm.breakdown.framework", frameworks=("vllm",),
      reads=(F.VllmMemoryProfile, F.VllmStartupMemory, "target_rank", "stand_in", "breakdown:weights"),
      concludes=("breakdown:framework",))
def framework(kb):
    """What it concludes: `breakdown.framework`: vLLM's non-torch memory (CUDA context, NCCL, custom
    all-reduce).

    How: Non-torch memory (CUDA context, NCCL and custom all-reduce buffers) as the profiling record
    or the `Free memory on device` report prints it; from 0.27 that report prints weights +
    non-torch together as "consumed", so non-torch = consumed − weights. Not printed → unknown.

    Example: `non-torch forward increase memory: 0.30GiB` of the profiling record."""
    if target(kb) is None:
        return
    for fact, value, what in (_profile(kb, "non_torch_gib") + ("profiling record",),
                              _startup(kb, "non_torch_gib") + ("`Free memory on device` report",)):
        if fact is not None:
            yield row("framework", value, "measured", "vllm.breakdown.framework", via(kb, fact),
                      f"non-torch memory, {what} ({line_ref(fact)}){from_rank(kb, fact)}")
            return
    consumed, value = _startup(kb, "consumed_gib")
    weights_row = kb.get("breakdown", "weights")
    if consumed is not None and weights_row is not None and weights_row.known:
        yield row("framework", gib(value - weights_row.value), "derived", "vllm.breakdown.framework",
                  via(kb, consumed) + (weights_row,), f"consumed (weights + non-torch) {value} − weights {weights_row.value} GiB "
                  f"({line_ref(consumed)})")
        return
    yield row("framework", Unknown("no non-torch memory figure is stated"), "unknown",
              "vllm.breakdown.framework", (), "")


@rule("vllm.breakdown.budget", frameworks=("vllm",),
      reads=(F.VllmMemoryProfile, F.VllmStartupMemory, F.VllmCpuKVSpace, "target_rank", "stand_in",
             "config:gpu_memory_utilization", "gpu:total_gib"),
      concludes=("breakdown:budget",))
def budget(kb):
    """What it concludes: `breakdown.budget`: the memory vLLM may use, and by subtraction what it
    leaves alone.

    How: What vLLM may use, total × gpu_memory_utilization (printed by the profiling record and the
    `Free memory on device` report, else computed from a stated total and utilization; on the CPU
    backend, the memory requested for the worker on its NUMA node; on HPU, the memory free after the
    profiling run × utilization, as `Free device memory` prints it), and what lies outside it (total
    − budget): memory vLLM leaves alone.

    Example: `Desired GPU memory utilization is (0.92, 72.91 GiB)`: 72.91 GiB of 79.25."""
    util = kb.get("config", "gpu_memory_utilization")
    if target(kb) is None or util is None:
        return
    cpu = next((c for c in lines_of(kb, F.VllmCpuKVSpace) if c.requested_gib is not None), None)
    if cpu is not None:  # the CPU backend prints the worker's share of the node
        yield row("budget", cpu.requested_gib, "measured", "vllm.breakdown.budget", via(kb, cpu),
                  f"CPU backend: memory requested for the worker on node {cpu.node} of its {cpu.node_total_gib} GiB "
                  f"({line_ref(cpu)})")
        return
    total_fact, total = _profile(kb, "total_gpu_memory_gib")
    usable_fact, usable = _profile(kb, "usable_gib")
    startup = next((s for s in lines_of(kb, F.VllmStartupMemory) if s.total_gib is not None), None)
    if total is None and startup is not None:
        total_fact, total = startup, startup.total_gib
    if usable is None and startup is not None and startup.requested_gib is not None:
        usable_fact, usable = startup, startup.requested_gib
    if total is None:  # the GPU total from --gpu, --gpu-total-gib or nvidia-smi (slightly above vLLM's own)
        given = kb.get("gpu", "total_gib")
        total_fact, total = (given, given.value) if given is not None and given.known else (None, None)
    if total is None:
        yield row("budget", Unknown("needs the GPU total, which the inputs do not state (give --gpu or "
                                    "--gpu-total-gib)"), "unknown", "vllm.breakdown.budget", (util,), "")
        return
    if usable is not None:
        how = ("free memory after profiling × utilization, as HPU sizes it"
               if getattr(usable_fact, "form", None) == "hpu" else "total × utilization")
        yield row("budget", usable, "measured", "vllm.breakdown.budget", (usable_fact,),
                  f"{how}, as printed ({line_ref(usable_fact)})", )
    elif util.known:
        yield row("budget", gib(total * util.value), "derived", "vllm.breakdown.budget", (total_fact, util),
                  f"total {total} × gpu_memory_utilization {util.value} GiB")
    else:
        yield row("budget", Unknown(f"needs gpu_memory_utilization: {util.value.reason}"), "unknown",
                  "vllm.breakdown.budget", (total_fact, util), "")


@rule("vllm.breakdown.unstated", frameworks=("vllm",),
      reads=("target_rank", "gpu:total_gib", "breakdown:budget?", *(f"breakdown:{c}?" for c in NAMED)),
      concludes=("breakdown:unstated",))
def unstated(kb):
    """What it concludes: `breakdown.unstated`: the GiB of the GPU that no vLLM row places.

    How: The GPU total less every row the log names (non-torch memory, weights, KV cache, CUDA
    graphs, the profiled activation peak), so the breakdown's top-level rows sum to the GPU. It is
    mostly what `gpu_memory_utilization` leaves outside vLLM's budget (total − budget, shown beside
    it), less graphs captured outside that budget. The rows are read at different moments of
    start-up, so a small negative value is rounding and timing, not a fault. A row the log does not
    state (non-torch memory before 0.10.2) is in this one, and the derivation says so. Unknown
    without the GPU total, the weights or the KV cache.

    Example: H100 79.19 GiB − non-torch 0.30 − weights 14.99 − KV 56.07 − graphs 0.50 − activation
    1.19 = 6.14 GiB; the budget at utilization 0.92 leaves 6.34 GiB outside it."""
    if target(kb) is None:
        return
    total = kb.get("gpu", "total_gib")
    parts = breakdown_rows(kb, NAMED)
    if total is None or not total.known:
        reason = total.value.reason if total is not None else "not stated in the inputs"
        yield row("unstated", Unknown(f"needs the GPU total: {reason}"), "unknown", "vllm.breakdown.unstated",
                  (total, *parts), "")
        return
    known = [p for p in parts if p.known]
    missing = [p.key for p in parts if not p.known]
    if any(p.key in ("weights", "kv_cache") for p in parts if not p.known):
        yield row("unstated", Unknown(f"needs the weights and the KV cache; unknown: {', '.join(missing)}"),
                  "unknown", "vllm.breakdown.unstated", (total, *parts), "")
        return
    value = gib(total.value - sum(p.value for p in known))
    spent = kb.get("breakdown", "budget")
    outside = (f"; total − budget {spent.value} = {gib(total.value - spent.value)} GiB lies outside what vLLM "
               "may use" if spent is not None and spent.known else "")
    yield row("unstated", value, "derived", "vllm.breakdown.unstated", (total, *parts, spent),
              f"GPU total {total.value} − " + " − ".join(f"{p.key} {p.value}" for p in known) + f" GiB{outside}"
              + (f"; the log does not state {', '.join(missing)}, so it is in this row" if missing else "")
              + ("; below zero: the rows were read at different moments" if value < 0 else ""))
