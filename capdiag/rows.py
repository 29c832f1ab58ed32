"""A report's list whose rows are made when they are read, and the JSON that streams them.

A start-up over 10,000 GPUs has 10,000 per-rank rows of ~40 values each; made all at once they
are ~20 MiB that the report holds while it is written, for rows the JSON writes one after the
other and forgets. `Rows` is a read-only sequence over the rows' keys that makes a row from its
key each time one is asked for, so a row lives only as long as its reader holds it.
`iterencode` writes a report holding Rows (or Rows alone: the facts listing) as
`json.JSONEncoder(indent=2)` would write it with lists there, byte for byte, and `pieces` joins
its fragments into pieces worth a write; `plain` is the `default=` that lets `json.dumps` write
one whole.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Callable, Iterator, Union


class Rows(Sequence):
    """The rows made by `make` from each of `keys`, in order, each made again when read again."""

    def __init__(self, keys: Sequence, make: Callable[[Any], Any]):
        self._keys = keys
        self._make = make

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, at):
        if isinstance(at, slice):
            return [self._make(k) for k in self._keys[at]]
        return self._make(self._keys[at])

    def __iter__(self) -> Iterator[Any]:
        return map(self._make, self._keys)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (list, tuple, Rows)) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # a list's equality, so no hash (as a list)

    def __repr__(self) -> str:
        return f"Rows({len(self)} rows)"

    def map(self, change: Callable[[Any], Any]) -> "Rows":
        """These rows, each passed through `change` as it is made."""
        return Rows(self._keys, lambda key: change(self._make(key)))


def plain(value: Any) -> list:
    """`default=` for json.dumps: Rows written as the list they stand for."""
    if isinstance(value, Rows):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def iterencode(document: Union[dict[str, Any], Rows]) -> Iterator[str]:
    """`document` (Rows, or a dict whose values may be Rows) as JSON with an indent of 2, in
    fragments; Rows are written a row at a time. JSON holds no raw newline inside a string, so a
    value encoded on its own is placed one level deeper by indenting after each newline."""
    encoder = json.JSONEncoder(indent=2, ensure_ascii=False, default=plain)

    def deeper(value: Any, indent: str) -> Iterator[str]:
        return (fragment.replace("\n", "\n" + indent) for fragment in encoder.iterencode(value))

    def rows(value: Rows, indent: str) -> Iterator[str]:
        if not len(value):
            yield "[]"
            return
        yield "["
        for j, row in enumerate(value):
            yield ("," if j else "") + "\n" + indent + "  "
            yield from deeper(row, indent + "  ")
        yield "\n" + indent + "]"

    if isinstance(document, Rows):
        yield from rows(document, "")
        return
    if not document:
        yield "{}"
        return
    yield "{"
    for i, (key, value) in enumerate(document.items()):
        yield ("," if i else "") + "\n  " + encoder.encode(key) + ": "
        yield from rows(value, "  ") if isinstance(value, Rows) else deeper(value, "  ")
    yield "\n}"


PIECE = 1 << 16  # characters handed out at a time


def pieces(fragments: Iterator[str]) -> Iterator[str]:
    """The fragments joined into pieces of about PIECE characters (one write each)."""
    held: list[str] = []
    size = 0
    for fragment in fragments:
        held.append(fragment)
        size += len(fragment)
        if size >= PIECE:
            yield "".join(held)
            held, size = [], 0
    yield "".join(held)
