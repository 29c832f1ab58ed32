"""Small frozen attrs classes that share one __repr__, __eq__ and __hash__.

attrs writes the source of an __init__, __repr__, __eq__ and __hash__ for every class it makes
and compiles it, ~1 ms a class; capdiag has ~110 such classes (~80 of them line kinds), and
that was a third of a small log's start-up. A class declared with `frozen` gets from attrs only
its __init__ (and the frozen __setattr__); the methods below are shared by all of them and give
what the ones attrs writes give: the same text, equality between instances of one class with
equal attributes, a hash of those attributes — each over the attributes attrs would use.
"""
from __future__ import annotations

import functools
import operator
from typing import Any, Callable

import attrs


@functools.cache
def _names(cls: type, use: str) -> tuple[str, ...]:
    """The attributes of `cls` that take part in `use` ("repr", "eq" or "hash"), as attrs decides."""
    return tuple(a.name for a in attrs.fields(cls) if (a.eq if use == "hash" and a.hash is None else getattr(a, use)))


@functools.cache
def _getter(cls: type, use: str) -> Callable[[Any], tuple]:
    """The values of those attributes of an instance, as one tuple."""
    names = _names(cls, use)
    if not names:
        return lambda _: ()
    get = operator.attrgetter(*names)
    return get if len(names) > 1 else lambda value: (get(value),)


def _repr(self) -> str:
    cls = type(self)
    values = ", ".join(f"{name}={value!r}" for name, value in zip(_names(cls, "repr"), _getter(cls, "repr")(self)))
    return f"{cls.__qualname__.rsplit('>.', 1)[-1]}({values})"


def _eq(self, other: object) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    values = _getter(self.__class__, "eq")
    return values(self) == values(other)


def _ne(self, other: object) -> bool:
    equal = _eq(self, other)
    return equal if equal is NotImplemented else not equal


def _hash(self) -> int:
    return hash((self.__class__, *_getter(self.__class__, "hash")(self)))


SHARED = {"__repr__": _repr, "__eq__": _eq, "__ne__": _ne, "__hash__": _hash}


def frozen(maybe_cls: type | None = None, **options: Any):
    """`attrs.frozen(**options)`, with the shared methods in place of the ones attrs would write
    (a method the class body defines itself stays, as with attrs)."""
    def wrap(cls: type) -> type:
        for name, method in SHARED.items():
            if name not in vars(cls) and getattr(cls, name, None) is not method:
                setattr(cls, name, method)
        return attrs.frozen(cls, repr=False, eq=False, **options)

    return wrap if maybe_cls is None else wrap(maybe_cls)
