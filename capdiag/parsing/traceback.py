"""Traceback and dying-process lines → facts, through grammar/traceback.lark (both frameworks)."""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Optional

from lark import Lark, Token, Transformer
from lark.exceptions import LarkError

from capdiag import facts as F
from capdiag.parsing.parsed import Parsed
from capdiag.parsing.process_tag import read_tag
from capdiag.parsing.lalr import lalr_parser

class _Lines(Transformer):
    def header(self, items):
        """(process label, rank, pid): the innermost vLLM/Ray tag, or SGLang's rank tags (`main`
        for SGLang's main process, whose prefix carries none; SGLang prints no pid)."""
        tags = [str(t) for t in items if isinstance(t, Token) and t.type == "PROC_TAG"]
        if tags:
            tag = read_tag(tags[-1])
            return tag.label, tag.rank, tag.pid
        found = next((i for i in items if isinstance(i, list)), None)  # the SGLang prefix's tags
        if found is None:
            return None, F.NO_RANK, None
        if not found:
            return "main", F.NO_RANK, None
        rank = F.Rank(**{k.lower(): int(v) for k, v in found})
        return " ".join(k + v for k, v in found), rank, None

    def sg_prefix(self, items):
        return [i for i in items if isinstance(i, tuple)]

    def sg_tag(self, items):
        return str(items[0]), str(items[1])

    def level_part(self, _):
        return None

    def tb_start(self, _):
        return F.TracebackStart, {}

    def frame(self, items):
        return F.TracebackFrame, {"path": str(items[0])[1:-1], "lineno": int(items[1]),
                                  "function": str(items[2]).rstrip(")")}

    def chain_cause(self, _):
        return F.ExceptionChained, {"link": "cause"}

    def chain_context(self, _):
        return F.ExceptionChained, {"link": "context"}

    def ignored(self, _):
        return F.ExceptionIgnored, {}

    def sigquit(self, _):
        return F.ChildFailed, {}

    def killed(self, _):
        return F.ProcessKilled, {}

    def device_abort(self, items):
        kind, _, message = str(items[-1]).strip().partition(": ")
        return F.ExceptionRaised, {"type": kind.strip(), "message": message.strip()}

    def value_error(self, items):
        return F.ValidationDetail, {"message": str(items[-1]).strip()}

    def compiler_diag(self, items):
        return F.ValidationDetail, {"message": str(items[0]).strip()}

    def inner_error(self, items):
        kind, _, quoted = str(items[0]).partition("(")
        return F.ValidationDetail, {"message": f"{kind}: {quoted[1:-2]}"}

    def raised(self, items):
        rest = str(items[2]).strip() if len(items) > 2 else ""
        return F.ExceptionRaised, {"type": str(items[0]), "message": rest}

    def start(self, items):
        body = items[-1]
        process, rank, pid = items[0] if len(items) > 1 and isinstance(items[0], tuple) else (None, F.NO_RANK, None)
        cls, values = body
        return Parsed(rank, cls, {"process": process, **values}, pid=pid)


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return lalr_parser("traceback.lark", lexer="contextual")


_GAP = r"[ \t]*"  # the grammar's %ignore: blanks between tokens, or none


def _alternatives(patterns) -> str:
    return "(?:" + "|".join(f"(?:{p})" for p in patterns) + ")"


def _rule_pattern(name: str, rules, terms: dict[str, str]) -> str:
    """A regular expression for what grammar rule `name` reads, from its expansions as Lark
    compiled them: an optional part is an expansion without it, and `x+`/`x*` a helper rule
    that repeats itself on the left (`h: x | h x`), read as `x (x)*`. (No rule the header uses
    recurses otherwise.)"""
    expansions = [r.expansion for r in rules if r.origin.name == name]

    def sequence(symbols) -> str:
        return _GAP.join(f"(?:{terms[s.name]})" if s.is_term else _rule_pattern(s.name, rules, terms)
                         for s in symbols)
    once = [e for e in expansions if not e or e[0].name != name]
    again = [e[1:] for e in expansions if e and e[0].name == name]
    pattern = _alternatives(sequence(e) for e in once)
    return pattern + (f"(?:{_GAP}{_alternatives(sequence(e) for e in again)})*" if again else "")


@lru_cache(maxsize=1)
def _shape() -> re.Pattern:
    """The shape every line the grammar reads has, as one regular expression built from the
    grammar itself: `start: header? body`, the header's rule read into a pattern of its
    terminals, the body opening with a terminal the parse table accepts after a header. A line
    a parse would accept always matches it (each token matches its terminal, blanks between
    them are the ignored `[ \t]*`), so a line that does not is no traceback piece and never
    reaches the parser, whose failing on a line costs ~50 times this match (a million warnings
    that name an exception or a timeout, as a server under a failing client prints for hours)."""
    parser = _parser()
    terms = {t.name: t.pattern.to_regexp() for t in parser.terminals}
    table = parser.parser.parser.parser.parse_table
    after_header = table.states[table.start_states["start"]]["header"][1]
    body = _alternatives(terms[name] for name in table.states[after_header] if name in terms)
    header = _rule_pattern("header", parser.rules, terms)
    return re.compile(f"{_GAP}(?:{header}{_GAP})?{body}")


# a traceback repeated (the same failing request, each rank printing the same frames) repeats
# its lines word for word where they carry no prefix (SGLang, uvicorn): parsed once
@lru_cache(maxsize=1024)
def parse_traceback_line(text: str) -> Optional[Parsed]:
    """The traceback piece a line is, or None."""
    if _shape().match(text) is None:
        return None
    try:
        return _Lines().transform(_parser().parse(text))
    except LarkError:
        return None
