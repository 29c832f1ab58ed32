"""Which rank the breakdown describes."""
from __future__ import annotations

import re

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule

_TAG = re.compile(r"(tp|pp|dp|ep)?(\d{1,7})")  # a longer index is no rank


def parse_spec(spec: str | None) -> dict[str, int] | None:
    """`3` or `tp3` → {"tp": 3}; `pp1` → {"pp": 1}; `dp1,tp0` / `dp1:tp0` → both. None if malformed."""
    if spec is None:
        return {"tp": 0}
    wanted: dict[str, int] = {}
    for part in re.split(r"[,:\s]+", spec.strip().lower()):
        match = _TAG.fullmatch(part)
        if not match:
            return None
        wanted[match.group(1) or "tp"] = int(match.group(2))
    return wanted


def _matches(rank: F.Rank, wanted: dict[str, int]) -> bool:
    values = {"tp": rank.tp_index, "pp": rank.pp or 0, "dp": rank.dp or 0, "ep": rank.ep}
    return all(values[k] == v for k, v in wanted.items())


def _label_matches(rank: F.Rank, spec: str) -> bool:
    """A process label as the log prints it (`VllmWorkerProcess pid=280`, `pid=345, ip=10.0.0.2`),
    whole or in part, blanks and case ignored."""
    if not rank.worker:
        return False
    wanted, label = (" ".join(text.lower().strip("() ").split()) for text in (spec, rank.worker))
    return bool(wanted) and re.search(r"(?<![\w.])" + re.escape(wanted) + r"(?![\w.])", label) is not None


@rule("target-rank", reads=(F.Fact,), concludes=("target_rank",))
def target_rank(kb):
    """What it concludes: `target_rank`: the rank whose memory the breakdown describes.

    How: Concludes the rank to break down: `--target-rank` as a TP index (`3`), tags (`tp3`, `pp1`,
    `dp2`, `pp1,tp0`) or a process label as the log prints it (`VllmWorkerProcess pid=280`,
    `pid=345, ip=10.42.9.225`, `RayWorkerWrapper pid=1273`); by default TP 0 of DP worker 0 and PP
    stage 0. Lines without a rank tag are TP 0's (a single-GPU run prints none). Among several
    matches the first in rank order is taken, preferring TP 0 when no TP index was asked for.

    Example: `--target-rank tp3`, or none: the untagged lines of a single-GPU run are TP 0's."""
    options = kb.first(F.Options, role=None)
    spec = options.target_rank if options else None
    wanted = parse_spec(spec)
    premises = (options,) if options and spec is not None else ()  # the default rests on no option
    ranks = {f.rank.key(): f.rank for f in kb.facts if f.evidence.line != F.INPUT_LINE
             and f.evidence.source == "log"}
    if wanted is None:
        labelled = sorted(k for k, r in ranks.items() if _label_matches(r, spec))
        if labelled:
            yield Derived("target_rank", None, labelled[0], "target-rank", premises,
                          f"{ranks[labelled[0]].worker}: the process label {spec!r} names "
                          + ("it" if len(labelled) == 1 else f"{len(labelled)} processes; the first is taken"))
            return
        workers = sorted({r.worker for r in ranks.values() if r.worker})
        yield Derived("target_rank", None, Unknown(
            f"{spec!r} is not a rank: use 3, tp3, pp1, dp2 or pp1,tp0"
            + (f", or a process label the log prints ({', '.join(workers)})" if workers else "")),
            "target-rank", premises)
        return
    match = sorted((k for k, r in ranks.items() if _matches(r, wanted)),
                   key=lambda k: (k[2] != 0 if "tp" not in wanted else 0, k))
    if match:
        yield Derived("target_rank", None, match[0], "target-rank", premises,
                      f"{ranks[match[0]].label}: the first of {len(match)} matching rank(s)")
    elif wanted == {"tp": 0}:
        yield Derived("target_rank", None, (0, 0, 0, ""), "target-rank", premises,
                      "TP0: the rank of lines without a rank tag")
    else:
        yield Derived("target_rank", None, Unknown(
            f"no rank matching {spec!r} printed a line; the log has "
            + ", ".join(sorted({r.label for r in ranks.values()}))), "target-rank", premises)
