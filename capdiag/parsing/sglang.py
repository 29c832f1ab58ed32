"""SGLang log lines → facts, through grammar/sglang.lark and a Transformer.

The grammar reads a line into its prefix (time, rank tags) and a body of a known kind with
a generic `key=value` field list; this module names the fields each kind carries and builds
the fact. Lines of other kinds fail to parse and are skipped by the caller.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Optional

import attrs
from lark import Lark, Token, Transformer

from capdiag import facts as F
from capdiag.frozen import frozen
from capdiag.parsing.bounds import OutOfRange
from capdiag.parsing.literal import MAX_DIGITS, parse_call_or_dict
from capdiag.parsing.parsed import Parsed, cli_option, kv_scale_fields, parse_to_damage
from capdiag.parsing.prose import capability, read_oom_message
from capdiag.parsing.lalr import lalr_parser
from capdiag.parsing.process_tag import read_tag


@frozen
class Quantity:
    value: float | int
    unit: Optional[str]


def _number(text: str) -> float | int:
    if len(text) > MAX_DIGITS:
        raise OutOfRange(f"a number of {len(text)} digits")
    return float(text) if any(c in text for c in ".eE") else int(text)


def _num(fields: dict, *keys: str) -> Optional[float | int]:
    """The number under the first key present (SGLang's GB are GiB: no conversion)."""
    for key in keys:
        value = fields.get(key)
        if isinstance(value, Quantity):
            return value.value
        if isinstance(value, str) and value in ("None", "none"):
            return None
    return None


def _int(fields: dict, *keys: str) -> Optional[int]:
    value = _num(fields, *keys)
    return int(value) if value is not None else None


def _word(fields: dict, key: str) -> Optional[str]:
    value = fields.get(key)
    return value if isinstance(value, str) else None


def _graph_words(items) -> tuple[str, str, Optional[str]]:
    """(graph, device, stated role) from the words of `Capture [role] [kind] <device> graph …`."""
    words = [str(t) for t in items if isinstance(t, Token) and t.type == "GRAPH_WORD"]
    lowered = [w.lower() for w in words]
    role = "draft" if "draft" in lowered else ("target" if "target" in lowered else None)
    graph = next((w for w in lowered if w in ("decode", "verify", "prefill", "extend", "piecewise")), "decode")
    device = words[-1] if words and lowered[-1] not in ("draft", "target", graph) else "cuda"
    return graph, device, role


# The tag of a scheduler with no data-parallel rank in some late-2024 releases (`DP-1 TP0`): it
# names no rank, as no DP tag at all does.
NO_DP_RANK = "DP-1"


class _Lines(Transformer):
    # ---- prefix
    def rank_tag(self, items):
        tag = str(items[0])
        if tag == NO_DP_RANK:
            return None
        name = tag.rstrip("0123456789")
        return (name.lower(), int(tag[len(name):]))

    def prefix(self, items):
        """(the rank its tags name, the pid and the label its Ray tag names)."""
        ray = next((read_tag(str(i)) for i in items if isinstance(i, Token) and i.type == "RAY_TAG"), None)
        return (F.Rank(**{k: v for k, v in (i for i in items if isinstance(i, tuple))}),
                ray.pid if ray else None, ray.label if ray else None)

    def gpu_tag(self, items):
        return F.Rank(tp=int(items[-1]))

    # ---- generic fields
    def quantity(self, items):
        return Quantity(_number(str(items[0])), str(items[1]) if len(items) > 1 else None)

    def word(self, items):
        return str(items[0])

    def list_value(self, items):
        return [i for i in items if i is not None and not isinstance(i, Token)]

    def elided(self, _):
        return ("...", True)

    def key(self, items):
        return " ".join(str(t) for t in items).lower()

    def field(self, items):
        return (items[0], items[2])

    def fields(self, items):
        out: dict[str, Any] = {}
        for item in items:
            if isinstance(item, tuple):
                out.setdefault(item[0], item[1])
        return out

    # ---- bodies: (fact class, attribute values) or None when a required field is absent
    def server_args(self, items):
        try:
            parsed = parse_call_or_dict(str(items[1]))
        except ValueError:
            return (F.ServerArgs, {"fields": {}, "style": "unparsed", "truncated_at": 0})
        return (F.ServerArgs, {"fields": parsed.fields, "style": parsed.style,
                               "truncated_at": parsed.truncated_at, "elided": parsed.elided})

    def dist_begin(self, _):
        return (F.TorchDistributedBegin, {})

    def dist_end(self, items):
        f = items[-1]
        return (F.TorchDistributedEnd, {"mem_usage_gib": _num(f, "mem usage"), "elapsed_s": _num(f, "elapsed")})

    def load_begin(self, items):
        avail = _num(items[-1], "avail mem")
        return None if avail is None else (F.LoadWeightBegin, {"avail_gib": avail})

    def load_end(self, items):
        f = items[-1]
        return (F.LoadWeightEnd, {"avail_gib": _num(f, "avail mem"), "mem_usage_gib": _num(f, "mem usage"),
                                  "model_class": _word(f, "type"), "dtype": _word(f, "dtype"),
                                  "quant": _word(f, "quant"), "elapsed_s": _num(f, "elapsed")})

    def load_committed(self, _):
        return (F.WeightsCommitted, {})

    def kv_alloc(self, items):
        head, f = {t.type: str(t) for t in items[:-1]}, items[-1]
        return (F.KVCacheAllocated, {"label": head.get("KV_LABEL"), "dtype": _word(f, "dtype"),
                                     "tokens": _int(f, "#tokens"), "k_gib": _num(f, "k size"),
                                     "v_gib": _num(f, "v size"), "kv_gib": _num(f, "kv size"),
                                     "va_upper_bound": "KV_VA_BOUND" in head})

    def swa_pool(self, items):
        f = items[-1]
        return (F.SWAKVPoolUsage, {"gib": _num(f, "mem usage", "va upper bound"), "swa_size": _int(f, "swa size"),
                                   "full_size": _int(f, "full size"), "va_upper_bound": "va upper bound" in f})

    def mamba_alloc(self, items):
        f = items[-1]
        return (F.MambaCacheAllocated, {
            "max_cache_size": _int(f, "max_mamba_cache_size"), "conv_gib": _num(f, "conv_state size"),
            "ssm_gib": _num(f, "ssm_state size"),
            "intermediate_ssm_gib": _num(f, "intermediate_ssm_state_cache size"),
            "intermediate_conv_gib": _num(f, "intermediate_conv_window_cache size")})

    def pool_end(self, items):
        avail = _num(items[-1], "avail mem")
        return None if avail is None else (F.MemoryPoolEnd, {"avail_gib": avail})

    def graph_begin(self, items):
        graph, device, role = _graph_words(items)
        f = items[-1] if isinstance(items[-1], dict) else {}
        return (F.GraphCaptureBegin, {"graph": graph, "device": device, "avail_gib": _num(f, "avail mem"),
                                      "_role": role})

    def graph_end(self, items):
        graph, device, role = _graph_words(items)
        f = items[-1] if isinstance(items[-1], dict) else {}
        return (F.GraphCaptureEnd, {"graph": graph, "device": device,
                                    "elapsed_s": _num(f, "time elapsed", "elapsed"),
                                    "mem_usage_gib": _num(f, "mem usage"), "avail_gib": _num(f, "avail mem"),
                                    "_role": role})

    def token_budget(self, items):
        total = items[2]
        f = items[-1] if isinstance(items[-1], dict) else {}
        return (F.TokenBudget, {
            "max_total_num_tokens": int(total.value), "chunked_prefill_size": _int(f, "chunked_prefill_size"),
            "max_prefill_tokens": _int(f, "max_prefill_tokens"),
            "max_running_requests": _int(f, "max_running_requests"), "context_len": _int(f, "context_len"),
            "available_gpu_mem_gib": _num(f, "available_gpu_mem"),
            "available_cpu_mem_gib": _num(f, "available_cpu_mem")})

    def mem_profiling(self, items):
        f = items[-1]
        return (F.MemoryProfiling, {
            "available_gpu_memory_gib": _num(f, "available_gpu_memory"),
            "total_gpu_memory_gib": _num(f, "total_gpu_memory"),
            "mem_fraction_static": _num(f, "mem_fraction_static"), "rest_memory_gib": _num(f, "rest_memory")})

    def dsv4_calc(self, items):
        f = items[-1]
        fixed = {k: v.value for k, v in f.items() if k.endswith("_fixed") and isinstance(v, Quantity)}
        return (F.DSV4MemoryCalculation, {
            "bytes_per_full_token": _num(f, "bytes_per_full_token"),
            "available_bytes_gib": _num(f, "available_bytes"), "full_token": _int(f, "full_token"),
            "fixed_gib": fixed})

    def dsv4_pool_sizes(self, items):
        f = items[-1]
        return (F.DSV4PoolSizes, {key: _int(f, key) for key in ("full", "swa", "c4", "c128")})

    def post_capture_kv(self, items):
        f = items[-1]
        return (F.PostCaptureKVSizing, {"dtype": _word(f, "dtype"), "tokens": _int(f, "#tokens"),
                                        "kv_gib": _num(f, "kv size"), "avail_gib": _num(f, "avail mem")})

    def post_capture(self, _):
        return None

    def kv_available(self, items):
        return (F.KVAvailableMemory, {"gib": items[0].value})

    def kv_dtype(self, items):
        return (F.KVCacheDtype, {"dtype": str(items[-1])})

    def swa_split(self, items):
        f = items[-1]
        return (F.SlidingWindowSplit, {"full_layer_tokens": _int(f, "full_layer_tokens"),
                                       "swa_layer_tokens": _int(f, "swa_layer_tokens")})

    def oom_piece(self, items):
        return items[0]

    def oom(self, items):
        return (F.OutOfMemory, read_oom_message([t for t in items[1:] if isinstance(t, Token)]))

    def solutions_head(self, _):
        return (F.FrameworkSolution, {})

    def solution(self, items):
        return (F.FrameworkSolution, {"text": str(items[0]).split(". ", 1)[1].strip()})

    def not_enough(self, items):
        stated = next((items[i + 1] for i, t in enumerate(items[:-1]) if getattr(t, "type", None) == "CURRENT_FRACTION"),
                      None)
        return (F.NotEnoughMemory, {"mem_fraction_static": float(stated) if stated is not None else None})

    def no_kv_room(self, _):
        return (F.NotEnoughMemory, {})

    def ready(self, _):
        return (F.ServerReady, {})

    def scheduler_exception(self, _):
        return (F.SchedulerException, {})

    def hf_snapshot(self, items):
        return (F.ModelPathHint, {"path": str(items[0]), "source": "HF snapshot line"})

    def tokenizer_for(self, items):
        return (F.ModelPathHint, {"path": str(items[0]), "source": "tokenizer line"})

    def deepgemm_memory(self, items):
        f = items[-1] if isinstance(items[-1], dict) else {}
        return (F.DeepGEMMActivity, {"required_gib": items[1].value, "available_gib": _num(f, "available memory")})

    def deepgemm_activity(self, _):
        return (F.DeepGEMMActivity, {})

    def moe_config(self, items):
        return (F.DeviceName, {"name": str(items[1])})

    def compute_capability(self, items):
        return (F.ComputeCapability, capability(str(items[1])))

    def kv_scale_default(self, items):
        return (F.KVScaleDefault, kv_scale_fields(items))

    def kernel_cache(self, _):
        return (F.KernelCacheNote, {})

    def device_capacity(self, items):
        totals = [int(t) for t in items if isinstance(t, Token) and t.type == "INT"]
        return (F.DeviceCapacity, {"per_device_mib": tuple(totals[:-1]), "total_mib": totals[-1]})

    def cli_arg(self, items):
        return cli_option(items)

    def launch_command(self, items):
        program = str(items[0]).split()[-1]
        return (F.LaunchCommand, {"program": program, "args": dict(i for i in items[1:] if isinstance(i, tuple))})

    def start(self, items):
        body = items[-1]
        if body is None:
            return None
        rank, pid, host = F.NO_RANK, None, None
        for item in items[:-1]:
            if isinstance(item, tuple):  # the prefix
                item, pid, host = item
            if isinstance(item, F.Rank):
                rank = attrs.evolve(rank, **{k: v for k, v in attrs.asdict(item).items() if v is not None})
        return Parsed(rank, body[0], body[1], pid=pid, host=host)


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return lalr_parser("sglang.lark", lexer="contextual")


# The common prefix `[date time TAGS] `. Lines that differ only in it (one line per rank, the
# same start-up relaunched) share one parse of their body. The pattern is assembled from the
# grammar's own terminals, so it cannot read a prefix differently from the grammar; a prefix it
# does not take (a Ray tag, no spaces between tags) goes to the full parse.
@lru_cache(maxsize=1)
def _prefix() -> "re.Pattern[str]":
    term = {name: _parser().get_terminal(name).pattern.to_regexp() for name in ("DATE", "TIME", "RANK_TAG")}
    return re.compile(rf"\[\s*(?:{term['DATE']}\s+)?{term['TIME']}((?:\s+{term['RANK_TAG']})*)\s*\]\s*")


_TAGS = re.compile(r"([A-Z_]+?)(\d+)")
_TAG_DIGITS = 7  # a longer rank number goes to the full parse, which bounds it
_STAND_IN = "[00:00:00] "  # the prefix a shared body is parsed behind
SHARED_BODY = 1 << 16  # characters (the source's MAX_JOINED): 256 kept bodies stay under 16 MiB


def _parse(text: str) -> Optional[Parsed]:
    read = parse_to_damage(_parser().parse, text)
    if read is None:
        return None
    parsed = _Lines().transform(read[0])
    return attrs.evolve(parsed, read_to=read[1]) if parsed is not None and read[1] is not None else parsed


@lru_cache(maxsize=256)
def _parse_body(body: str) -> Optional[Parsed]:
    return _parse(_STAND_IN + body)


def parse_sglang_line(text: str) -> Optional[Parsed]:
    """The fact a line states, or None when it is not a line kind the grammar knows."""
    prefix = _prefix().match(text)
    if prefix is None or len(text) - prefix.end() > SHARED_BODY:
        return _parse(text)
    found = _TAGS.findall(prefix.group(1))
    if any(len(number) > _TAG_DIGITS for _, number in found):
        return _parse(text)
    parsed = _parse_body(text[prefix.end():])
    if parsed is None:
        return None
    tags = {name.lower(): int(number) for name, number in found}
    # the body's own `[gpu=N]` tag is read after the prefix's, as the grammar's start rule does
    own = {k: v for k, v in attrs.asdict(parsed.rank).items() if v is not None}
    read_to = None if parsed.read_to is None else parsed.read_to - len(_STAND_IN) + prefix.end()
    return attrs.evolve(parsed, rank=F.Rank(**{**tags, **own}), read_to=read_to) if tags or read_to else parsed
