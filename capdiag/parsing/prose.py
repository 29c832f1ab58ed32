"""Numbers inside sentences (PyTorch's OOM message, vLLM's start-up memory report), each named
by the words before or after it. The grammars tokenize; this module reads the phrases."""
from __future__ import annotations

from typing import Any, Iterable, Optional

from lark import Token

_TO_MIB = {"GiB": 1024.0, "GB": 1024.0, "MiB": 1.0, "MB": 1.0, "KiB": 1 / 1024, "KB": 1 / 1024,
           "bytes": 1 / (1 << 20)}


def split_quantity(text: str) -> tuple[float, Optional[str]]:
    text = text.replace(" ", "")
    for unit in sorted(_TO_MIB, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[: -len(unit)]), unit
    return float(text), None


def convert(value: float, unit: Optional[str], wanted: str) -> float:
    """A figure in the unit a report key names (`_mib` or `_gib`); unchanged when it already is."""
    if unit is None or unit == wanted or (unit, wanted) in (("GB", "GiB"), ("MB", "MiB")):
        return value
    return round(value * _TO_MIB[unit] / _TO_MIB[wanted], 4)


def named_quantities(tokens: Iterable[Token], number_type: str, before: tuple,
                     after: tuple) -> dict[str, tuple[float, Optional[str]]]:
    """Name each number by the phrase that ends just before it or starts just after it, as
    (number, the unit printed with it).

    `before`/`after` are (phrase, key) pairs tried in order; the first key found wins and a
    key is filled once.
    """
    tokens = list(tokens)
    values: dict[str, tuple[float, Optional[str]]] = {}
    for i, tok in enumerate(tokens):
        if tok.type != number_type:
            continue
        prev = str(tokens[i - 1]).strip(" ,.;(`=").lower() if i else ""
        nxt = str(tokens[i + 1]).strip(" ,.;)`").lower() if i + 1 < len(tokens) else ""
        key = next((k for phrase, k in before if prev.endswith(phrase) and k not in values), None)
        key = key or next((k for phrase, k in after if nxt.startswith(phrase) and k not in values), None)
        if key is not None:
            values[key] = split_quantity(str(tok))
    return values


def name_numbers(tokens: Iterable[Token], number_type: str, before: tuple, after: tuple,
                 units: dict[str, str]) -> dict[str, Any]:
    """`named_quantities`, each figure in its key's unit: `units` gives it ("GiB", "MiB" or ""
    for a plain number)."""
    return {key: convert(number, unit, units[key]) if units.get(key) else number
            for key, (number, unit) in named_quantities(tokens, number_type, before, after).items()}


def numbers_after(tokens: Iterable[Token], number_type: str, phrases: tuple[str, ...]) -> list[float]:
    """The plain numbers, in order, that each follow one of `phrases` (the text just before the
    number ends with it)."""
    tokens = list(tokens)
    return [float(str(t)) for prev, t in zip(tokens, tokens[1:])
            if t.type == number_type and str(prev).rstrip().endswith(phrases)]


# PyTorch's out-of-memory message, both wordings (2.x and 1.x).
OOM_BEFORE = (("tried to allocate", "tried_to_allocate_mib"), ("total capacity of", "total_capacity_gib"),
              ("of which", "free_mib"), ("process has", "process_in_use_gib"),
              ("of the allocated memory", "allocated_by_pytorch_gib"))
OOM_AFTER = (("is reserved by pytorch but unallocated", "reserved_unallocated_mib"),
             ("total capacity", "total_capacity_gib"), ("free", "free_mib"),
             ("already allocated", "allocated_by_pytorch_gib"))


def read_oom_message(tokens: Iterable[Token]) -> dict[str, Any]:
    tokens = list(tokens)
    values = name_numbers(tokens, "QTY", OOM_BEFORE, OOM_AFTER,
                          {k: ("MiB" if k.endswith("_mib") else "GiB") for _, k in OOM_BEFORE + OOM_AFTER})
    gpu = next((t for t in tokens if t.type == "GPU_INDEX"), None)
    if gpu is not None:
        values["gpu"] = int(str(gpu).split()[1])
    return values


def capability(text: str) -> dict[str, int]:
    """A compute capability as `8.0`, or as the `sm` digits a path carries (`121` is 12.1, `90`
    is 9.0: the last digit is the minor version)."""
    if "." in text:
        major, minor = text.split(".", 1)
        return {"major": int(major), "minor": int(minor)}
    return {"major": int(text[:-1]), "minor": int(text[-1])}
