"""What stopped the start-up: the root cause of its failure."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, rule
from capdiag.failures import failure_of, framework_hint, in_framework, phase_words
from capdiag.rules._common import framework, line_ref

_READS = (F.TracebackStart, F.TracebackFrame, F.ExceptionChained, F.ExceptionIgnored, F.ExceptionRaised,
          F.ValidationDetail, F.ProcessKilled, F.OutOfMemory, F.NotEnoughMemory, F.VllmStartupError,
          F.VllmStartupMemory, F.ServerReady, F.VllmEngineReady, F.FrameworkSolution, F.Options)


def _framework_advice(kb, r) -> dict | None:
    """{line, text}: the advice the framework gives with the failure — the sentence of its error
    message that says what to try, else the `Possible solutions:` list SGLang prints after the
    error it wraps (the first list after the root line)."""
    said = framework_hint(r.text)
    if said:
        return {"line": r.exception.evidence.line, "text": said}
    after = [f for f in kb.of(F.FrameworkSolution, role=None) if f.evidence.line > r.exception.evidence.line]
    head = next((f for f in after if f.text is None), None)
    if head is None:
        return None
    by_line = {f.evidence.line: f.text for f in after if f.text is not None}
    items = []
    while by_line.get(head.evidence.line + len(items) + 1):  # the list's lines follow its head, no gap
        items.append(by_line[head.evidence.line + len(items) + 1])
    return {"line": head.evidence.line, "text": "Possible solutions: " + "; ".join(items)} if items else None


@rule("failure.root-cause", reads=_READS, concludes=("failure",))
def root_cause(kb):
    """What it concludes: `failure`: the named root cause of a failed start-up, its rank and phase.

    How: The first exception of the launch that is not a consequence of another (a parent's "Engine
    core initialization failed", a child's sigquit, a cache miss after the hub refused) nor noise
    (clean-up at exit; a request's exception the HTTP server caught while serving), named from references/failure-causes.toml; the rank that raised it and the start-up phase
    its traceback was in; the advice its own message gives (`framework_hint`: "Try increasing
    `gpu_memory_utilization` …"), shown as the framework's, not capdiag's. Absent when the log
    shows no failure.

    Example: `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 384.00 MiB.` in a
    traceback during graph capture."""
    found = failure_of(kb.of(*_READS, role=None))
    if found is None:
        return
    r, cause = found.raised, found.cause
    frame = r.innermost
    value = {"name": cause.name if cause else None, "title": cause.title if cause else None,
             "next_step": in_framework(cause.next_step, framework(kb)) if cause else None,
             "text": r.text.split("\n")[0],
             "details": [d.message for d in r.details], "phase": found.phase,
             "framework_hint": _framework_advice(kb, r),
             "phase_words": phase_words(found.phase) if found.phase else None,
             "rank": r.rank.label if r.rank.tagged else None, "process": r.process,
             "line": r.exception.evidence.line,
             "frame": None if frame is None else f"{frame.path}:{frame.lineno} in {frame.function}",
             "wording": cause.wording if cause else None,
             "consequences": [c.exception.evidence.line for c in found.consequences],
             "same_elsewhere": [o.exception.evidence.line for o in found.same_elsewhere]}
    premises = (r.exception,) + r.details + ((r.start,) if r.start else ()) + \
        tuple(c.exception for c in found.consequences)
    named = f"{cause.name} ({cause.wording['who']} {cause.wording['versions']})" if cause else \
        "an exception the catalogue does not name"
    yield Derived("failure", None, value["name"] or "unnamed", "failure.root-cause", premises,
                  f"{r.text.splitlines()[0][:160]} ({line_ref(r.exception)}) is the first exception that is not a "
                  f"consequence; it reads as {named}", detail=value)
