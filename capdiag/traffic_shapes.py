"""The traffic lines' wordings, declared once: each is compiled to the regular expression the
Python path reads it with, and to the C function the compiled scanner (capdiag/_scan.c) calls
to match it (`c_source()`, which setup.py writes into the build as _scan_wordings.h).

A wording is a sequence of pieces. The pieces are the few that the wordings need, and each has
one meaning in both compilations: a literal; one of several literals; an optional run of
pieces; a run of digits; a run of characters of a class; a figure taken as an integer
(1–15 digits) or a decimal (1–15 digits, then perhaps a point and 1–15 more); a literal whose
presence is taken as a flag.

The scanner matches greedily and never backtracks, where the regular expression may. The two
agree because of what `c_source()` checks before it compiles a wording: every optional run and
every run of a class is followed by something that cannot begin the same way (so taking the
run never has to be undone), and a figure's digits are followed by a literal or end the
wording. Where the scanner finds a line that does not match a wording wholly it does not guess:
the whole block goes to the Python path (capdiag/traffic.py).

This module imports nothing of capdiag's: setup.py loads it by its path, in a build
environment that holds only setuptools.
"""
from __future__ import annotations

import re
from typing import NamedTuple, Union

DIGITS = frozenset(b"0123456789")
UPPER = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")
FIGURE_DIGITS = 15  # at most this many a figure: int() refuses a 5000-digit run, and no server prints one


class Lit(NamedTuple):
    text: bytes


class Either(NamedTuple):
    texts: tuple[bytes, ...]


class Opt(NamedTuple):
    pieces: tuple


class Run(NamedTuple):
    """One or more characters of `chars` (`count` exactly, when given)."""
    chars: frozenset
    count: int = 0


class Int(NamedTuple):
    name: str


class Num(NamedTuple):
    name: str


class Flag(NamedTuple):
    name: str
    text: bytes


Piece = Union[Lit, Either, Opt, Run, Int, Num, Flag]


def opt(*pieces: Piece) -> Opt:
    return Opt(tuple(pieces))


def digits() -> Run:
    return Run(DIGITS)


class Wording(NamedTuple):
    """A traffic line's wording: its pieces, from its first literal (where the scanner looks for it)."""
    name: str
    pieces: tuple

    @property
    def fields(self) -> tuple[str, ...]:
        """The names of its figures and flags, in the order the regular expression's groups take them."""
        return tuple(_fields(self.pieces))

    def regex(self) -> bytes:
        return b"".join(_regex(p) for p in self.pieces)

    def checked(self) -> "Wording":
        """The wording, once proven to match greedily as its regular expression does (else ValueError)."""
        _check(self.pieces, self.name)
        return self

    @property
    def anchor(self) -> bytes:
        first = self.pieces[0]
        assert isinstance(first, Lit), f"{self.name}: a wording begins with a literal"
        return first.text


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


def _example(pieces) -> bytes:
    """The shortest line a wording matches (no optional run, the first of each choice, figures
    of two digits)."""
    out = b""
    for p in pieces:
        if isinstance(p, Lit):
            out += p.text
        elif isinstance(p, Either):
            out += p.texts[0]
        elif isinstance(p, Run):
            out += bytes([min(p.chars)]) * max(p.count, 1)
        elif isinstance(p, (Int, Num)):
            out += b"12"
    return out


def key(anchor: bytes) -> int:
    """Where in `anchor` the byte is that the scanner looks for first (memchr, then the whole
    literal): the one rarest in lines of every wording behind a rank-tagged head, so that few
    false starts are checked. Only speed depends on the choice."""
    text = b"\n".join(b"[2026-05-01 10:00:00 DP0 TP0] INFO " + _example(w.pieces) for w in WORDINGS)
    return min(range(len(anchor)), key=lambda at: (text.count(anchor[at:at + 1]), at))


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


# ---- the C the compiled scanner matches with
MAX_FIELDS = 8  # capdiag/_scan.c's Span arrays


def c_source() -> str:
    """_scan_wordings.h: for each wording its first literal, the byte of it looked for first
    (`key`), its fields' indices and a function that matches it at a place, greedily (which
    `_check` proves to be what the regular expression matches); and the digest of the wordings,
    by which capdiag.scanner tells a build of other wordings."""
    out = ["/* Generated from capdiag/traffic_shapes.py by setup.py: not edited by hand. */",
           f"#define WORDINGS_DIGEST {_c_string(digest().encode())}"]
    for w in WORDINGS:
        out.append(_c_wording(w.checked()))
    return "\n".join(out) + "\n"


def digest() -> str:
    """What the wordings mean: their names, regular expressions, fields and anchors' keys (the
    build holds the same text, which capdiag.scanner compares)."""
    return repr([(w.name, w.regex(), w.fields, key(w.anchor)) for w in WORDINGS])


def _c_string(text: bytes) -> str:
    plain = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 #%&()*+,-./:;<=>[]^_{|}~")
    return '"' + "".join(chr(c) if c in plain else "\\%03o" % c for c in text) + '"'


def _c_class(chars: frozenset, c: str) -> str:
    runs, values = [], sorted(chars)
    for v in values:
        if runs and runs[-1][1] == v - 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return "(" + " || ".join(f"{c} == {lo}" if lo == hi else f"({c} >= {lo} && {c} <= {hi})" for lo, hi in runs) + ")"


