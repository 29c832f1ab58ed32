"""A grammar's Lark LALR parser, loaded from the user's cache when a trusted copy is there.

Building the log grammars' parsers is most of a small log's run time; loading the built tables
is a quarter of that. A cached parser is keyed by everything that shapes it — the grammar's
text and the text of every grammar it `%import`s (grammar/common.lark), the options, the
lexer plugin below, Lark's version and Python's — so an edited grammar, an edited shared grammar
or an upgrade is never answered from an old one; the cache's trust rules are capdiag.cache's.
"""
from __future__ import annotations

import hashlib
import re
import sys

import lark
from lark import Lark
from lark.lexer import ContextualLexer
from lark.load_grammar import FromPackageLoader

from capdiag.cache import cache_dir, trusted, write_atomically

_PACKAGE = "capdiag.grammar"
# `%import .common (…)`: a grammar beside this one (Lark's own library is imported without the dot)
_LOCAL_IMPORT = re.compile(r"^%import\s+\.(\w+)", re.MULTILINE)


class _StateLexer(ContextualLexer):
    """Lark's contextual lexer, without its second try at a character no terminal of the
    parser's state matches. Lark then lexes the rest with every terminal of the grammar, only
    to name the token in its error; building that lexer compiles one expression of all the
    terminals (~18 ms for the vLLM grammar), which most lines offered to a grammar that is not
    theirs paid once a run. The error is raised at the same place either way (`pos_in_stream`,
    all capdiag.parsing reads of it): the state's own UnexpectedCharacters."""

    def lex(self, lexer_state, parser_state):
        try:
            while True:
                yield self.lexers[parser_state.position].next_token(lexer_state, parser_state)
        except EOFError:
            pass


# Lark's plugin hook for the classes it builds a parser from
_PLUGINS = {"ContextualLexer": _StateLexer}


def grammar_sources(grammar: str) -> dict[str, str]:
    """The text of grammar file `grammar` and of every grammar beside it that it imports, by name."""
    load = FromPackageLoader(_PACKAGE)
    sources: dict[str, str] = {}
    pending = [grammar]
    while pending:
        name = pending.pop()
        if name not in sources:
            sources[name] = load(None, name)[1]
            pending.extend(f"{imported}.lark" for imported in _LOCAL_IMPORT.findall(sources[name]))
    return sources


def lalr_parser(grammar: str, **options) -> Lark:
    """The LALR parser of grammar file `grammar` (capdiag/grammar) with Lark `options`."""
    sources = grammar_sources(grammar)
    key = hashlib.sha256(repr((sorted(sources.items()), sorted(options.items()), sorted(_PLUGINS), lark.__version__,
                               sys.version_info[:2])).encode())
    directory = cache_dir()
    path = directory / f"{grammar}.{key.hexdigest()[:24]}.lalr" if directory else None
    if path is not None:
        try:
            with open(path, "rb") as fh:
                if trusted(fh):
                    return Lark.load(fh)  # the plugins come back with the other options
        except Exception:  # none yet, or a damaged one: build afresh (and replace it)
            pass
    # the package loader resolves `%import .common` beside the grammar, inside a wheel too; it
    # searches nothing for an import without the dot, which stays Lark's (`%import common.INT`)
    source, text = FromPackageLoader(_PACKAGE)(None, grammar)
    parser = Lark(text, parser="lalr", source_path=source, import_paths=[FromPackageLoader(_PACKAGE, ())],
                  _plugins=_PLUGINS, **options)
    if path is not None:
        try:
            write_atomically(path, parser.save)
        except OSError:  # a full or read-only disk costs speed, not the answer
            pass
    return parser
