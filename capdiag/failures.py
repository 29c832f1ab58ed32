"""From the traceback pieces of a launch to its root cause, named from the catalogue.

Python prints a traceback as lines (`Traceback …`, frames, `Type: message`), several
processes print theirs at once (each line keeps its process prefix; SGLang's and vLLM 0.31+'s
continuation lines have none and belong to the traceback that is open), and one failure shows
as a chain: the original exception, then those raised while handling it or because of it
(`During handling …`, `The above exception was the direct cause …`), then each parent
process reporting that its child died. The root cause is the first exception that is not
one of those consequences; references/failure-causes.toml names it.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Optional

import attrs

from capdiag import facts as F
from capdiag.frozen import frozen
from capdiag.resources import reference_toml


@frozen
class Raised:
    """One exception of a launch, with the traceback that led to it."""

    exception: F.Fact  # ExceptionRaised, ProcessKilled, or an error a framework states (_STATED)
    frames: tuple[F.TracebackFrame, ...] = ()
    start: Optional[F.TracebackStart] = None
    chain: int = 0  # exceptions of one chain share it
    link: Optional[str] = None  # how it follows the one before in its chain: "cause", "context"
    ignored: bool = False  # printed under `Exception ignored in:` (a destructor at clean-up)
    details: tuple[F.ValidationDetail, ...] = ()

    @property
    def text(self) -> str:
        """`Type: message`, and pydantic's reason lines, as the catalogue patterns read it."""
        e = self.exception
        if isinstance(e, F.ExceptionRaised):
            head = f"{e.type}: {e.message}" if e.message else e.type
        else:
            head = "Killed" if isinstance(e, F.ProcessKilled) else e.evidence.text
        return "\n".join([head] + [d.message for d in self.details])

    @property
    def process(self) -> Optional[str]:
        """The process that raised it, as its prefix names it (SGLang's continuation lines have
        none: the traceback's first line does)."""
        for f in (self.exception, self.start):
            if f is not None and getattr(f, "process", None) not in (None, "main"):
                return f.process
        return None

    @property
    def rank(self) -> F.Rank:
        tagged = [f.rank for f in (self.exception, self.start) if f is not None and f.rank.tagged]
        return tagged[0] if tagged else F.NO_RANK

    @property
    def innermost(self) -> Optional[F.TracebackFrame]:
        return self.frames[-1] if self.frames else None


@frozen
class Cause:
    """A catalogue entry: what a root cause is called and what to do about it."""

    name: str
    role: str  # "cause", "consequence", "noise"
    title: str
    next_step: str
    wording: dict  # the wording that matched (pattern, who, versions, example, source)
    generic: bool = False  # a bare status (`401 Client Error`): a later exception of its chain may name more


@frozen
class RootCause:
    raised: Raised
    cause: Optional[Cause]  # None: the exception is in no catalogue entry
    phase: Optional[str]  # from the frames (catalogue phase names), None when they name none
    consequences: tuple[Raised, ...] = ()  # what the log shows happening because of it
    same_elsewhere: tuple[Raised, ...] = ()  # the same cause raised by other processes (ranks)

    @property
    def line(self) -> F.Fact:
        return self.raised.exception


# Errors a framework states on a line of their own; without a traceback they are the exception.
_STATED = (F.OutOfMemory, F.NotEnoughMemory, F.VllmStartupError, F.VllmStartupMemory)
PIECES = (F.TracebackStart, F.TracebackFrame, F.ExceptionChained, F.ExceptionIgnored, F.ExceptionRaised,
           F.ValidationDetail, F.ProcessKilled)


