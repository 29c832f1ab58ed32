"""The range check at the fact boundary: a fact never holds inf, nan or an absurd magnitude.

A figure out of range that the fact may lack (an optional attribute) becomes unknown and is
named, so the rest of the line is still read (PyTorch's OOM message can print an absurd "memory
in use" beside real figures); a line whose required figure is out of range is not read (the
report names it and why), so the value it states stays unknown downstream. Inside a record (server_args, vLLM's
arguments and engine config) only the entries that hold such a number are dropped, and named.
"""
from __future__ import annotations

import math
from typing import Any

MAX_GIB = float(1 << 20)  # 1 PiB: more than any device or host capdiag describes holds
MAX_MIB = MAX_GIB * 1024
MAX_NUMBER = float(1 << 53)  # counts (tokens, blocks, sizes): beyond it floats are not exact
MAX_RANK = 1 << 20  # a rank tag (TP, DP, PP, …)


class OutOfRange(ValueError):
    """A figure a fact cannot hold."""


def _limit(key: str) -> float:
    if key.endswith("_gib") or key.endswith("_gb"):
        return MAX_GIB
    if key.endswith("_mib"):
        return MAX_MIB
    return MAX_NUMBER


def in_range(value: Any, limit: float = MAX_NUMBER) -> bool:
    """Whether a value is not a number, or a finite one no larger than `limit` in magnitude."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return math.isfinite(value) and abs(value) <= limit


def _nested_ok(value: Any) -> bool:
    kind = type(value)
    if kind is str or kind is bool or value is None:  # most of a record: decided without a call
        return True
    if kind is int or kind is float:
        return in_range(value)
    if isinstance(value, (list, tuple)):
        return all(_nested_ok(v) for v in value)
    if isinstance(value, dict):
        return all(_nested_ok(k) and _nested_ok(v) for k, v in value.items())
    kwargs = getattr(value, "kwargs", None)
    if isinstance(kwargs, dict):  # a nested call repr: Name(args, k=v)
        return _nested_ok(getattr(value, "args", ())) and _nested_ok(kwargs)
    return in_range(value)


# the last results, by the identity of the values checked: a body parsed once for many lines
# (one per rank, a relaunch) hands the same values again, and a record is costly to walk
_CHECKED: dict[int, tuple[dict, frozenset, tuple[dict, list]]] = {}


def check_values(values: dict[str, Any], optional: frozenset = frozenset()) -> tuple[dict[str, Any], list[str]]:
    """The attribute values of one fact, range-checked (a new dict); and notes naming record
    entries dropped and `optional` attributes made unknown. Raises OutOfRange when one of the
    line's required figures is out of range."""
    hit = _CHECKED.get(id(values))
    if hit is not None and hit[0] is values and hit[1] == optional:
        return dict(hit[2][0]), list(hit[2][1])
    result = _check(values, optional)
    if len(_CHECKED) >= 256:
        _CHECKED.clear()
    _CHECKED[id(values)] = (values, optional, result)
    return dict(result[0]), list(result[1])


def _check(values: dict[str, Any], optional: frozenset) -> tuple[dict[str, Any], list[str]]:
    out, notes = dict(values), []
    for key, value in values.items():
        if key == "fields" and isinstance(value, dict):
            bad = [k for k, v in value.items() if not _nested_ok(v)]
            if bad:
                out[key] = {k: v for k, v in value.items() if k not in bad}
                notes.append("entries with a number out of range not read: " + ", ".join(bad[:10]))
        elif isinstance(value, dict):
            for sub, number in value.items():
                if not in_range(number, _limit(str(sub))):
                    raise OutOfRange(f"{sub}={number!r} is out of range")
        elif not in_range(value, _limit(key)):
            if key not in optional:
                raise OutOfRange(f"{key}={value!r} is out of range")
            out[key] = None
            notes.append(f"{key}={value!r} is out of range: left unknown")
    return out, notes


def rank_in_range(tags: dict[str, Any]) -> bool:
    return all(not isinstance(v, int) or 0 <= v <= MAX_RANK for v in tags.values())
