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


# Every body the grammar reads holds one of these words (its terminals spell them so, case
# and all): a line without any is no traceback piece, and is not handed to the parser, whose
# failing on a line costs ~50 times this search.
_BODY_WORD = re.compile(r"Traceback|File|xception|Error|Exit|Interrupt|Failure|Timeout|sigquit|Killed|Value error")


def parse_traceback_line(text: str) -> Optional[Parsed]:
    """The traceback piece a line is, or None."""
    if _BODY_WORD.search(text) is None:
        return None
    try:
        return _Lines().transform(_parser().parse(text))
    except LarkError:
        return None