def exceptions(facts: Iterable[F.Fact]) -> list[Raised]:
    """Every exception the facts show, in line order, each with its traceback and chain; an
    error a framework states without a traceback (vLLM V0's `The model's max seq len …`) counts
    as one."""
    facts = list(facts)
    raised_at = {f.evidence.line for f in facts if isinstance(f, F.ExceptionRaised)}
    open_: dict[Optional[str], dict] = {}  # process -> the traceback being read
    pending: dict[Optional[str], dict] = {}  # process -> link / ignored for its next traceback
    last: dict[Optional[str], int] = {}  # process -> index of its last exception
    out: list[Raised] = []
    current: Optional[str] = None  # the process whose traceback an unprefixed line continues
    recent: Optional[str] = None  # the process of the last exception: an unprefixed chain marker's
    chains = 0
    for fact in facts:
        if isinstance(fact, _STATED) and fact.evidence.line not in raised_at and _is_error(fact):
            chains += 1
            out.append(Raised(fact, chain=chains))
            continue
        if not isinstance(fact, PIECES):
            continue
        process = fact.process
        if process is None:
            if current in open_:
                process = current
            elif isinstance(fact, (F.ExceptionChained, F.ValidationDetail)) or \
                    (recent in pending and "link" in pending[recent]):
                process = recent  # an unprefixed reason line continues the last exception, whoever raised it
        if isinstance(fact, F.TracebackStart):
            open_[process] = {"start": fact, "frames": [], **pending.pop(process, {})}
            current = process
        elif isinstance(fact, F.TracebackFrame):
            if process in open_:
                open_[process]["frames"].append(fact)
                current = process
        elif isinstance(fact, F.ExceptionChained):
            pending[process] = {**pending.get(process, {}), "link": fact.link}
            open_.pop(process, None)
        elif isinstance(fact, F.ExceptionIgnored):
            pending[process] = {"ignored": True}
            open_.pop(process, None)
        elif isinstance(fact, F.ValidationDetail):
            index = last.get(process)
            if index is not None:
                out[index] = attrs.evolve(out[index], details=out[index].details + (fact,))
        else:
            block = open_.pop(process, None) or pending.pop(process, {})
            if not block and isinstance(fact, F.ExceptionRaised) and not fact.message:
                continue  # `Error:` alone, outside any traceback: a paste's heading, no exception
            link = block.get("link")
            if link is None or process not in last:
                chains += 1
            chain = out[last[process]].chain if link is not None and process in last else chains
            out.append(Raised(fact, tuple(block.get("frames", ())), block.get("start"), chain, link,
                              bool(block.get("ignored")) or bool(_BELOW_ERROR.match(fact.evidence.text))))
            last[process] = len(out) - 1
            recent = process
            if current == process:
                current = None
    return out


# A traceback a logger printed below ERROR (vLLM's `WARNING 06-23 15:43:18 [import_utils.py:408]`
# in front of every line): the process caught the exception, said so, and went on.
_BELOW_ERROR = re.compile(r"^(?:\([^)]*pid=\d+[^)]*\)\s*)*(?:WARNING|INFO|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d")


def _is_error(fact: F.Fact) -> bool:
    if isinstance(fact, F.VllmStartupError):
        return fact.reason != "engine-failed"
    return not isinstance(fact, F.VllmStartupMemory) or fact.error


@lru_cache(maxsize=1)
def catalogue() -> tuple[list[Cause], list[tuple[str, str, frozenset]]]:
    """The causes, in matching order, and the phases (name, words, functions) in start-up order."""
    data = reference_toml("failure-causes.toml")
    causes = [Cause(c["name"], c["role"], c["title"], c["next_step"], w, c.get("generic", False))
              for c in data["cause"] for w in c["wording"]]
    phases = [(p["name"], p["words"], frozenset(p["functions"])) for p in data["phase"]]
    return causes, phases


def in_framework(next_step: str, framework: Optional[str]) -> str:
    """A catalogue next step with each `{name}` in the framework's own spelling ([flags]); both
    spellings where the framework is not known."""
    flags = reference_toml("failure-causes.toml").get("flags", {})

    def spelled(found: re.Match) -> str:
        names = flags.get(found.group(1))
        if names is None:
            return found.group(0)
        return names[framework] if framework in names else " / ".join(names[k] for k in sorted(names))
    return re.sub(r"\{(\w+)\}", spelled, next_step)


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern, re.IGNORECASE | re.MULTILINE)


def classify(r: Raised) -> Optional[Cause]:
    """The first catalogue wording an exception matches (by its text, its frames' files and
    functions — `path in function`, one frame a line — or both)."""
    return _classified(r.text, "\n".join(f"{f.path} in {f.function}" for f in r.frames))


# many exceptions of a log share their text and frames (a failure every rank reports, a
# request failing again and again): each is matched against the catalogue once
@lru_cache(maxsize=1024)
def _classified(text: str, paths: str) -> Optional[Cause]:
    for cause in catalogue()[0]:
        w = cause.wording  # every test a wording gives must hold: its text pattern, its frames' files
        if ("pattern" in w or "frames" in w) \
                and ("pattern" not in w or _compiled(w["pattern"]).search(text)) \
                and ("frames" not in w or paths and _compiled(w["frames"]).search(paths)):
            return cause
    return None


def phase_of(r: Raised) -> Optional[str]:
    """The latest start-up phase the traceback's frames name (None: they name none)."""
    phases = catalogue()[1]
    named = {f.function for f in r.frames}
    found = [i for i, (_, _, functions) in enumerate(phases) if named & functions]
    return phases[max(found)][0] if found else None


