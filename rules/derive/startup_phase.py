"""How far the start-up got."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, rule
from capdiag.rules._common import line_ref


@rule("startup.phase",
      reads=(F.Fact,),
      concludes=("phase",))
def phase(kb):
    """What it concludes: `phase`: the last start-up phase the launch reached, and the line that shows
    it.

    How: The last start-up phase the launch reached (init, weights, KV pool, graph capture, ready),
    and the last line that shows it.

    A log of request traffic alone (an excerpt pasted from a running server's log, no start-up
    line in it) is `ready`, shown by its first traffic line: a server prints traffic only once
    it serves.

    Example: `Capture cuda graph begin.` as the last phase line: `graph_capture`."""
    staged = [f for f in kb.facts if f.PHASE]
    served = min(kb.of(F.TrafficSummary, role=None), key=lambda f: f.evidence.line, default=None)
    if not staged and served is not None:
        yield Derived("phase", None, "ready", "startup.phase", (served,),
                      f"no start-up line in the log; its request traffic ({line_ref(served)}) shows a server serving",
                      {"traffic_only": True})
        return
    if not staged:
        yield Derived("phase", None, "init", "startup.phase", (), "no start-up phase line in the log")
        return
    best = max(F.PHASES.index(f.PHASE) for f in staged)
    last = [f for f in staged if F.PHASES.index(f.PHASE) == best][-1]
    yield Derived("phase", None, F.PHASES[best], "startup.phase", (last,),
                  f"{type(last).__name__} ({line_ref(last)}) is the furthest phase line")
