"""capdiag.parsing.literal: `ServerArgs(...)` / `{...}` read without evaluation."""
from __future__ import annotations

import builtins
import dataclasses
import math
import os
import re
from pathlib import Path
from typing import Any, Optional

import pytest

from capdiag.parsing.literal import Call, Elided, parse_call_or_dict, parse_literal
from helpers import SGLANG_CORPUS, jsonable, needs_shared


# ---- a dataclass printed the way SGLang prints ServerArgs ---------------------------------------

@dataclasses.dataclass
class PhaseConfig:
    backend: str = "full"
    max_bs: int = 256
    bs: list = dataclasses.field(default_factory=lambda: [1, 2, 4, 8])
    tc_compiler: Optional[str] = "eager"


@dataclasses.dataclass
class CudaGraphConfig:
    decode: PhaseConfig = dataclasses.field(default_factory=PhaseConfig)
    prefill: Optional[PhaseConfig] = dataclasses.field(
        default_factory=lambda: PhaseConfig(backend="breakable", max_bs=8192, bs=[4, 8, 8192]))


@dataclasses.dataclass
class ServerArgs:
    model_path: str = "meta-llama/Llama-3.1-8B-Instruct"
    tokenizer_mode: str = "auto"
    model_loader_extra_config: str = "{}"
    json_model_override_args: str = '{"rope_scaling": {"type": "yarn", "factor": 4.0}}'
    chat_template: Optional[str] = None
    context_length: Optional[int] = None
    mem_fraction_static: float = 0.874
    max_running_requests: Optional[int] = None
    max_queued_requests: int = 9223372036854775807
    chunked_prefill_size: int = -1
    schedule_conservativeness: float = 1.0
    tp_size: int = 8
    disable_cuda_graph: bool = False
    enable_dp_attention: bool = True
    cuda_graph_bs: Optional[list] = None
    lora_paths: list = dataclasses.field(default_factory=list)
    ignore_eos_ids: tuple = (1, 2)
    single: tuple = (7,)
    empty_tuple: tuple = ()
    extra: dict = dataclasses.field(default_factory=lambda: {"a": 1, "b": [True, None], "c": {"d": 0.5}})
    watchdog_timeout: float = float("inf")
    ratio: float = 1e-05
    big: float = 1.5e20
    cuda_graph_config: CudaGraphConfig = dataclasses.field(default_factory=CudaGraphConfig)
    unknown_future_field_xyz: str = "kept"


