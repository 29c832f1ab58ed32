"""vLLM's serving configuration, as the log states it."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import command_option, line_ref, number_or_text

# report key -> (engine-config field, argument name). The engine config holds resolved values.
_FIELDS = {
    "model": ("model", "model"), "max_model_len": ("max_seq_len", "max_model_len"),
    "tp_size": ("tensor_parallel_size", "tensor_parallel_size"),
    "pp_size": ("pipeline_parallel_size", "pipeline_parallel_size"),
    "dp_size": ("data_parallel_size", "data_parallel_size"),
    "kv_cache_dtype": ("kv_cache_dtype", "kv_cache_dtype"), "quantization": ("quantization", "quantization"),
    "enforce_eager": ("enforce_eager", "enforce_eager"), "max_running_requests": (None, "max_num_seqs"),
    "block_size": (None, "block_size"), "max_num_batched_tokens": (None, "max_num_batched_tokens"),
}


# a launch command may spell an argument by its short form (`-tp 2`)
_OPTION_ALIASES = {"tensor_parallel_size": ("tp",), "pipeline_parallel_size": ("pp",),
                   "data_parallel_size": ("dp",)}


def _stated(value) -> bool:
    return isinstance(value, (str, int, float, bool))


@rule("vllm.config", frameworks=("vllm",),
      reads=(F.VllmVersion, F.VllmEngineConfig, F.VllmArgs, F.VllmMaxModelLen, F.VllmMaxConcurrency, F.VllmStartupError,
             F.VllmModelName, F.LaunchCommand,
             F.Fact),  # every line's worker tags: vLLM names a worker _TP<n> only when TP > 1
      concludes=("config:framework_version", *(f"config:{key}" for key in _FIELDS)))
def config(kb):
    """What it concludes: `config.*`: each serving setting the vLLM log states (version, model,
    max_model_len, TP/PP/DP, KV dtype, quantization, enforce_eager, max_num_seqs, block size, …).

    How: The version from the banner or the engine line; the rest from the engine-config line
    (resolved values: `max_seq_len` is max_model_len), then from `non-default args` / `args:
    Namespace(…)`, `Using max model len`, the `Maximum concurrency for N tokens` line (N is
    max_model_len), the max-seq-len start-up error, a line that names the model (`Starting to load
    model X...`), then a pasted launch command (`vllm serve`, the API-server module, `docker
    run` of a vLLM image): the log's own statement wins over the command. Last, the worker names:
    vLLM names a worker `Worker_PP1_TP3` with a part only for a parallel size above 1
    (`v1/executor/multiproc_executor.py`), so workers tagged by PP stage but never by TP rank say
    TP 1, and the other way round PP 1. A setting left at its default is not in `non-default args`
    and stays unstated.

    Example: `non-default args: {'model': 'Qwen/Qwen2.5-1.5B-Instruct', 'max_model_len': 8192}`."""
    version = kb.first(F.VllmVersion, role=None)
    engine = kb.first(F.VllmEngineConfig, role=None)
    if version is not None:
        yield Derived("config", "framework_version", version.version, "vllm.config", (version,),
                      f"version banner ({line_ref(version)})")
    if engine is not None:
        yield Derived("config", "framework_version", engine.version, "vllm.config", (engine,),
                      f"engine line v{engine.version} ({line_ref(engine)})")
    args = kb.of(F.VllmArgs, role=None)
    for key, (engine_field, arg) in _FIELDS.items():
        if engine is not None and engine_field and _stated(engine.fields.get(engine_field)):
            value = engine.fields[engine_field]
            yield Derived("config", key, value, "vllm.config", (engine,),
                          f"engine config {engine_field}={value} ({line_ref(engine)})")
        for a in args:
            if _stated(a.fields.get(arg)):
                yield Derived("config", key, a.fields[arg], "vllm.config", (a,),
                              f"{a.style} args {arg}={a.fields[arg]!r} ({line_ref(a)})")
    length = kb.first(F.VllmMaxModelLen, role=None)
    if length is not None:
        yield Derived("config", "max_model_len", length.tokens, "vllm.config", (length,),
                      f"`Using max model len` ({line_ref(length)})")
    for stated in kb.of(F.VllmMaxConcurrency, role=None)[:1]:
        yield Derived("config", "max_model_len", stated.tokens, "vllm.config", (stated,),
                      f"`Maximum concurrency for {stated.tokens} tokens per request` names max_model_len "
                      f"({line_ref(stated)})")
    for error in kb.of(F.VllmStartupError, role=None):
        if error.model_len is not None:
            yield Derived("config", "max_model_len", error.model_len, "vllm.config", (error,),
                          f"the start-up error states max seq len {error.model_len} ({line_ref(error)})")
    named = kb.first(F.VllmModelName, role=None)
    if named is not None:
        yield Derived("config", "model", named.name, "vllm.config", (named,),
                      f"model named by the {named.source} ({line_ref(named)})")
    command = kb.first(F.LaunchCommand, role=None)
    if command is not None:  # last: the log's own statements win over the command that started it
        for key, (_, arg) in _FIELDS.items():
            option = command_option(command, arg, _OPTION_ALIASES)
            if option is not None:
                name, value = option
                yield Derived("config", key, number_or_text(value), "vllm.config", (command,),
                              f"launch command {'-' if len(name) <= 2 else '--'}{name.replace('_', '-')} {value}")
    yield from _sizes_from_worker_names(kb)


def _sizes_from_worker_names(kb):
    staged = next((f for f in kb.facts if f.rank.pp is not None), None)
    ranked = next((f for f in kb.facts if f.rank.tp is not None), None)
    for key, tagged, untagged, part in (("tp_size", staged, ranked, "_TP"), ("pp_size", ranked, staged, "_PP")):
        if tagged is not None and untagged is None:
            yield Derived("config", key, 1, "vllm.config", (tagged,),
                          f"the workers' names carry no {part}<n> part ({line_ref(tagged)}: {tagged.rank.label}), "
                          f"which vLLM adds only when the size is above 1")


@rule("vllm.gpu-memory-utilization", frameworks=("vllm",),
      reads=(F.VllmArgs, F.VllmMemoryProfile, F.VllmStartupMemory, F.VllmUtilizationAdvice, F.VllmInitialFree,
             F.LaunchCommand),
      concludes=("config:gpu_memory_utilization",))
def gpu_memory_utilization(kb):
    """What it concludes: `config.gpu_memory_utilization`: vLLM's memory fraction, as the log states
    it.

    How: The arguments, the V0 profiling record, the `Free memory on device` report, the 0.20+
    CUDA-graph advice line, the DEBUG `Requested memory` line, and last a pasted launch command. Not
    stated → unknown: its default changed between releases (0.90 up to 0.19, 0.92 from 0.20), so
    none is assumed.

    Example: `Desired GPU memory utilization is (0.92, 72.91 GiB)`."""
    for a in kb.of(F.VllmArgs, role=None):
        if isinstance(a.fields.get("gpu_memory_utilization"), (int, float)):
            value = a.fields["gpu_memory_utilization"]
            yield Derived("config", "gpu_memory_utilization", value, "vllm.gpu-memory-utilization", (a,),
                          f"{a.style} args gpu_memory_utilization={value} ({line_ref(a)})")
            return
    candidates = [(p, p.values.get("gpu_memory_utilization"), "memory-profiling record")
                  for p in kb.of(F.VllmMemoryProfile, role=None)]
    candidates += [(s, s.utilization, "`Free memory on device` report") for s in kb.of(F.VllmStartupMemory, role=None)]
    candidates += [(u, u.current, "CUDA-graph profiling advice") for u in kb.of(F.VllmUtilizationAdvice, role=None)]
    candidates += [(i, i.utilization, "`Requested memory` line") for i in kb.of(F.VllmInitialFree, role=None)]
    for fact, value, source in candidates:
        if value is not None:
            yield Derived("config", "gpu_memory_utilization", value, "vllm.gpu-memory-utilization", (fact,),
                          f"{source} ({line_ref(fact)})")
            return
    command = kb.first(F.LaunchCommand, role=None)
    value = command.args.get("gpu_memory_utilization") if command is not None else None
    if isinstance(number_or_text(value or ""), float):
        yield Derived("config", "gpu_memory_utilization", number_or_text(value), "vllm.gpu-memory-utilization",
                      (command,), f"launch command --gpu-memory-utilization {value}")
        return
    yield Derived("config", "gpu_memory_utilization",
                  Unknown("the log does not state gpu_memory_utilization (its default differs by release)"),
                  "vllm.gpu-memory-utilization")
