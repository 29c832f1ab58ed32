from __future__ import annotations

from typing import Optional

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules._common import is_vllm, line_ref
from capdiag.rules.findings._advice import advised, failed
from capdiag.vocabulary import MAX_FRACTION

# Lines that show the KV pool was sized: an out-of-memory error after one of these happened
# in capture or serving, not in pool sizing.
_POOL_SIZED = (F.MemoryPoolEnd, F.VllmKVCacheSize, F.VllmGpuBlocks, F.VllmAvailableKV)
_MEMORY_CAUSES = ("cuda-out-of-memory", "kv-cache-no-room", "moe-experts-unquantized")
# The phase a traceback names (references/failure-causes.toml) → which way the fix goes.
_TRACED = {"init": ("weights", "the process ran out before the KV pool, while setting up"),
           "weights": ("weights", "the weights themselves did not fit while loading"),
           "profiling": ("profile", "the profiling forward pass ran out before the KV cache was sized"),
           "kv_pool": ("raise", "the KV pool could not be sized within the static fraction"),
           "attention_backend": ("lower", "the pool was allocated; the attention backend's buffers then did not fit"),
           "graph_capture": ("lower", "the pool was allocated; CUDA-graph capture then ran out of the headroom left"),
           "sampler_warmup": ("sampler", "the sampler's warm-up with max_num_seqs dummy requests ran out")}


def _graphs_outgrow_the_pool(kb) -> Optional[str]:
    """vLLM's graphs need more than its whole KV pool: lowering the utilization frees memory only
    from that pool (down to none, and vLLM refuses to start), so it cannot make room for them."""
    kv, graphs = kb.get("breakdown", "kv_cache"), kb.get("breakdown", "cuda_graph")
    if kv is None or graphs is None or not (kv.known and graphs.known) or graphs.value <= kv.value:
        return None
    return (f"Use --enforce-eager, or capture fewer CUDA graphs (compilation_config's max_cudagraph_capture_size or "
            f"cudagraph_capture_sizes; LoRA doubles the variants): they need about {graphs.value} GiB, and lowering "
            f"--gpu-memory-utilization can free at most the {kv.value} GiB KV pool, which would leave none.")


def _weights_fix(kb, failure) -> str:
    """What helps weights that did not fit: a named cause's own step (experts built unquantized),
    else more GPUs, and quantized weights only where the checkpoint is not quantized already."""
    if failure is not None and failure.value == "moe-experts-unquantized":
        return failure.detail["next_step"]
    quantization = kb.value("config", "quantization")
    if quantization and str(quantization).lower() not in ("none", "null"):
        return (f"the checkpoint is already quantized ({quantization}): add TP/PP or GPUs with more memory, or free "
                "the GPU of other processes.")
    return "add TP/PP, use quantized weights, or free the GPU of other processes."




def _no_room(kb, first) -> str | None:
    """Why no setting makes room for vLLM's profiling run and a KV cache: the weights alone fill
    what gpu_memory_utilization may hold at its most (total × 0.95), or leave beside them less
    than the allocation that failed — from the log's own figures; else None. (SGLang's pool
    arithmetic says the same through `advised`.)"""
    weights, total = kb.get("breakdown", "weights"), kb.get("gpu", "total_gib")
    total_gib = total.value if total is not None and total.known else \
        first.total_capacity_gib if isinstance(first, F.OutOfMemory) else None
    if weights is None or not weights.known or not total_gib:
        return None
    room = total_gib * MAX_FRACTION - weights.value
    asked = first.tried_to_allocate_mib / 1024 if isinstance(first, F.OutOfMemory) and first.tried_to_allocate_mib \
        else None
    head = f"The weights alone take {weights.value:.2f} GiB of the {total_gib:.2f} GiB GPU"
    if room <= 0:
        said = (f"{head}, more than even gpu_memory_utilization {MAX_FRACTION} would hold "
                f"({total_gib * MAX_FRACTION:.2f} GiB): no fraction or request size leaves room for a KV cache")
    elif asked is not None and room < asked:
        said = (f"{head}: even gpu_memory_utilization {MAX_FRACTION} leaves {room:.2f} GiB beside them, less than "
                f"the {asked:.2f} GiB the profiling run asked for; a smaller profile batch (--max-num-batched-tokens) "
                f"would leave at most that for the KV cache")
    else:
        return None
    return f"{said}, so " + _weights_fix(kb, kb.get("failure"))


@rule("out-of-memory", code="CD102", severity="error",
      reads=(F.OutOfMemory, F.NotEnoughMemory, F.VllmStartupError, F.LoadWeightBegin, F.LoadWeightEnd, F.VllmModelLoading,
             F.MemoryProfiling, F.VllmMemoryProfile, F.VllmArgs, F.Options, *_POOL_SIZED, "failure?",
             "config:mem_fraction_static?", "config:gpu_memory_utilization?", "gpu:total_gib?", "breakdown:weights?",
             "breakdown:activation?", "breakdown:framework?", "target_rank?", "config:quantization?",
             "breakdown:kv_cache?", "breakdown:cuda_graph?",
             F.Fact))  # the last phase line before the error, whatever its kind
