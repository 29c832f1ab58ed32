"""The serving configuration, as the log states it."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import command_option, number_or_text

# report key -> server_args field (SGLang). A field absent or None is not stated.
_SERVER_ARGS = {"model": "model_path", "tp_size": "tp_size", "pp_size": "pp_size", "dp_size": "dp_size",
                "ep_size": "ep_size", "kv_cache_dtype": "kv_cache_dtype", "context_len": "context_length",
                "max_running_requests": "max_running_requests", "page_size": "page_size",
                "quantization": "quantization", "chunked_prefill_size": "chunked_prefill_size",
                "enable_dp_attention": "enable_dp_attention",
                "speculative_algorithm": "speculative_algorithm", "disable_cuda_graph": "disable_cuda_graph"}


# a launch command may spell a server_args field by its alias (`--model`, `--tp`)
_OPTION_ALIASES = {"model_path": ("model",), "tp_size": ("tp", "tensor_parallel_size"), "dp_size": ("dp",),
                   "ep_size": ("ep",), "pp_size": ("pp",), "context_length": ("context_len",)}


def _config(key, value, premise, formula):
    return Derived("config", key, value, "config", (premise,), formula)


@rule("config", frameworks=("sglang",),
      reads=(F.ServerArgs, F.LaunchCommand, F.TokenBudget, F.ModelPathHint, F.KVCacheDtype, F.KVCacheAllocated),
      concludes=(tuple(f"config:{key}" for key in _SERVER_ARGS)))
def config(kb):
    """What it concludes: `config.*`: each serving setting the SGLang log states (model, TP/PP/DP/EP
    sizes, KV dtype, context length, request limit, page size, quantization, …).

    How: From `server_args` first, then a pasted launch command; the effective context length and
    request limit from the `max_total_num_tokens=` line; the KV dtype from `Using KV cache dtype` or
    the KV line; the model path from an HF-snapshot or tokenizer line when no `server_args` line
    survives. Nothing is filled from a default.

    Example: `server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', tp_size=1, …)`."""
    args = kb.first(F.ServerArgs, role=None)
    if args is not None:
        for key, field in _SERVER_ARGS.items():
            value = args.fields.get(field)
            if isinstance(value, (str, int, float, bool)):
                yield _config(key, value, args, f"server_args {field}={value!r}")
    command = kb.first(F.LaunchCommand, role=None)
    if command is not None:
        for key, field in _SERVER_ARGS.items():
            option = command_option(command, field, _OPTION_ALIASES)
            if option is not None:
                name, value = option
                yield _config(key, number_or_text(value), command, f"launch command --{name.replace('_', '-')} {value}")
    budget = kb.first(F.TokenBudget, role=None)
    if budget is not None:
        for key in ("context_len", "max_running_requests"):
            value = getattr(budget, key)
            if value is not None:
                yield _config(key, value, budget, f"effective {key}={value} (max_total_num_tokens line)")
    hint = kb.first(F.ModelPathHint, role=None)
    if hint is not None:
        yield _config("model", hint.path.rstrip(";,"), hint, f"model path named by the {hint.source}")
    for kind in (F.KVCacheDtype, F.KVCacheAllocated):
        stated = [f for f in kb.of(kind, role=None) if getattr(f, "dtype", None)]
        if stated:
            yield _config("kv_cache_dtype", stated[0].dtype, stated[0], f"dtype printed: {stated[0].dtype}")


@rule("mem-fraction", frameworks=("sglang",),
      reads=(F.ServerArgs, F.LaunchCommand, F.MemoryProfiling, F.NotEnoughMemory),
      concludes=("config:mem_fraction_static",))
def mem_fraction(kb):
    """What it concludes: `config.mem_fraction_static`: SGLang's static memory fraction, as the log
    states it.

    How: The value `server_args` states, else the launch command's `--mem-fraction-static`, else the
    one a `Memory profiling:` line prints (two decimals), else the one the `Not enough memory`
    error states (`Current value: mem_fraction_static=0.5`). Not stated → unknown: SGLang chooses it at
    start-up from the GPU's total memory, so no default (0.88 or any other) is assumed.

    Example: `server_args=ServerArgs(…, mem_fraction_static=0.838, …)`."""
    args = kb.first(F.ServerArgs, role=None)
    if args is not None and isinstance(args.fields.get("mem_fraction_static"), (int, float)):
        value = args.fields["mem_fraction_static"]
        yield Derived("config", "mem_fraction_static", value, "mem-fraction", (args,),
                      f"server_args mem_fraction_static={value}")
        return
    command = kb.first(F.LaunchCommand, role=None)
    if command is not None and isinstance(number_or_text(command.args.get("mem_fraction_static") or ""), float):
        value = number_or_text(command.args["mem_fraction_static"])
        yield Derived("config", "mem_fraction_static", value, "mem-fraction", (command,),
                      f"launch command --mem-fraction-static {value}")
        return
    profiling = kb.first(F.MemoryProfiling, role=None)
    if profiling is not None and profiling.mem_fraction_static is not None:
        yield Derived("config", "mem_fraction_static", profiling.mem_fraction_static, "mem-fraction",
                      (profiling,), "printed by `Memory profiling:` (rounded to 2 decimals)")
        return
    refusal = next((f for f in kb.of(F.NotEnoughMemory, role=None) if f.mem_fraction_static is not None), None)
    if refusal is not None:
        yield Derived("config", "mem_fraction_static", refusal.mem_fraction_static, "mem-fraction", (refusal,),
                      "stated by the `Not enough memory` error")
        return
    reason = ("the log does not state mem_fraction_static"
              + (" (its server_args line is cut or elided)" if args is not None else
                 " (no server_args line)"))
    yield Derived("config", "mem_fraction_static", Unknown(reason), "mem-fraction",
                  (args,) if args is not None else ())
