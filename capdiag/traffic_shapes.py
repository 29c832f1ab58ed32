"""The traffic lines' wordings, declared once: each is compiled to the regular expression the
Python path reads it with and to the program the compiled scanner (capdiag/_scan.c) runs.

A wording is a sequence of pieces. The pieces are the few that the wordings need, and each has
one meaning in both compilations: a literal; one of several literals; an optional run of
pieces; a run of digits; a run of characters of a class; a figure taken as an integer
(1–15 digits) or a decimal (1–15 digits, then perhaps a point and 1–15 more); a literal whose
presence is taken as a flag.

The scanner matches greedily and never backtracks, where the regular expression may. The two
agree because of what `program()` checks before it compiles a wording: every optional run and
every run of a class is followed by something that cannot begin the same way (so taking the
run never has to be undone), and a figure's digits are followed by a literal or end the
wording. Where the scanner finds a line that does not match a wording wholly it does not guess:
the whole block goes to the Python path (capdiag/traffic.py).
"""
from __future__ import annotations

import re
import struct
from typing import Union

from capdiag.frozen import frozen

DIGITS = frozenset(b"0123456789")
UPPER = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")
FIGURE_DIGITS = 15  # at most this many a figure: int() refuses a 5000-digit run, and no server prints one


@frozen
class Lit:
    text: bytes


@frozen
class Either:
    texts: tuple[bytes, ...]


@frozen
class Opt:
    pieces: tuple


@frozen
class Run:
    """One or more characters of `chars` (`count` exactly, when given)."""
    chars: frozenset
    count: int = 0


@frozen
class Int:
    name: str


@frozen
class Num:
    name: str


@frozen
class Flag:
    name: str
    text: bytes


Piece = Union[Lit, Either, Opt, Run, Int, Num, Flag]


def opt(*pieces: Piece) -> Opt:
    return Opt(tuple(pieces))


def digits() -> Run:
    return Run(DIGITS)


@frozen
class Wording:
    """A traffic line's wording: its pieces, from its first literal (where the scanner looks for it)."""
    name: str
    pieces: tuple

    @property
    def fields(self) -> tuple[str, ...]:
        """The names of its figures and flags, in the order the regular expression's groups take them."""
        return tuple(_fields(self.pieces))

    def regex(self) -> bytes:
        return b"".join(_regex(p) for p in self.pieces)

    @property
    def anchor(self) -> bytes:
        first = self.pieces[0]
        assert isinstance(first, Lit), f"{self.name}: a wording begins with a literal"
        return first.text

    def program(self) -> bytes:
        """The scanner's program: the pieces as op codes, each figure or flag by its field's index."""
        _check(self.pieces, self.name)
        return _program(self.pieces, {name: at for at, name in enumerate(self.fields)})


def wording(name: str, *pieces: Union[Piece, bytes]) -> Wording:
    return Wording(name, tuple(Lit(p) if isinstance(p, bytes) else p for p in pieces))


def _fields(pieces):
    for p in pieces:
        if isinstance(p, (Int, Num, Flag)):
            yield p.name
        elif isinstance(p, Opt):
            yield from _fields(p.pieces)


def _class(chars: frozenset) -> bytes:
    if chars == DIGITS:
        return rb"\d"
    if chars == UPPER:
        return rb"[A-Z]"
    body = b"".join(re.escape(bytes([c])) for c in sorted(chars - DIGITS))
    return b"[" + (rb"\d" if DIGITS <= chars else b"") + body + b"]"


def _regex(p: Piece) -> bytes:
    if isinstance(p, Lit):
        return re.escape(p.text)
    if isinstance(p, Either):
        return b"(?:" + b"|".join(re.escape(t) for t in p.texts) + b")"
    if isinstance(p, Opt):
        return b"(?:" + b"".join(_regex(q) for q in p.pieces) + b")?"
    if isinstance(p, Run):
        return _class(p.chars) + (b"{%d}" % p.count if p.count else b"+")
    if isinstance(p, Int):
        return rb"(\d{1,%d})" % FIGURE_DIGITS
    if isinstance(p, Num):
        return rb"(\d{1,%d}(?:\.\d{1,%d})?)" % (FIGURE_DIGITS, FIGURE_DIGITS)
    if isinstance(p, Flag):
        return b"(" + re.escape(p.text) + b")?"
    raise TypeError(p)


INT, NUM = _regex(Int("")), _regex(Num(""))  # a figure's group, for the patterns written around these


# ---- the scanner's program (capdiag/_scan.c reads the same op codes)
OP_LIT, OP_EITHER, OP_OPT, OP_RUN, OP_INT, OP_NUM, OP_FLAG = range(1, 8)


def _short(n: int) -> bytes:
    return struct.pack("<H", n)


def _program(pieces, slots: dict[str, int]) -> bytes:
    out = bytearray()
    for p in pieces:
        if isinstance(p, Lit):
            out += bytes([OP_LIT]) + _short(len(p.text)) + p.text
        elif isinstance(p, Either):
            out += bytes([OP_EITHER, len(p.texts)])
            for t in p.texts:
                out += _short(len(t)) + t
        elif isinstance(p, Opt):
            body = _program(p.pieces, slots)
            out += bytes([OP_OPT]) + _short(len(body)) + body
        elif isinstance(p, Run):
            chars = bytes(sorted(p.chars))
            out += bytes([OP_RUN, p.count, len(chars)]) + chars
        elif isinstance(p, (Int, Num)):
            out += bytes([OP_INT if isinstance(p, Int) else OP_NUM, slots[p.name]])
        elif isinstance(p, Flag):
            out += bytes([OP_FLAG, slots[p.name]]) + _short(len(p.text)) + p.text
    return bytes(out)


