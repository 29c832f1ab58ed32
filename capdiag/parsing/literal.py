"""Python-literal values (repr of a dataclass, dict, list, …) parsed by grammar/pyliteral.lark.

Nothing is evaluated. A line cut short by a paste keeps every top-level field that was
complete before the cut; `parse_call_or_dict` reports where the cut was.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Optional

from lark import Lark, Transformer, UnexpectedInput

from capdiag.frozen import frozen
from capdiag.parsing.lalr import lalr_parser


MAX_DEPTH = 100  # bracket levels; real records nest 3 or 4 deep
MAX_DIGITS = 4300  # int()'s own limit on the digits it converts (sys.get_int_max_str_digits)
_QUOTED = re.compile(r"""'(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?""")
_BRACKET = re.compile(r"[()\[\]{}]")


@frozen
class Elided:
    """`...` standing where a paste left values out."""

    def __repr__(self) -> str:
        return "..."


@frozen
class Call:
    """A nested repr such as `PhaseConfig(backend='full', max_bs=256)`."""

    name: str
    args: tuple
    kwargs: dict


@frozen
class ParsedMapping:
    fields: dict[str, Any]
    style: str  # "repr" for Name(k=v, ...), "dict" for {'k': v, ...}
    truncated_at: Optional[int]
    elided: bool


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a",
            "b": "\b", "f": "\f", "v": "\v", "0": "\0"}


def unescape(body: str) -> str:
    """Undo Python's string-literal escapes without evaluating anything."""
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\" or i + 1 == len(body):
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        width = {"x": 2, "u": 4, "U": 8}.get(nxt)
        if width and len(body) >= i + 2 + width:
            try:
                out.append(chr(int(body[i + 2:i + 2 + width], 16)))
                i += 2 + width
                continue
            except (ValueError, OverflowError):  # not hex, or past U+10FFFF: kept as written
                pass
        if nxt in "01234567" and body[i + 1:i + 4].isdigit() and len(body[i + 1:i + 4]) == 3:
            out.append(chr(int(body[i + 1:i + 4], 8)))
            i += 4
            continue
        out.append(_ESCAPES.get(nxt, "\\" + nxt))
        i += 2
    return "".join(out)


class _Dict(dict):
    """A dict literal that remembers whether `...` stood among its items."""

    elided = False


class _Pair(tuple):
    """A `key: value` item of a dict literal."""


class _KW(tuple):
    """A `name=value` argument, tagged so a positional 2-tuple is never taken for one."""


class _ToPython(Transformer):
    def string(self, parts):
        text = []
        for tok in parts:
            s = str(tok)
            quote = next(i for i, ch in enumerate(s) if ch in "'\"")
            prefix, body = s[:quote].lower(), s[quote + 1:-1]
            text.append(body if "r" in prefix else unescape(body))
        return "".join(text)

    def number(self, items):
        s = str(items[0])
        if s.lstrip("+-") in ("inf", "nan") or any(c in s for c in ".eE"):
            return float(s)
        # past int()'s digit limit the value is of no use: its float (inf) is dropped at the fact boundary
        return int(s) if len(s) <= MAX_DIGITS else float("inf")

    def name(self, items):
        s = str(items[0])
        return {"None": None, "True": True, "False": False,
                "inf": float("inf"), "nan": float("nan")}.get(s, s)

    def ellipsis(self, _):
        return Elided()

    def opaque(self, items):
        return str(items[0])

    def items(self, values):
        return list(values)

    def list(self, items):
        return items[0] if items and items[0] is not None else []

    def tuple(self, items):
        return tuple(items[0]) if items and items[0] is not None else ()

    def pairs(self, pairs):
        return pairs

    def pair(self, kv):
        return _Pair((kv[0], kv[1]))

    def dict(self, items):
        pairs = items[0] if items and items[0] is not None else []
        if any(not isinstance(p, (_Pair, Elided)) for p in pairs):
            return [p for p in pairs if not isinstance(p, _Pair)]  # a set literal
        out = _Dict((_hashable(p[0]), p[1]) for p in pairs if isinstance(p, _Pair))
        out.elided = any(isinstance(p, Elided) for p in pairs)
        return out

    def kwarg(self, items):
        return _KW((str(items[0]), items[1]))

    def args(self, items):
        return items

    def call(self, items):
        args = items[1] if len(items) > 1 and items[1] is not None else []
        positional = tuple(a for a in args if not _is_kwarg(a))
        kwargs = dict(a for a in args if _is_kwarg(a))
        return Call(str(items[0]), positional, kwargs)


def _is_kwarg(a) -> bool:
    return type(a) is _KW


def _hashable(k):
    """A dict key as the parser built it, made hashable (lists and dicts inside it too)."""
    if isinstance(k, (list, tuple)):
        return tuple(_hashable(v) for v in k)
    if isinstance(k, dict):
        return tuple((_hashable(a), _hashable(b)) for a, b in k.items())
    return k


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return lalr_parser("pyliteral.lark", maybe_placeholders=True)


def nesting_depth(text: str) -> int:
    """The deepest bracket nesting outside quoted strings (a cut string counts to the end)."""
    deepest = depth = 0
    for found in _BRACKET.finditer(_QUOTED.sub("", text)):
        if found.group() in "([{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def parse_literal(text: str) -> Any:
    """Parse one Python literal; raises lark.UnexpectedInput when it is not one, ValueError
    when it nests deeper than MAX_DEPTH (the transformer recurses once per level)."""
    if nesting_depth(text) > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    return _ToPython().transform(_parser().parse(text))


_OPEN = {"LPAR": 1, "LSQB": 1, "LBRACE": 1, "RPAR": -1, "RSQB": -1, "RBRACE": -1}


def _top_level_commas(text: str) -> tuple[list[int], int]:
    """Offsets of the commas that separate top-level fields, and where lexing stopped."""
    commas, depth, end = [], 0, len(text)
    try:
        for tok in _parser().lex(text):
            depth += _OPEN.get(tok.type, 0)
            if tok.type == "COMMA" and depth == 1:
                commas.append(tok.start_pos)
    except UnexpectedInput as exc:
        end = exc.pos_in_stream if exc.pos_in_stream is not None else len(text)
    return commas, end


def parse_call_or_dict(text: str) -> ParsedMapping:
    """Parse `Name(k=v, ...)` or `{'k': v, ...}` into a field mapping.

    A value cut short (a paste that lost the end of a several-KB line) keeps the fields
    before the cut; `truncated_at` is the character offset where it stops.
    Raises ValueError when not even the opening of such a value is there.
    """
    text = text.strip()
    truncated_at = None
    try:
        value = parse_literal(text)
    except UnexpectedInput as exc:
        commas, lex_end = _top_level_commas(text)
        stop = min(exc.pos_in_stream if exc.pos_in_stream is not None else len(text), lex_end)
        usable = [c for c in commas if c <= stop]
        if not usable:
            raise ValueError("no complete field before the line breaks off") from exc
        closer = "}" if text.startswith("{") else ")"
        value = parse_literal(text[:usable[-1]] + closer)
        truncated_at = usable[-1]
    if isinstance(value, Call):
        fields, style = dict(value.kwargs), "repr"
        elided = any(isinstance(a, Elided) for a in value.args)
    elif isinstance(value, dict):
        fields, style = {str(k): v for k, v in value.items()}, "dict"
        elided = getattr(value, "elided", False)
    else:
        raise ValueError("expected ServerArgs(...) or {...}")
    elided = elided or any(isinstance(v, Elided) for v in fields.values())
    return ParsedMapping(fields, style, truncated_at, elided)
