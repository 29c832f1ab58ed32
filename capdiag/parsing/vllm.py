"""vLLM log lines → facts, through grammar/vllm.lark and a Transformer."""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Optional

import attrs
from lark import Lark, Token, Transformer
from lark.exceptions import LarkError

from capdiag import facts as F
from capdiag.parsing.literal import parse_call_or_dict, parse_literal
from capdiag.parsing.prose import (capability, convert, name_numbers, named_quantities, numbers_after, read_oom_message,
                                   split_quantity)
from capdiag.parsing.parsed import Parsed, cli_option, kv_scale_fields, parse_to_damage
from capdiag.parsing.lalr import lalr_parser
from capdiag.parsing.process_tag import read_tag
from capdiag.source import open_brackets


def _q(item) -> Optional[float]:
    return item[0] if isinstance(item, tuple) else None


# `Actual usage is X GiB for weight, Y GiB for peak activation, …` (0.27+: consumed memory)
_USAGE_AFTER = (("for weight", "weights_gib"), ("for consumed memory", "consumed_gib"),
                ("for peak activation", "activation_gib"), ("for non-torch", "non_torch_gib"),
                ("for cudagraph", "cudagraph_gib"))
_USAGE_UNITS = {k: "GiB" for _, k in _USAGE_AFTER}
# `… Current kv cache memory in use is N bytes.` (0.11: bytes; later: GiB)
_IN_USE_BEFORE = (("in use is", "kv_in_use"),)
# `The current --gpu-memory-utilization=U is equivalent to --gpu-memory-utilization=E … increase
# --gpu-memory-utilization to S` (or, disabled, `… from U to S`): the figures quoted, in order
_UTILIZATION_QUOTED_AFTER = ("--gpu-memory-utilization=", "--gpu-memory-utilization to", "from")
# the engine generation `Initializing a V1 LLM engine` names (none before 0.8)
_ENGINES = {"V0": "V0", "V1": "V1"}
# `Auto set (K/N) GiB …` or `Explicitly set (K/N) GiB …` (VLLM_CPU_KVCACHE_SPACE)
_CPU_KV_MODES = {"CPU_KV_AUTO": "auto", "CPU_KV_EXPLICIT": "explicit"}
_CPU_KV_AFTER = (("gib requested", "requested_gib"), ("requested memory", "requested_gib"),
                 ("gib memory was consumed", "non_kv_gib"), ("memory was consumed", "non_kv_gib"))
# `rank R in world size W is assigned as DP rank d, PP rank p, [PCP rank c, ]TP rank t[, EP rank e|N/A]`
_ASSIGNED_BEFORE = (("in world size", "world_size"), ("dp rank", "dp"), ("pp rank", "pp"), ("tp rank", "tp"),
                    ("ep rank", "ep"))


