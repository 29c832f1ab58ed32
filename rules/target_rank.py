"""Which rank the breakdown describes."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule

@rule("target-rank")
def target_rank(kb):
    """Concludes the rank to break down: the TP index asked for (`--target-rank`, default 0),
    on DP worker 0 and PP stage 0 when the log has several. Lines without a rank tag are
    TP 0's (a single-GPU run prints none)."""
    options = kb.first(F.Options, role=None)
    wanted = options.target_rank if options else 0
    keys = sorted({f.rank.key() for f in kb.facts if f.evidence.line != F.INPUT_LINE})
    match = [k for k in keys if k[2] == wanted]
    premises = (options,) if options else ()
    if match:
        yield Derived("target_rank", None, match[0], "target-rank", premises,
                      f"TP{wanted}: the first of {len(match)} matching rank(s)")
    elif wanted == 0:
        yield Derived("target_rank", None, (0, 0, 0, ""), "target-rank", premises,
                      "TP0: the rank of lines without a rank tag")
    else:
        yield Derived("target_rank", None, Unknown(
            f"no rank with TP index {wanted} printed a memory line; the log has TP "
            + ", ".join(str(k[2]) for k in keys if k[2] < 1 << 20)), "target-rank", premises)