def out_of_memory(kb):
    """What it checks: a CUDA out-of-memory error; SGLang's "Not enough memory" or "Loaded
    weights leave no GPU memory for the KV cache"; vLLM's "No available memory for the cache
    blocks".

    Why it matters: the direction of the fix depends on the phase, and the two directions are
    opposite. When the KV pool cannot be sized, the static fraction (SGLang's
    `--mem-fraction-static`, vLLM's `--gpu-memory-utilization`) is too *small* for weights plus
    pool. When graph capture or serving runs out after the pool exists, it is too *large*: the
    pool took the headroom that activations and graphs need. A vLLM out-of-memory during the
    profiling pass, before the pool is sized, is neither: the profile run itself did not fit.

    Example: `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 384.00 MiB. GPU 0 has
    a total capacity of 23.56 GiB of which 338.75 MiB is free.` after `Capture piecewise CUDA
    graph begin`.

    Each direction comes with a value and its arithmetic where the log gives the figures: the
    fraction at which the pool stops being empty, the fraction lower by the allocation that
    failed, half the batch the profiling or the sampler warm-up used. A value outside (0, 1) is
    never suggested: then no fraction helps, and the action says what would.

    What to do: pool phase → raise the fraction (or add TP, shorten the context, use an fp8 KV
    cache). Weights that do not fit while loading → more TP/PP or quantized weights (the fraction
    does not bound the load). Capture or serving → lower it, or shrink the graph batch sizes —
    on vLLM graphs larger than the whole KV pool, --enforce-eager or fewer captured sizes first:
    lowering the utilization frees memory only from that pool. vLLM profiling →
    lower `--max-num-batched-tokens` / `--max-num-seqs` / `--max-model-len`, or add GPUs — unless
    the weights alone fill 95% of the GPU: then no setting helps, only more TP/PP, quantized
    weights or a larger GPU.
    """
    errors = [f for f in kb.of(F.OutOfMemory, F.NotEnoughMemory, F.VllmStartupError, role=None)
              if not isinstance(f, F.VllmStartupError) or f.reason == "no-cache-memory"]
    if not errors:
        return
    vllm = is_vllm(kb)
    knob = "--gpu-memory-utilization" if vllm else "--mem-fraction-static"
    first = errors[0]
    before = [f for f in kb.facts if f.PHASE and f.evidence.line < first.evidence.line]
    phase = before[-1].PHASE if before else "init"
    sized = any(f.evidence.line < first.evidence.line for f in kb.of(*_POOL_SIZED, role=None))
    loaded = any(f.evidence.line < first.evidence.line for f in kb.of(F.LoadWeightEnd, F.VllmModelLoading,
                                                                         F.MemoryProfiling, F.VllmMemoryProfile,
                                                                         role=None))
    failure = kb.get("failure")
    traced = failure.detail["phase"] if failure is not None and failure.value in _MEMORY_CAUSES else None
    if isinstance(first, (F.NotEnoughMemory, F.VllmStartupError)):
        direction, why = "raise", "the KV pool could not be sized within the static fraction"
    elif traced in _TRACED:
        direction, why = _TRACED[traced]
    elif phase == "ready":  # the pool was sized whether or not the log shows it: serving ran out
        direction, why = "lower", "the server was serving; a request's working memory ran out of the headroom left"
    elif not loaded and not sized and phase in ("init", "weights"):
        direction, why = "weights", "the weights themselves did not fit while loading"
    elif vllm and not sized:
        direction, why = "profile", "the profiling forward pass ran out before the KV cache was sized"
    elif not sized:
        direction, why = "raise", "the KV pool could not be sized within the static fraction"
    else:
        direction, why = "lower", "the pool was allocated; capture or serving then ran out of the headroom left"
    if direction == "profile" and not vllm:
        direction = "raise"
    if traced:
        phase = traced
    detail = ""
    if isinstance(first, F.OutOfMemory) and first.tried_to_allocate_mib is not None:
        detail = (f" PyTorch tried to allocate {first.tried_to_allocate_mib} MiB with {first.free_mib} MiB free"
                  + (f" of {first.total_capacity_gib} GiB" if first.total_capacity_gib is not None else "") + ".")
    value, arithmetic, suggested = advised(kb, direction, first, vllm)
    no_room = _no_room(kb, first) if direction == "profile" else None
    action = no_room if no_room is not None else arithmetic if value is None else {
        "raise": f"Raise {knob}{value} (or add TP, shorten the context, use an fp8 KV cache).",
        "lower": f"Lower {knob}{value}" + (" (or lower --cuda-graph-max-bs, or disable the piecewise graph)." if not vllm
                                            else " (or reduce the CUDA-graph capture sizes, or --enforce-eager)."),
        "profile": f"Lower --max-num-batched-tokens{value}, --max-num-seqs or --max-model-len, or add GPUs: "
                   "gpu_memory_utilization applies only after profiling.",
        "sampler": f"Lower --max-num-seqs{value} (the sampler warms up with that many dummy requests), or lower {knob}.",
        "weights": f"The static fraction does not bound weight loading, so changing {knob} cannot help: "
                   + _weights_fix(kb, failure),
    }[direction] + arithmetic
    if no_room is not None:
        direction, suggested = "weights", None
    graphs_first = _graphs_outgrow_the_pool(kb) if vllm and direction == "lower" and phase == "graph_capture" else None
    if graphs_first is not None:
        action, suggested = graphs_first, None
    # after the ready line it is the serving server that ran out, not its start-up
    when = "while serving, after start-up" if phase == "ready" else f"during start-up ({phase.replace('_', ' ')})"
    after = "the server was ready" if phase == "ready" else f"the {phase.replace('_', ' ')} phase"
    yield Parts((failure if failure is not None and failure.value in _MEMORY_CAUSES else None, *errors,
                 before[-1] if before else None),
                title=f"Out of memory {when}",
                message=f"Out of memory after {after} ({line_ref(first)}): {why}.{detail}",
                action=action,
                detail={"direction": direction, "phase": phase, "suggested": suggested,
                        **failed(failure, _MEMORY_CAUSES)})