class _Lines(Transformer):
    def header(self, items):
        tags = [str(t) for t in items if isinstance(t, Token) and t.type == "PROC_TAG"]
        # Ray nests: the innermost tag is the worker, the outermost the server hosting it
        return (read_tag(tags[-1]), read_tag(tags[0]).label) if tags else None

    def level_part(self, _):
        return None

    def quantity(self, items):
        return (float(items[0]), str(items[1]) if len(items) > 1 else None)

    def field(self, items):
        return (str(items[0].children[0]) if hasattr(items[0], "children") else str(items[0]), items[2])

    def key(self, items):
        return str(items[0])

    def fields(self, items):
        return {k: v for k, v in (i for i in items if isinstance(i, tuple))}

    def prose(self, items):
        return list(items)

    # ---- configuration
    def version(self, items):
        return (F.VllmVersion, {"version": str(items[1]).lstrip("v")})

    def engine_config(self, items):
        version = next(str(i) for i in items if isinstance(i, Token) and i.type == "VERSION").lstrip("v")
        engine = next((_ENGINES[str(i)] for i in items if isinstance(i, Token) and i.type == "ENGINE_GENERATION"), None)
        rest = str(items[-1])
        rest = rest.rstrip(", ")
        if open_brackets(rest) < 0 and rest.endswith(")"):  # ≤0.6.4 closes the config with a stray ")"
            rest = rest[:-1]
        try:
            parsed = parse_call_or_dict(f"VllmConfig({rest})")
            fields, cut = parsed.fields, parsed.truncated_at
        except ValueError:
            fields, cut = {}, 0
        return (F.VllmEngineConfig, {"version": version, "engine": engine, "fields": fields, "truncated_at": cut})

    def non_default_args(self, items):
        return self._args(str(items[-1]), "non-default")

    def args_namespace(self, items):
        return self._args(str(items[-1]), "namespace")  # `args: Namespace(…)`, or a bench script's own

    @staticmethod
    def _args(text: str, style: str):
        try:
            parsed = parse_call_or_dict(text)
        except ValueError:
            return None
        return (F.VllmArgs, {"fields": parsed.fields, "style": style, "truncated_at": parsed.truncated_at})

    def max_model_len(self, items):
        return (F.VllmMaxModelLen, {"tokens": int(items[-1])})

    # ---- memory
    def model_loading(self, items):
        qty = next(i for i in items if isinstance(i, tuple))
        numbers = [i for i in items if isinstance(i, Token) and i.type == "NUMBER"]
        return (F.VllmModelLoading, {"gib": qty[0], "unit": qty[1],
                                     "seconds": float(numbers[0]) if numbers else None})

    def profiling_takes(self, items):
        return (F.VllmMemoryProfile, {"values": {"seconds": float(items[0])}, "form": "three-line"})

    def instance_can_use(self, items):
        total, util, usable = items[1], items[2], items[3]
        return (F.VllmMemoryProfile, {"values": {"total_gpu_memory_gib": total[0], "gpu_memory_utilization": float(util),
                                                 "usable_gib": usable[0]}, "form": "three-line"})

    def weights_take(self, items):
        q = [i for i in items if isinstance(i, tuple)]
        names = ("weights_gib", "non_torch_gib", "activation_peak_gib", "kv_cache_gib")
        return (F.VllmMemoryProfile, {"values": {n: v[0] for n, v in zip(names, q)},
                                      "form": "three-line" if len(q) > 1 else "table"})

    _RESULT_KEYS = {"total_gpu_memory": "total_gpu_memory_gib", "kv_cache_size": "kv_cache_gib",
                    "non_torch_memory": "non_torch_gib", "gpu_memory_utilization": "gpu_memory_utilization",
                    "peak_torch_memory": "peak_torch_gib", "initial_memory_usage": "initial_memory_usage_gib",
                    "memory_usage_post_profile": "post_profile_gib"}
    _ROW_KEYS = {"total_gpu_memory": "total_gpu_memory_gib", "gpu_memory_utilization": "gpu_memory_utilization",
                 "the current vLLM instance can use": "usable_gib", "non_torch_memory": "non_torch_gib",
                 "PyTorch activation peak memory": "activation_peak_gib",
                 "available_kv_cache_memory": "kv_cache_gib"}

    def profiling_results(self, items):
        f = items[-1] if items and isinstance(items[-1], dict) else {}
        values = {self._RESULT_KEYS[k]: v[0] for k, v in f.items() if k in self._RESULT_KEYS}
        return (F.VllmMemoryProfile, {"values": values, "form": "one-line" if values else "table"}) if values else None

    def profile_row(self, items):
        return (F.VllmMemoryProfile, {"values": {self._ROW_KEYS[str(items[0])]: items[1][0]}, "form": "table"})

    def available_kv(self, items):
        return (F.VllmAvailableKV, {"gib": items[-1][0]})

    def kv_cache_size(self, items):
        head, counts = str(items[0]), [i for i in items if isinstance(i, Token) and i.type == "COUNT"]
        size = (F.VllmKVCacheSize, {"tokens": int(str(counts[0]).replace(",", "")),
                                    "device": head.split(" KV cache size")[0]})
        if len(counts) == 2:  # 0.28+: both statements on one line
            x = next(i for i in items if isinstance(i, Token) and i.type == "CONCURRENCY")
            return [size, (F.VllmMaxConcurrency, {"tokens": int(str(counts[1]).replace(",", "")),
                                                  "x": float(str(x)[:-1])})]
        return size

    def max_concurrency(self, items):
        return (F.VllmMaxConcurrency, {"tokens": int(str(items[1]).replace(",", "")), "x": float(str(items[-1])[:-1])})

    def gpu_blocks(self, items):
        ints = [int(i) for i in items if isinstance(i, Token) and i.type == "INT"]
        return (F.VllmGpuBlocks, {"blocks": ints[0], "cpu_blocks": ints[1] if len(ints) > 1 else None,
                                  "wording": str(items[0]).rstrip(":")})

    def num_gpu_blocks(self, items):
        return (F.VllmGpuBlocks, {"blocks": int(items[-1]), "wording": "num_gpu_blocks is"})

    def graph_captured(self, items):
        qty = next((i for i in items if isinstance(i, tuple)), None)
        return (F.VllmGraphCapture, {"seconds": float(items[0]), "gib": qty[0] if qty else None})

    def graph_pool(self, items):
        q = [i for i in items if isinstance(i, tuple)]
        pct = next((i for i in items if isinstance(i, Token) and i.type == "PERCENT"), None)
        return (F.VllmGraphPool, {"actual_gib": q[0][0], "estimated_gib": q[1][0], "difference_gib": q[2][0],
                                  "percent": float(str(pct)[:-1]) if pct else None})

    def graph_estimate(self, items):
        return (F.VllmGraphEstimate, {"gib": items[0][0]})

    def util_advice(self, items):
        """The utilizations this line quotes, each right after `--gpu-memory-utilization=` (or `to`):
        the current one, its equivalent without graph profiling, the suggested one."""
        quoted = numbers_after(items[-1], "PNUM", _UTILIZATION_QUOTED_AFTER)
        if not quoted:
            return None
        return (F.VllmUtilizationAdvice, {"current": quoted[0], "equivalent": quoted[1] if len(quoted) > 1 else None,
                                          "suggested": quoted[2] if len(quoted) > 2 else None})

    def free_on_device(self, items):
        """Free and total are read from their own fields; the utilization and its GiB are the
        first two numbers of the sentence after them (both wordings), the usage items that
        follow (success report) are named by the words after each figure."""
        device = next((str(i) for i in items if isinstance(i, Token) and i.type == "DEVICE_ID"), None)
        free, total = (float(i) for i in items if isinstance(i, Token) and i.type == "NUMBER")
        tokens = items[-1]
        numbers = [t for t in tokens if t.type == "PNUM"]
        values: dict[str, Any] = {"free_gib": free, "total_gib": total, "device": device}
        values.update(zip(("utilization", "requested_gib"), (split_quantity(str(t))[0] for t in numbers[:2])))
        rest = tokens[tokens.index(numbers[1]) + 1:] if len(numbers) > 2 else []
        values.update(name_numbers(rest, "PNUM", (), _USAGE_AFTER, _USAGE_UNITS))
        in_use = named_quantities(rest, "PNUM", _IN_USE_BEFORE, ()).get("kv_in_use")
        if in_use is not None:
            number, unit = in_use
            values["kv_in_use_gib"] = round(number / (1 << 30), 2) if unit == "bytes" else number
        # `… on startup is less than desired GPU memory utilization …`: the start-up stops there
        values["error"] = any(isinstance(i, Token) and i.type == "FREE_TOO_LITTLE" for i in items)
        return (F.VllmStartupMemory, values)

    def initial_free(self, items):
        tokens = items[-1]
        values = name_numbers(tokens, "PNUM", (("reserved", "reserved_kv_gib"),),
                              (("gib; requested", "free_gib"), ("gib, reserved", "free_gib"), ("gib, free", "free_gib"),
                               ("(util", "utilization"), ("gib memory for kv", "reserved_kv_gib"),
                               ("memory for kv", "reserved_kv_gib")),
                              {"free_gib": "GiB", "reserved_kv_gib": "GiB", "utilization": ""})
        numbers = [t for t in tokens if t.type == "PNUM"]
        if numbers and "free_gib" not in values:
            values["free_gib"] = split_quantity(str(numbers[0]))[0]
        if "utilization" in values and len(numbers) >= 3:
            values["requested_gib"] = split_quantity(str(numbers[2]))[0]
        return (F.VllmInitialFree, values) if values else None

    def no_cache_memory(self, _):
        return (F.VllmStartupError, {"reason": "no-cache-memory"})

    def seq_len_exceeds(self, items):
        """V0: `max seq len (N) is larger than … stored in KV cache (M)`: M is the pool's tokens.
        V1: `… max seq len (N), (X GiB KV cache is needed, … available KV cache memory (Y GiB). …
        the estimated maximum model length is M.`: M is the longest one request the memory
        allows, the pool's tokens only when every layer is full attention (a sliding-window or
        mamba layer holds less than a token's KV for each), so it is not read as them."""
        numbers = [t for t in items[-1] if t.type == "PNUM"]
        plain = [int(float(str(t))) for t in numbers if split_quantity(str(t))[1] is None]
        stored = numbers_after(items[-1], "PNUM", ("stored in KV cache (",))
        longest = numbers_after(items[-1], "PNUM", ("estimated maximum model length is",))
        # the two sizes in GiB, in the order printed: needed, then available
        sizes = [split_quantity(str(t))[0] for t in numbers if split_quantity(str(t))[1] == "GiB"]
        return (F.VllmStartupError, {"reason": "max-seq-len", "model_len": plain[0] if plain else None,
                                     "kv_tokens": int(stored[0]) if stored else None,
                                     "longest_fit": int(longest[0]) if longest else None,
                                     **({"needed_gib": sizes[0], "available_gib": sizes[1]} if len(sizes) == 2 else {})})

    def engine_failed(self, _):
        return (F.VllmStartupError, {"reason": "engine-failed"})

    def argument_error(self, _):
        return (F.VllmStartupError, {"reason": "arguments"})

    def oom_piece(self, items):
        return items[0]

    def oom(self, items):
        return (F.OutOfMemory, read_oom_message(t for t in items[1:] if isinstance(t, Token)))

    def engine_ready(self, _):
        return (F.VllmEngineReady, {})

    def app_ready(self, _):
        return (F.ServerReady, {})

    def moe_config(self, items):
        return (F.DeviceName, {"name": str(items[1])})

    def compute_capability(self, items):
        return (F.ComputeCapability, capability(str(items[1])))

    def kv_scale_default(self, items):
        return (F.KVScaleDefault, kv_scale_fields(items))

    def hybrid_block_size(self, items):
        return (F.VllmHybridBlockSize, {"block_size": int(items[0])})

    def cli_arg(self, items):
        return cli_option(items)

    def cpu_kv_space(self, items):
        """`(K/N) GiB for KV cache on node I`, then (auto) `with R GiB requested …`, `U GiB … non-kv`."""
        tokens = items[-1]
        numbers = [split_quantity(str(t))[0] for t in tokens if t.type == "PNUM"]
        node = name_numbers(tokens, "PNUM", (("for kv cache on node", "node"),), (), {}).get("node")
        if len(numbers) < 3 or node is None:
            return None
        values = {"kv_gib": numbers[0], "node_total_gib": numbers[1], "node": int(node),
                  "mode": _CPU_KV_MODES[items[0].type]}
        values.update(name_numbers(tokens, "PNUM", (), _CPU_KV_AFTER, {"requested_gib": "GiB", "non_kv_gib": "GiB"}))
        return (F.VllmCpuKVSpace, values)

    def rank_assignment(self, items):
        tokens = items[-1]
        numbers = [t for t in tokens if t.type == "PNUM"]
        named = name_numbers(tokens, "PNUM", _ASSIGNED_BEFORE, (), {})
        return (F.VllmRankAssignment, {"global_rank": int(str(numbers[0])), **{k: int(v) for k, v in named.items()}})

    # ---- other backends: each names its figures in its own words, mapped onto the profiling record
    _XPU_BEFORE = (("total gpu memory:", "total_gpu_memory_gib"), ("model load takes", "weights_gib"),
                   ("peak memory usage is", "peak_gib"), ("non-torch mem is", "non_torch_gib"),
                   ("torch mem is", "torch_gib"), ("free gpu memory is", "free_gib"))

    def xpu_profile(self, items):
        """`Before memory profiling run, total GPU memory: T MB, model load takes W MB, free gpu
        memory is F MB.` and `After memory profiling run, peak memory usage is P MB,torch mem is
        … MB, non-torch mem is N MB, …` (XPU, 0.9-0.11; MB are bytes / 2^20: MiB)."""
        after = items[0].type == "XPU_AFTER_PROFILE"
        values = name_numbers(items[-1], "PNUM", self._XPU_BEFORE, (), {k: "GiB" for _, k in self._XPU_BEFORE})
        values = {(f"{k[:-4]}_after_profile_gib" if k == "free_gib" and after else k): v for k, v in values.items()}
        return (F.VllmMemoryProfile, {"values": values, "form": "xpu"}) if values else None

    def hpu_took(self, items):
        """HPU's memory-profiler summary: `Loading model weights took in total X GiB of device
        memory (U GiB/T GiB used) and … of host memory (…)` and the same for the profiling run and
        the cache engine; T is the device's total (binary units, 4 significant digits)."""
        tokens = items[-1]
        values = name_numbers(tokens, "PNUM", (), (("of device memory", "device_gib"), ("used", "total_gpu_memory_gib")),
                              {"device_gib": "GiB", "total_gpu_memory_gib": "GiB"})
        out = []
        if items[0].type == "HPU_WEIGHTS_TOOK" and "device_gib" in values:
            out.append((F.VllmModelLoading, {"gib": values["device_gib"], "unit": "GiB"}))
        if "total_gpu_memory_gib" in values:
            out.append((F.VllmMemoryProfile, {"values": {"total_gpu_memory_gib": values["total_gpu_memory_gib"]},
                                              "form": "hpu"}))
        return out or None

    _HPU_AFTER = (("usable", "usable_gib"), ("reserved for hpugraphs", "graph_reserved_gib"),
                  ("reserved for kv cache dummy", "kv_dummy_block_gib"), ("reserved for usable kv cache", "kv_cache_gib"),
                  ("reserved for kv cache", "kv_cache_gib"))

    def hpu_free(self, items):
        """`Free device memory: F GiB, U GiB usable (gpu_memory_utilization=u), G GiB reserved for
        HPUGraphs (VLLM_GRAPH_RESERVED_MEM=g), K GiB reserved for KV cache` (later: `… reserved for
        KV cache dummy block K GiB reserved for usable KV cache`). HPU applies the utilization to
        the memory free after profiling, not to the total: U = F × u."""
        tokens = items[-1]
        units = {k: "GiB" for _, k in self._HPU_AFTER}
        values = name_numbers(tokens, "PNUM", (("gpu_memory_utilization", "gpu_memory_utilization"),),
                              self._HPU_AFTER, {**units, "gpu_memory_utilization": ""})
        numbers = [t for t in tokens if t.type == "PNUM"]
        if numbers:
            number, unit = split_quantity(str(numbers[0]))
            values["free_after_profile_gib"] = convert(number, unit, "GiB")
        values.pop("kv_dummy_block_gib", None)
        return (F.VllmMemoryProfile, {"values": values, "form": "hpu"}) if len(values) > 1 else None

    _TPU_BEFORE = (("total_hbm_limit_cap_gb", "usable_gib"), ("total_hbm_limit_gb", "total_gpu_memory_gib"),
                   ("total_hbm_used_gb", "used_gib"), ("total_hbm_avail_gb", "kv_cache_gib"))

    def tpu_memory(self, items):
        """`Memory statistics | total_hbm_limit_gb=L GiB | total_hbm_limit_cap_gb=C GiB |
        total_hbm_used_gb=U GiB | total_hbm_avail_gb=A GiB` (tpu-inference: bytes / 2^30, summed
        over the worker's chips; C = L × utilization, A = C − U is what the KV cache gets)."""
        values = name_numbers(items[-1], "PNUM", self._TPU_BEFORE, (), {k: "GiB" for _, k in self._TPU_BEFORE})
        return (F.VllmMemoryProfile, {"values": values, "form": "tpu"}) if values else None

    def model_name(self, items):
        return (F.VllmModelName, {"name": str(items[1]), "source": f"`{items[0]}` line"})

    def launch_command(self, items):
        words = [str(i) for i in items[1:] if isinstance(i, Token)]
        args = dict(i for i in items[1:] if isinstance(i, tuple))
        if words and "model" not in args:
            args["model"] = words[0]  # `vllm serve MODEL`
        return (F.LaunchCommand, {"program": str(items[0]).split()[-1], "args": args})

    def argv_command(self, items):
        """`['vllm', 'serve', MODEL, '--max_num_seqs', '8', …]`: the list read as a Python
        literal (never evaluated), then as a command line; a list with no option is no command."""
        text = str(items[0])
        try:
            argv = parse_literal(text[text.index("["):])
        except (LarkError, ValueError):
            return None
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            return None
        return argv_launch(argv)

    def start(self, items):
        body = items[-1]
        if body is None:
            return None
        tag, host = items[0] if len(items) > 1 and isinstance(items[0], tuple) else (None, None)
        rank, pid = (tag.rank, tag.pid) if tag is not None else (F.NO_RANK, None)
        bodies = body if isinstance(body, list) else [body]
        return [Parsed(rank, cls, values, pid=pid, host=host) for cls, values in bodies]


