from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.failures import classify, exceptions, in_framework
from capdiag.rules._common import framework, line_ref

_PHASE_WORDS = {"init": "process start-up", "weights": "weight loading", "kv_pool": "KV pool allocation",
                "graph_capture": "CUDA graph capture", "ready": "ready"}


@rule("startup-incomplete", code="CD101", severity="warning",
      reads=(F.Fact, "phase?", "failure?"))  # the last line of the log, whatever its kind
def startup_incomplete(kb):
    """What it checks: the launch never reaches its ready line (SGLang: "The server is fired up and
    ready to roll!"; vLLM: "Application startup complete." or the engine's `init engine … took`).

    Why it matters: a start-up that stops early leaves later figures (KV pool, graphs, final
    free memory) unprinted, so the breakdown is partial. A scheduler exception makes it an
    error; an excerpt that simply ends is a warning; a log that finished its memory set-up
    (SGLang's `max_total_num_tokens` line, vLLM's KV cache size) but shows no ready line — a benchmark tool, or a paste
    that stops there — is information.

    Example: `[… TP3] Scheduler hit an exception: Traceback …` after `Capture cuda graph begin`.

    A failure whose root cause the log shows is named by `startup-failed` instead; this rule
    then stays quiet. When the log shows only consequences (a parent reporting that a child
    died), it says so: the root cause was printed elsewhere; where the catalogue names the
    consequence (SIGTERM from outside, a parent stopping its children), its title and next step
    are the finding's.

    What to do: read the traceback at the cited line; the breakdown covers what was printed
    before it. Out-of-memory failures get their own finding (`out-of-memory`).
    """
    phase = kb.get("phase")
    # ready without a ready line: the log is request traffic alone (startup.phase)
    if (kb.of(F.ServerReady, F.VllmEngineReady, role=None) or kb.get("failure") is not None
            or (phase is not None and phase.value == "ready")):
        return
    reached = phase.value if phase is not None else "init"
    crash = next(iter(kb.of(F.SchedulerException, F.VllmStartupError, F.ChildFailed, role=None)), None)
    consequence = next(((r.exception, classify(r)) for r in exceptions(kb.facts) if not r.ignored
                        and getattr(classify(r), "role", None) == "consequence"), (None, None))
    crash = crash or consequence[0]
    # what the consequence is, where the catalogue knows it (a signal from outside, a parent
    # stopping its children): its own title and next step say more than "printed elsewhere"
    known = consequence[1] if consequence[0] is crash else None
    oom = kb.of(F.OutOfMemory, F.NotEnoughMemory, role=None)
    budget = next(iter(kb.of(F.TokenBudget, F.VllmKVCacheSize, F.VllmGpuBlocks, role=None)), None)
    last = max(kb.facts, key=lambda f: f.evidence.line, default=None)
    action = "Figures after this point are not in the log; the breakdown covers what was printed."
    if known is not None:
        severity, title = "error", f"Start-up stopped during {_PHASE_WORDS[reached]}"
        message = (f"{known.title} ({line_ref(crash)}); the last phase reached is {_PHASE_WORDS[reached]}. "
                   "The log holds no error of the server's own before it.")
        action = in_framework(known.next_step, framework(kb))
        premises = (crash, phase) + tuple(oom)
    elif crash is not None:
        severity, title = "error", f"Start-up crashed during {_PHASE_WORDS[reached]}"
        message = (f"{'A scheduler' if isinstance(crash, F.SchedulerException) else 'A'} process failed "
                   f"({line_ref(crash)}); the last phase reached is {_PHASE_WORDS[reached]}. The log shows only "
                   "consequences of the failure (a process reporting that another one died), not its root cause: "
                   "it was printed elsewhere (the failing process's own output).")
        premises = (crash, phase) + tuple(oom)
    elif budget is not None:
        severity, title = "info", "The log ends after memory set-up, before a ready line"
        message = (f"Memory set-up finished (the KV pool was sized, {line_ref(budget)}) but no ready line "
                   "follows: a benchmark tool or an excerpt.")
        premises = (phase, budget)
    else:
        severity = "error" if oom else "warning"
        title = f"Start-up stops during {_PHASE_WORDS[reached]}"
        message = (f"The log ends without a ready line; the last phase reached is {_PHASE_WORDS[reached]}"
                   + (f", last memory line at {line_ref(last)}." if last is not None else "."))
        premises = (phase,) + tuple(oom) + ((last,) if last is not None else ())
    yield Parts(premises,
                title=title,
                message=message,
                action=action,
                value=reached,
                severity=severity)