def _c_wording(w: Wording) -> str:
    ident = re.sub(r"\W+", "_", w.name).upper()
    fields = w.fields
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"{w.name}: more than {MAX_FIELDS} fields")
    slots = {name: f"{ident}_{name.upper()}" for name in fields}
    body: list[str] = []
    _c_pieces(w.pieces, "i", "return NO;", slots, body, iter(range(1, 1000)))
    enum = ", ".join(f"{slots[name]} = {at}" for at, name in enumerate(fields))
    name = ident.lower()
    return "\n".join([
        f"enum {{ {enum}, {ident}_FIELDS = {len(fields)} }};",
        f"static int match_{name}(const char *s, Py_ssize_t i, Py_ssize_t end, Span *f, Py_ssize_t *out) {{",
        *("    " + line for line in body),
        "    *out = i;",
        "    return YES;",
        "}",
        f"static const Wording {ident} = {{{_c_string(w.anchor)}, {len(w.anchor)}, {key(w.anchor)}, {ident}_FIELDS, "
        f"match_{name}}};",
    ])


def _c_pieces(pieces, i: str, fail: str, slots: dict, out: list, labels) -> None:
    """C statements matching `pieces` at `i` (advanced past them), `fail` where one does not match."""
    for p in pieces:
        if isinstance(p, Lit):
            n = len(p.text)
            out.append(f"if (end - {i} < {n} || !same(s + {i}, {_c_string(p.text)}, {n})) {fail}")
            out.append(f"{i} += {n};")
        elif isinstance(p, Either):
            tests = [f"if (end - {i} >= {len(t)} && same(s + {i}, {_c_string(t)}, {len(t)})) {i} += {len(t)};"
                     for t in p.texts]
            out.append(" else ".join(tests) + f" else {fail}")
        elif isinstance(p, Opt):
            k = next(labels)
            inner: list[str] = []
            _c_pieces(p.pieces, f"i{k}", f"goto skip{k};", slots, inner, labels)
            undo = [f"f[{slots[name]}].at = NULL;" for name in _fields(p.pieces)]
            out += ["{", f"    Py_ssize_t i{k} = {i};", *("    " + line for line in inner), f"    {i} = i{k};",
                    f"    goto done{k};", f"skip{k}:;", *("    " + line for line in undo), f"done{k}:;", "}"]
        elif isinstance(p, Run):
            k = next(labels)
            bound = f" && r{k} - {i} < {p.count}" if p.count else ""
            out += ["{", f"    Py_ssize_t r{k} = {i};",
                    f"    while (r{k} < end{bound} && {_c_class(p.chars, f'(unsigned char)s[r{k}]')}) r{k}++;",
                    f"    if (r{k} == {i}{f' || r{k} - {i} != {p.count}' if p.count else ''}) {fail}",
                    f"    {i} = r{k};", "}"]
        elif isinstance(p, (Int, Num)):
            # the value is taken as the digits are: a figure is at most 15 digits, so it fits
            k, slot = next(labels), f"f[{slots[p.name]}]"
            digit = _c_class(DIGITS, "(unsigned char)s[{0}]")
            out += ["{", f"    Py_ssize_t d{k} = {i};", f"    int64_t v{k} = 0, w{k} = 0;",
                    f"    while (d{k} < end && {digit.format(f'd{k}')}) {{",
                    f"        if (d{k} - {i} == {FIGURE_DIGITS}) return REFUSED;",
                    f"        v{k} = v{k} * 10 + (s[d{k}] - '0');", f"        d{k}++;", "    }",
                    f"    if (d{k} == {i}) {fail}", f"    {slot}.digits = d{k} - {i};"]
            if isinstance(p, Num):
                out += [f"    if (d{k} + 1 < end && s[d{k}] == '.' && {digit.format(f'd{k} + 1')}) {{",
                        f"        Py_ssize_t e{k} = d{k} + 1;", f"        int64_t scale{k} = {10 ** (FIGURE_DIGITS - 1)};",
                        f"        while (e{k} < end && {digit.format(f'e{k}')}) {{",
                        f"            if (e{k} - d{k} - 1 == {FIGURE_DIGITS}) return REFUSED;",
                        f"            w{k} += (s[e{k}] - '0') * scale{k};", f"            scale{k} /= 10;",
                        f"            e{k}++;", "        }", f"        d{k} = e{k};", "    }"]
            out += [f"    {slot}.at = s + {i};", f"    {slot}.len = d{k} - {i};", f"    {slot}.whole = v{k};",
                    f"    {slot}.fraction = w{k};", f"    {i} = d{k};", "}"]
        elif isinstance(p, Flag):
            n = len(p.text)
            out.append(f"if (end - {i} >= {n} && same(s + {i}, {_c_string(p.text)}, {n})) {{ "
                       f"f[{slots[p.name]}].at = s + {i}; f[{slots[p.name]}].len = {n}; {i} += {n}; }}")


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
# the engine (a DP rank) that prints a V1 metrics line, right before it
VLLM_ENGINE = wording("vllm engine", b"Engine ", Int("engine"), b": Avg prompt")
WORDINGS = (SGLANG_DECODE, SGLANG_DECODE_TAIL, SGLANG_PREFILL, VLLM_METRICS, VLLM_ENGINE)