def _firsts(p: Piece) -> frozenset:
    """The bytes a match of `p` may begin with (empty for what may match nothing)."""
    if isinstance(p, Lit):
        return frozenset(p.text[:1])
    if isinstance(p, Either):
        return frozenset(t[0] for t in p.texts)
    if isinstance(p, Run):
        return p.chars
    if isinstance(p, (Int, Num)):
        return DIGITS
    return frozenset()  # Opt and Flag may match nothing


def _begins(pieces) -> frozenset:
    """The bytes what follows may begin with, up to the first piece that must match."""
    found: set = set()
    for p in pieces:
        if isinstance(p, Opt):
            found |= _begins(p.pieces)
        elif isinstance(p, Flag):
            found |= set(p.text[:1])
        else:
            return frozenset(found | _firsts(p))
    return frozenset(found)


def _required(pieces) -> bool:
    return any(not isinstance(p, (Opt, Flag)) for p in pieces)


def _check(pieces, name: str, after=()) -> None:
    """Refuse a wording where greedy matching without backtracking could differ from the
    regular expression's: see the module's docstring. (An optional run followed only by
    optional ones may begin like them: the expression, too, keeps the first that matches.)"""
    pieces = tuple(pieces)
    for at, p in enumerate(pieces):
        rest = pieces[at + 1:] + tuple(after)
        follow = _begins(rest)
        bound = follow if _required(rest) else frozenset()
        if isinstance(p, Opt):
            if not p.pieces or isinstance(p.pieces[0], (Opt, Flag)):
                raise ValueError(f"{name}: an optional run begins with something that may match nothing")
            if _firsts(p.pieces[0]) & bound:
                raise ValueError(f"{name}: an optional run and what follows it begin alike")
            _check(p.pieces, name, rest)
        elif isinstance(p, Flag) and set(p.text[:1]) & bound:
            raise ValueError(f"{name}: a flag and what follows it begin alike")
        elif isinstance(p, Run) and not p.count and p.chars & follow:
            raise ValueError(f"{name}: a run of a class is followed by a character of the class")
        elif isinstance(p, (Int, Num)) and (follow & DIGITS or isinstance(p, Num) and ord(".") in follow):
            raise ValueError(f"{name}: a figure is followed by what could continue it")
        elif isinstance(p, Either) and len({t[:1] for t in p.texts}) != len(p.texts):
            raise ValueError(f"{name}: two literals of a choice begin alike")


# ---- the wordings (their history: capdiag/traffic.py, where the patterns are used)
_OPT_ITER = opt(Lit(b" ["), digits(), Lit(b"]"))  # SGLANG_LOG_FORWARD_ITERS' iteration counter
_FULL = opt(Lit(b"full "))
# the head of a decode line, to its usage: a hybrid pool's SWA figures follow (the flag), which
# only the line-by-line reading takes
SGLANG_DECODE = wording(
    "sglang decode", b"Decode batch", _OPT_ITER, Either((b",", b".")), b" #running-req: ", Int("running"),
    b", #", _FULL, b"token: ", Int("tokens"), b", ", _FULL, b"token usage: ", Num("usage"), Flag("swa", b", #swa"))
SGLANG_DECODE_TAIL = wording("sglang decode tail", b"gen throughput (token/s): ", Num("throughput"), b", #queue-req: ",
                             Int("queue"))
SGLANG_PREFILL = wording(
    "sglang prefill", b"Prefill batch", _OPT_ITER, Either((b",", b".")), b" #new-seq: ", Int("seqs"),
    b", #new-token: ", Int("new"), b", #cached-token: ", Int("cached"), b", ",
    opt(Lit(b"cache hit rate: "), Run(DIGITS | {ord(".")}), Lit(b"%, ")), _FULL, b"token usage: ", Num("usage"), b", ",
    opt(Lit(b"mamba usage: "), Run(DIGITS | {ord(".")}), Lit(b", ")), b"#running-req: ", Int("running"),
    b", #queue-req: ", Int("queue"))
VLLM_METRICS = wording(
    "vllm metrics", b"Avg prompt throughput: ", Num("prompt"), b" tokens/s, Avg generation throughput: ",
    Num("generation"), b" tokens/s, Running: ", Int("running"), b" reqs, ",
    opt(Lit(b"Swapped: "), digits(), Lit(b" reqs, ")), Either((b"Pending", b"Waiting")), b": ", Int("waiting"), b" reqs",
    opt(Lit(b", Deferred: "), digits(), Lit(b" reqs")),
    opt(Lit(b", KV fetch: "), digits(), Lit(b" waiting to start, "), digits(), Lit(b" in progress, "), digits(),
        Lit(b" completed waiting")),
    opt(Lit(b", Preemptions: "), Int("preempted")),
    opt(Lit(b", "), Run(UPPER, 3), Lit(b" KV cache usage: "), Num("usage"), Lit(b"%")))