def expected(value: Any) -> Any:
    """What the parser should give for a Python value printed by repr()."""
    if dataclasses.is_dataclass(value):
        return {"__call__": type(value).__name__,
                **{f.name: expected(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, tuple):
        return {"__tuple__": [expected(v) for v in value]}
    if isinstance(value, list):
        return [expected(v) for v in value]
    if isinstance(value, dict):
        return {str(k): expected(v) for k, v in value.items()}
    return value


def test_dataclass_repr_round_trips():
    args = ServerArgs()
    parsed = parse_call_or_dict(repr(args))
    assert parsed.style == "repr"
    assert parsed.truncated_at is None and parsed.elided is False
    assert list(parsed.fields) == [f.name for f in dataclasses.fields(args)]
    want = expected(args)
    del want["__call__"]
    assert jsonable(parsed.fields) == want
    assert parsed.fields["watchdog_timeout"] == math.inf
    assert parsed.fields["max_queued_requests"] == 9223372036854775807
    assert type(parsed.fields["tp_size"]) is int and type(parsed.fields["mem_fraction_static"]) is float
    assert parsed.fields["enable_dp_attention"] is True and parsed.fields["disable_cuda_graph"] is False
    assert parsed.fields["unknown_future_field_xyz"] == "kept"


def test_nested_calls_are_call_objects():
    parsed = parse_call_or_dict(repr(ServerArgs()))
    cfg = parsed.fields["cuda_graph_config"]
    assert isinstance(cfg, Call) and cfg.name == "CudaGraphConfig" and cfg.args == ()
    decode = cfg.kwargs["decode"]
    assert isinstance(decode, Call) and decode.name == "PhaseConfig"
    assert decode.kwargs == {"backend": "full", "max_bs": 256, "bs": [1, 2, 4, 8], "tc_compiler": "eager"}
    assert cfg.kwargs["prefill"].kwargs["max_bs"] == 8192


def test_dict_repr_round_trips():
    value = {"model_path": "Qwen/Qwen3-8B", "tp_size": 4, "mem_fraction_static": 0.893, "page_size": None,
             "enable_dp_attention": False, "cuda_graph_config": {"decode": {"backend": "full", "max_bs": 512,
                                                                            "bs": [1, 2, 4]}, "prefill": None},
             "ratio": float("inf"), "pair": (1, "x")}
    parsed = parse_call_or_dict(repr(value))
    assert parsed.style == "dict" and parsed.truncated_at is None and parsed.elided is False
    assert jsonable(parsed.fields) == expected(value)
    assert list(parsed.fields) == list(value)


@pytest.mark.parametrize("value", [
    "plain", "", "it's", 'say "hi"', "both ' and \"", "tab\there", "new\nline", "back\\slash",
    "C:\\models\\llama", "\x1b[0m", "café", "日本語", "{\"json\": [1, 2]}", "trailing\\", "a'b\"c",
    "\\n is not a newline", "\u2028", "\x00", "%s {} $HOME",
])
def test_string_escapes_round_trip(value):
    parsed = parse_call_or_dict(f"ServerArgs(v={value!r}, n=1)")
    assert parsed.fields == {"v": value, "n": 1}
    assert parsed.truncated_at is None


@pytest.mark.parametrize("value", ["x'y", "O'Reilly", "'", "'s"])
def test_double_quoted_string_with_early_apostrophe(value):
    assert parse_call_or_dict(f"ServerArgs(v={value!r})").fields == {"v": value}


def test_adjacent_strings_concatenate_and_octal_escape():
    assert parse_literal("'a' 'b'") == "ab"
    assert parse_literal(r"'\101\x42\u0043'") == "ABC"


@pytest.mark.parametrize("text, want", [
    ("None", None), ("True", True), ("False", False), ("inf", math.inf), ("0", 0), ("-1", -1),
    ("+2", 2), ("1.5", 1.5), ("1e-05", 1e-05), ("-1.5e+20", -1.5e20), ("[]", []), ("()", ()),
    ("{}", {}), ("(1,)", (1,)), ("[1, [2, [3]]]", [1, [2, [3]]]), ("{'a': {'b': (1, 2)}}", {"a": {"b": (1, 2)}}),
    ("'x'", "x"), ("[None, True, 'a']", [None, True, "a"]),
])
def test_scalars_and_containers(text, want):
    got = parse_literal(text)
    assert got == want and isinstance(got, type(want))


def test_nan_is_nan():
    assert math.isnan(parse_literal("nan"))


def test_sets_keep_their_items():
    got = parse_literal("{3, 1, 2}")
    assert sorted(got) == [1, 2, 3]
    assert isinstance(parse_literal("set()"), Call) and parse_literal("set()").name == "set"
    fs = parse_literal("frozenset({1, 2})")
    assert fs.name == "frozenset" and sorted(fs.args[0]) == [1, 2]


def test_dict_with_non_string_keys():
    got = parse_literal("{1: 'a', (1, 2): 'b', None: 3}")
    assert got == {1: "a", (1, 2): "b", None: 3}


def test_angle_reprs_stay_text():
    parsed = parse_call_or_dict("ServerArgs(kind=<ComponentType.FULL: 0>, obj=<object at 0x7f00>, n=2)")
    assert parsed.fields == {"kind": "<ComponentType.FULL: 0>", "obj": "<object at 0x7f00>", "n": 2}


def test_negative_infinity():
    assert parse_call_or_dict("ServerArgs(low=-inf, n=1)").fields == {"low": -math.inf, "n": 1}


def test_prefixed_strings():
    parsed = parse_call_or_dict("ServerArgs(key=b'ab', raw=r'\\d+', n=1)")
    assert parsed.fields == {"key": "ab", "raw": "\\d+", "n": 1} and parsed.truncated_at is None


# ---- elision and truncation -----------------------------------------------------------------

def test_elided_repr_and_dict():
    p = parse_call_or_dict("ServerArgs(model_path='m', ..., tp_size=2, ...)")
    assert p.fields == {"model_path": "m", "tp_size": 2} and p.elided is True and p.truncated_at is None
    d = parse_call_or_dict("{'model_path': 'm', ..., 'tp_size': 2}")
    assert d.fields == {"model_path": "m", "tp_size": 2} and d.elided is True
    inner = parse_call_or_dict("ServerArgs(bs=[1, 2, ..., 512], tp_size=2)")
    assert inner.fields["bs"][:2] == [1, 2] and isinstance(inner.fields["bs"][2], Elided)
    assert inner.elided is False  # `...` inside a value is not an elided field
    value = parse_call_or_dict("ServerArgs(model_path=..., tp_size=2)")
    assert value.elided is True and isinstance(value.fields["model_path"], Elided)


def test_not_a_mapping_raises_value_error():
    for text in ("ServerArgs(", "garbage", "[1, 2]", "'text'", "", "ServerArgs(model_path='m"):
        with pytest.raises(ValueError):
            parse_call_or_dict(text)


def top_level_commas(text: str) -> list[int]:
    """Offsets of the commas between top-level fields, by an independent scanner."""
    out, depth, quote, i = [], 0, None, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 1:
            out.append(i)
        i += 1
    return out


def check_truncations(text: str, step: int = 1) -> int:
    full = parse_call_or_dict(text)
    assert full.truncated_at is None
    names = list(full.fields)
    commas = top_level_commas(text)
    assert len(commas) == len(names) - 1
    checked = 0
    for i in range(0, len(commas), step):
        c = commas[i]
        end = commas[i + 1] if i + 1 < len(commas) else len(text) - 1
        for cut in {c + 1, (c + 1 + end) // 2, end}:
            part = parse_call_or_dict(text[:cut])
            assert part.truncated_at == c, (cut, text[max(0, c - 40):cut])
            assert list(part.fields) == names[: i + 1], text[c - 40:cut]
            assert all(jsonable(part.fields[k]) == jsonable(full.fields[k]) for k in part.fields)
            checked += 1
    return checked


def test_truncation_at_every_top_level_comma_synthetic():
    assert check_truncations(repr(ServerArgs())) > 60
    d = {"model_path": "m", "bs": [1, 2, 3], "cfg": {"a": (1, 2), "b": "x, y"}, "tp_size": 2, "s": "it's"}
    assert check_truncations(repr(d)) > 10


def _corpus_server_args(name_prefix: str) -> str:
    path = next(SGLANG_CORPUS.glob(f"{name_prefix}*.log"))
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if "server_args=ServerArgs(" in line:
            return line.split("server_args=", 1)[1].strip()
    raise AssertionError(f"no server_args line in {path.name}")


@needs_shared
def test_truncation_at_every_top_level_comma_of_a_real_line():
    text = _corpus_server_args("003-")
    full = parse_call_or_dict(text)
    assert len(full.fields) > 80 and full.fields["model_path"]
    assert check_truncations(text) >= 3 * (len(full.fields) - 2)


@needs_shared
def test_truncation_of_a_long_real_line_sampled():
    text = _corpus_server_args("027-")
    full = parse_call_or_dict(text)
    assert len(full.fields) > 300
    assert full.fields["mem_fraction_static"] == 0.841
    check_truncations(text, step=25)


# ---- nothing is evaluated ---------------------------------------------------------------------

MALICIOUS = [
    "ServerArgs(a=__import__('os').system('touch {marker}'), b=1)",
    "ServerArgs(a=open('{marker}', 'w'), b=1)",
    "{{'a': __import__('os').system('touch {marker}'), 'b': 1}}",
    "ServerArgs(a=(lambda: __import__('os').system('touch {marker}'))(), b=1)",
    "ServerArgs(a=exec(\"open('{marker}', 'w')\"), b=1)",
]


@pytest.mark.parametrize("template", MALICIOUS)
def test_never_evaluates(template, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    text = template.format(marker=marker)
    calls = []

    def trap(*a, **k):
        calls.append(a)
        raise AssertionError("evaluated")

    monkeypatch.setattr(builtins, "eval", trap)
    monkeypatch.setattr(builtins, "exec", trap)
    monkeypatch.setattr(builtins, "compile", trap)
    monkeypatch.setattr(os, "system", trap)
    try:
        parsed = parse_call_or_dict(text)
    except ValueError:
        parsed = None
    assert not calls and not marker.exists()
    if parsed is not None:
        # whatever was read is text or a Call description, never a result
        assert not isinstance(parsed.fields.get("a"), (int, float)) or isinstance(parsed.fields.get("a"), bool)
        assert not hasattr(parsed.fields.get("a"), "write")


def test_module_has_no_eval():
    source = Path(__import__("capdiag.parsing.literal", fromlist=["x"]).__file__).read_text()
    assert not re.search(r"(?<![\w.])(eval|exec|literal_eval|compile)\s*\(", source)
