"""A grammar's Lark LALR parser, loaded from the user's cache when a trusted copy is there.

Building the log grammars' parsers is most of a small log's run time; loading the built tables
is a quarter of that. A cached parser is keyed by everything that shapes it — the grammar's
text, the options, Lark's version and Python's — so an edited grammar or an upgrade is never
answered from an old one; the cache's trust rules are capdiag.cache's.
"""
from __future__ import annotations

import hashlib
import sys

import lark
from lark import Lark

from capdiag.cache import cache_dir, trusted, write_atomically
from capdiag.resources import grammar_text


def lalr_parser(grammar: str, **options) -> Lark:
    """The LALR parser of grammar file `grammar` (capdiag/grammar) with Lark `options`."""
    text = grammar_text(grammar)
    key = hashlib.sha256(repr((text, sorted(options.items()), lark.__version__, sys.version_info[:2])).encode())
    directory = cache_dir()
    path = directory / f"{grammar}.{key.hexdigest()[:24]}.lalr" if directory else None
    if path is not None:
        try:
            with open(path, "rb") as fh:
                if trusted(fh):
                    return Lark.load(fh)
        except Exception:  # none yet, or a damaged one: build afresh (and replace it)
            pass
    parser = Lark(text, parser="lalr", **options)
    if path is not None:
        try:
            write_atomically(path, parser.save)
        except OSError:  # a full or read-only disk costs speed, not the answer
            pass
    return parser
