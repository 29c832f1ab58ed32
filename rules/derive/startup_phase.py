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

    Example: `Capture cuda graph begin.` as the last phase line: `graph_capture`."""
    staged = [f for f in kb.facts if f.PHASE]
    if not staged:
        yield Derived("phase", None, "init", "startup.phase", (), "no start-up phase line in the log")
        return
    best = max(F.PHASES.index(f.PHASE) for f in staged)
    last = [f for f in staged if F.PHASES.index(f.PHASE) == best][-1]
    yield Derived("phase", None, F.PHASES[best], "startup.phase", (last,),
                  f"{type(last).__name__} ({line_ref(last)}) is the furthest phase line")
