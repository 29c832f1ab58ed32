from __future__ import annotations

import re

from capdiag.engine import Parts, rule

# Causes whose next step needs the log's figures: their own finding computes it.
_FIGURED = {"cuda-out-of-memory": "out-of-memory", "kv-cache-no-room": "out-of-memory",
            "moe-experts-unquantized": "out-of-memory", "gpu-memory-held": "utilization-too-high",
            "kv-cache-below-max-model-len": "context-exceeds-kv"}


QUOTE = 300  # characters of an exception's text the message quotes


def _cut(text: str) -> str:
    """At most QUOTE characters, ending on a word (never inside a figure: `1.23 GiB` is not cut to
    `1.`), with an ellipsis when cut; no trailing full stop (the message adds its own)."""
    if len(text) <= QUOTE:
        return text.rstrip(".")
    cut = text[:QUOTE].rsplit(" ", 1)[0].rstrip(".,;:")
    return cut + " …"


# exceptions that say the program itself is wrong, not its input or its environment
_CODE_ERRORS = frozenset({"AttributeError", "NameError", "UnboundLocalError", "KeyError", "IndexError"})


@rule("startup-failed", code="CD125", severity="error",
      reads=("failure", "phase?", "finding:out-of-memory?", "finding:utilization-too-high?",
             "finding:weights-exceed-budget?", "finding:context-exceeds-kv?"))
def startup_failed(kb):
    """What it checks: the start-up failed with an exception, and which one is the root cause —
    the first that is not a consequence of another. A worker's `ValueError` is the cause; the
    engine core's "Engine core initialization failed. See root cause above", "WorkerProc failed
    to start", SGLang's "Received sigquit from a child process", a `LocalEntryNotFoundError`
    after the hub answered 403 are consequences and are never named as the cause.

    Why it matters: the last error printed is usually a parent process reporting that a child
    died; the line that says what went wrong is further up, often in another process's output
    interleaved with the rest.

    Example: `(Worker_TP1 pid=7) ERROR … [multiproc_executor.py:857] AssertionError: 151936 is not
    divisible by 5` followed by `RuntimeError: Engine core initialization failed.`.

    What to do: the next step of the named cause (references/failure-causes.toml holds every
    cause with each wording, by version). An exception the catalogue does not name is cited
    with its innermost frame: likely a bug or an incompatibility of this release. A failure that
    a finding with the log's figures names (out of memory, utilization above what is free) is
    that finding alone: one failure, one answer. A launch that printed its ready line and then
    died is said to have failed after it was ready, not at start-up.
    """
    failure = kb.get("failure")
    if failure is None:
        return
    v = failure.detail
    where = f" during {v['phase_words']}" if v["phase_words"] else ""
    who = f" on {v['rank']}" if v["rank"] else (f" in {v['process']}" if v["process"] else "")
    reason = "; ".join(d.split(" [type=")[0] for d in v["details"])
    quoted = _cut(v["text"]) + (f" — {_cut(reason)}" if reason else "")
    after = (f" The errors at line(s) {', '.join(str(n) for n in v['consequences'][:6])} are consequences of it."
             if v["consequences"] else "")
    if v["same_elsewhere"]:
        after = (f" {len(v['same_elsewhere'])} other process(es) raise the same (line(s) "
                 f"{', '.join(str(n) for n in v['same_elsewhere'][:6])}).") + after
    specific = kb.get("finding", _FIGURED[v["name"]]) if v["name"] in _FIGURED else None
    weights = kb.get("finding", "weights-exceed-budget")
    if specific is not None:  # one failure, one finding: the one with the figures says it
        return
    if weights is not None and v["name"] in ("kv-cache-no-room", None):
        action = weights.action
    elif v["next_step"]:
        action = v["next_step"]
    elif v["frame"] and re.search(r"/(?:sglang|vllm|sgl_kernel)/", v["frame"]) and \
            v["text"].split(":")[0].rsplit(".", 1)[-1] in _CODE_ERRORS:
        # an error of the program itself (a name or attribute that is not there), raised in the
        # framework's own file: a bug of this release, which a newer one usually fixes
        action = (f"This is a bug in the framework's own code (the innermost frame, {v['frame']}, raises "
                  f"{v['text'].split(':')[0]}): upgrade to a newer release, where it is usually fixed, or search "
                  "the framework's issues for the message; no setting of this launch avoids it.")
    else:
        action = (f"Read the traceback ending at line {v['line']}"
                  + (f" (innermost frame {v['frame']})" if v["frame"] else "")
                  + ": it is no known configuration cause — likely a bug or an incompatibility of this release "
                    "with the model or GPU; search the framework's issues for the message.")
    # a launch that printed its ready line and then died: the server failed while serving
    served = kb.value("phase") == "ready"
    what = "The server failed after it was ready" if served else "Start-up failed"
    title = v["title"] or f"{what}: {v['text'].split(':')[0][:80]}"
    # the figures behind the action come from the weights finding: its premises, not the finding
    figures = tuple(weights.premises) if weights is not None else ()
    yield Parts((failure,) + figures,
                title=title,
                message=f"{what}{where}{who}. Root cause (line {v['line']}): {quoted}.{after}",
                action=action,
                detail={"cause": v["name"], "phase": v["phase"], "line": v["line"], "rank": v["rank"]})