def argv_launch(argv: list[str]):
    """A launch command's facts from its argument vector: the program (`vllm serve`, the module
    after `-m`, else the first element), the model a `serve` names, and each `--opt value` /
    `--opt=value`; None when it holds no option."""
    if not any(a.startswith("--") for a in argv):
        return None
    program, args, rest = argv[0] if argv and not argv[0].startswith("-") else "argv", {}, list(argv)
    if "-m" in rest[:-1]:
        program = rest[rest.index("-m") + 1]
    elif "serve" in rest:
        at = rest.index("serve")
        program = " ".join(rest[max(0, at - 1):at + 1])
        if at + 1 < len(rest) and not rest[at + 1].startswith("-"):
            args["model"] = rest[at + 1]
    for at, word in enumerate(rest):
        if word.startswith("--") and len(word) > 2:
            following = rest[at + 1] if at + 1 < len(rest) else None
            value = following if following is not None and (not following.startswith("-") or _NUMBER.match(following)) \
                else None
            name, _, inline = word[2:].partition("=")
            args[name.replace("-", "_")] = inline or value
    return (F.LaunchCommand, {"program": program, "args": args})


_NUMBER = re.compile(r"-\d")


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return lalr_parser("vllm.lark", lexer="contextual")


def parse_vllm_line(text: str) -> list[Parsed]:
    """The facts a line states (0.28+ prints two on one line), or [] when it states none."""
    read = parse_to_damage(_parser().parse, text)
    if read is None:
        return []
    return [attrs.evolve(p, read_to=read[1]) for p in _Lines().transform(read[0]) or []]
