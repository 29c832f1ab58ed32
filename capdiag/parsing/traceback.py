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

    def value_error(self, items):
        return F.ValidationDetail, {"message": str(items[-1]).strip()}

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


def _alternatives(names) -> str:
    return "|".join(f"(?:{n})" for n in names)


@lru_cache(maxsize=1)
def _shape() -> re.Pattern:
    """The shape every line the grammar reads has, as one regular expression built from the
    grammar's own terminals: `start: header? body`, the header as the grammar spells it, the
    body opening with a terminal the parse table accepts after a header. A line a parse would
    accept always matches it (each token matches its terminal, blanks between them are the
    ignored `[ \t]*`), so a line that does not is no traceback piece and never reaches the
    parser, whose failing on a line costs ~50 times this match (a million warnings that name
    an exception or a timeout, as a server under a failing client prints for hours)."""
    parser = _parser()
    term = {t.name: t.pattern.to_regexp() for t in parser.terminals}
    table = parser.parser.parser.parser.parse_table
    after_header = table.states[table.start_states["start"]]["header"][1]
    body = _alternatives(term[name] for name in table.states[after_header] if name in term)
    gap = r"[ \t]*"
    level = f"(?:{term['LEVEL']}(?:{gap}{term['STAMP']})?(?:{gap}{term['LOC']})?|{term['STAMP']}(?:{gap}{term['LOC']})?)"
    header = (f"(?:{term['PROC_TAG']}(?:{gap}{term['PROC_TAG']})*(?:{gap}{level})?|{level}"
              f"|{term['SG_PREFIX']}(?:{gap}{term['SG_ORIGIN']})?)")
    return re.compile(f"{gap}(?:{header}{gap})?(?:{body})")


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
