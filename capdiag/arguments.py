"""The numeric arguments every surface takes, with their bounds, declared once: the CLI builds
its option types from this table and the Python API checks its keywords against it, so a value
the CLI refuses is refused by the API too, with the same one-line message."""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional

import click

from capdiag.errors import InputError
from capdiag.frozen import frozen

MAX_TOKENS = 1 << 24  # a request or context length in tokens: far above any model's


@frozen
class Bound:
    kind: type  # int or float
    low: Optional[float] = None
    high: Optional[float] = None
    open_low: bool = False
    open_high: bool = False

    def words(self) -> str:
        def shown(x: float) -> str:
            return f"{int(x):,}" if self.kind is int else f"{x:g}"
        low = "" if self.low is None else f"{'>' if self.open_low else '≥'} {shown(self.low)}"
        high = "" if self.high is None else f"{'<' if self.open_high else '≤'} {shown(self.high)}"
        return " and ".join(p for p in (low, high) if p)

    def holds(self, value: float) -> bool:
        return (self.low is None or (value > self.low if self.open_low else value >= self.low)) and \
            (self.high is None or (value < self.high if self.open_high else value <= self.high))


# flag (as the CLI spells it, without the dashes) → its bound
BOUNDS: dict[str, Bound] = {
    "launch": Bound(int, 1),
    "jobs": Bound(int, 1),
    "tp": Bound(int, 1, 4096),
    "gpus": Bound(int, 1, 4096),
    "concurrency": Bound(int, 1, MAX_TOKENS),
    "layers": Bound(int, 1, 100_000),
    "kv-heads": Bound(int, 1, 100_000),
    "head-dim": Bound(int, 1, 100_000),
    "hidden": Bound(int, 1, 10_000_000),
    "fraction": Bound(float, 0, 1, open_low=True, open_high=True),
    "headroom": Bound(float, 0, 0.9),
    "timeout": Bound(float, 0.1, 3600),
    "interval": Bound(float, 0, 300),
    "token-lengths": Bound(int, 1, MAX_TOKENS),  # each length
    "context": Bound(int, 1, MAX_TOKENS),  # each length
}


class _Bounded(click.ParamType):
    """A CLI option of BOUNDS: the text read as the number, then check()ed as the API checks it."""

    def __init__(self, flag: str):
        self.flag, self.name = flag, "integer" if BOUNDS[flag].kind is int else "float"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = BOUNDS[self.flag].kind(str(value).strip())
            except ValueError:
                self.fail(f"--{self.flag} {value!r}: {'a whole number' if self.name == 'integer' else 'a number'}",
                          param, ctx)
        try:
            return check(self.flag, number)
        except InputError as refused:
            self.fail(str(refused), param, ctx)


class _Lengths(click.ParamType):
    """Comma-separated lengths in tokens (`4096,8192`), each check()ed as the API checks it."""

    name = "lengths"

    def __init__(self, flag: str):
        self.flag = flag

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            lengths = tuple(int(v) for v in str(value).split(",") if v.strip())
        except ValueError:
            self.fail("a comma-separated list of whole numbers, e.g. 4096,8192", param, ctx)
        try:
            return check_lengths(self.flag, lengths)
        except InputError as refused:
            self.fail(str(refused), param, ctx)


LENGTHS = ("token-lengths", "context")  # the flags of BOUNDS that take a list


def click_type(flag: str) -> click.ParamType:
    """The CLI option type of a bounded argument (a list of lengths for LENGTHS)."""
    return _Lengths(flag) if flag in LENGTHS else _Bounded(flag)


def check(flag: str, value: Any) -> Any:
    """`value` when it is a number within the flag's bound (None passes: not given); else the
    CLI's refusal as an InputError."""
    if value is None:
        return None
    b = BOUNDS[flag]
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is None or (b.kind is int and not float(number).is_integer()) or not math.isfinite(number) \
            or not b.holds(number):
        raise InputError(f"--{flag} {value!r}: {'a whole number' if b.kind is int else 'a number'} {b.words()}")
    return b.kind(number)


def check_lengths(flag: str, values: Optional[Iterable[Any]]) -> Optional[tuple[int, ...]]:
    """Request or context lengths: one or more whole numbers within the flag's bound."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InputError(f"--{flag} {values!r}: a list of whole numbers, e.g. (4096, 8192)")
    lengths = tuple(check(flag, v) for v in values)
    if not lengths:
        raise InputError(f"--{flag}: give at least one length")
    return lengths