# The sentence of an error message in which the framework says what to change: vLLM's "Try
# increasing `gpu_memory_utilization` or decreasing `max_model_len` …", "Decrease GPU memory
# utilization or reduce GPU memory used by other processes.", SGLang's "Please try to increase
# --mem-fraction-static." (a sentence ends at a period followed by a space or the end)
_HINT = re.compile(r"(?:^|(?<=[.!:] ))((?:Please )?(?:[Tt]ry|[Cc]onsider|[Yy]ou (?:can|may|might) (?:also )?(?:want to )?try|"
                   r"Decrease|Increase|Reduce|Lower)\b(?:[^.!]|\.(?=\S))*[.!]?)")


def framework_hint(text: str) -> Optional[str]:
    """The advice a framework's own error message gives, as it words it, or None."""
    found = _HINT.search(text.replace("\n", " "))
    return found.group(1).strip() if found else None


def phase_words(name: str) -> str:
    return next((words for n, words, _ in catalogue()[1] if n == name), name.replace("_", " "))


def root_cause(facts: Iterable[F.Fact]) -> Optional[RootCause]:
    """The first exception of the launch that is neither a consequence nor clean-up noise.

    Within a chain, Python prints the original first; across processes, the child's error comes
    before its parent's report of it. An exception the catalogue does not know counts as a
    cause (it is what the traceback says went wrong), unnamed.
    """
    facts = list(facts)
    raised = [r for r in exceptions(facts) if not r.ignored]
    # an error a framework states on a line of its own comes after the exceptions: vLLM 0.16+
    # prints `Failed to load model - not enough GPU memory …` before the traceback that raised it
    # (an out-of-memory line of its own is no summary: a C++ allocator's log line is the event)
    first = (*PIECES, F.OutOfMemory)
    # a bare `Type: message` line with no traceback above it is a library's noise more often than
    # the failure (protobuf's `AttributeError: 'MessageFactory' object has no attribute
    # 'GetPrototype'`, printed once a worker by TensorFlow's import): it is the cause only when no
    # exception with a traceback is in the log
    framed = {f.evidence.line for f in facts if isinstance(f, F.TracebackFrame)}
    bare = [r for r in raised if isinstance(r.exception, F.ExceptionRaised) and r.start is None and not r.frames
            and not framed & set(range(r.exception.evidence.line - 4, r.exception.evidence.line))]
    raised = [r for r in raised if r not in bare]
    raised = [r for r in raised if isinstance(r.exception, first)] + \
        [r for r in raised if not isinstance(r.exception, first)] + bare
    roles = [(r, classify(r)) for r in raised]
    for at, (r, cause) in enumerate(roles):
        if cause is not None and cause.role != "cause":
            continue
        # raised while handling a consequence (`During handling of the above exception, another
        # exception occurred` after a KeyboardInterrupt): a consequence too, unless it names a cause
        if cause is None and r.link == "context" and any(
                o.chain == r.chain and c is not None and c.role == "consequence" for o, c in roles[:at]):
            continue
        if cause is None or cause.generic:  # a later exception of the same chain may say more
            cause = next((c for o, c in roles if o.chain == r.chain and c is not None and c.role == "cause"
                          and not c.generic), cause)
        consequences = tuple(o for o, c in roles if o is not r and c is not None and c.role == "consequence")
        same = tuple(o for o, c in roles if o is not r and o.process != r.process and
                     (c == cause if cause is not None else o.text == r.text))
        said = cause.wording.get("phase") if cause is not None else None  # the wording names its phase
        phase = phase_of(r) or said
        if phase is None and cause is not None:
            # the same failure re-raised further down (SGLang wraps a capture OOM in `Capture cuda
            # graph failed: …`) may say where it was when the first raise's frames do not
            phase = next((phase_of(o) or c.wording.get("phase") for o, c in roles[at + 1:]
                          if c is not None and c.name == cause.name and o.process == r.process
                          and (phase_of(o) or c.wording.get("phase"))), None)
        return RootCause(r, cause, phase, consequences, same)
    return None


def failure_of(facts: Iterable[F.Fact]) -> Optional[RootCause]:
    """The root cause of a launch's failure; for a launch that became ready, of a failure
    after its ready line (an exception caught and logged during start-up did not stop it)."""
    facts = list(facts)
    ready = [f.evidence.line for f in facts if isinstance(f, (F.ServerReady, F.VllmEngineReady))]
    return root_cause(f for f in facts if not ready or f.evidence.line > ready[-1])
