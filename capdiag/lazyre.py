"""A regular expression compiled when first used, not when its module is imported.

Python's `re` spends a millisecond or more compiling a long pattern; a module that declares
many (the traffic scanner's, which a start-up log without traffic never uses) would make every
run pay for all of them. `LazyPattern(pattern)` stands in for `re.compile(pattern)`: the pattern
is compiled on the first call of any of its methods, which from then on are the compiled
pattern's own.
"""
from __future__ import annotations

import re
from typing import Any, Union

_DELEGATED = ("search", "match", "fullmatch", "findall", "finditer", "sub", "subn", "split", "groups", "groupindex")


class LazyPattern:
    """`re.compile(pattern, flags)`, done on first use (see the module text)."""

    def __init__(self, pattern: Union[str, bytes], flags: int = 0):
        self.pattern, self.flags = pattern, flags

    def __getattr__(self, name: str) -> Any:
        # reached only for what the instance does not hold yet: compile, and keep the compiled
        # pattern's methods on the instance, so that later calls cost what the compiled one's do
        compiled = re.compile(self.pattern, self.flags)
        for attribute in _DELEGATED:
            setattr(self, attribute, getattr(compiled, attribute))
        return getattr(compiled, name)
