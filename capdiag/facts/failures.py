"""Line kinds of a failure, both frameworks: the pieces of a Python traceback and the markers a
dying process group prints. `process` is the process that printed the line, as its prefix
names it (`EngineCore_DP0 pid=941609`, `Worker_TP1 pid=7`, SGLang's `TP3`, `DP3 TP3`); None
for a line without a prefix. capdiag/failures.py assembles them into tracebacks.
"""
from __future__ import annotations

from typing import ClassVar, Optional

from capdiag.facts.base import Fact, frozen_fact


@frozen_fact
class TracebackStart(Fact):
    """`Traceback (most recent call last):` — also after SGLang's `Scheduler hit an exception:`."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Traceback (most recent call last)",)
    process: Optional[str] = None


@frozen_fact
class TracebackFrame(Fact):
    """`File "…/model_runner.py", line 412, in initialize`: one frame of a traceback."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ('File "',)
    process: Optional[str] = None
    path: str
    lineno: int
    function: str


@frozen_fact
class ExceptionChained(Fact):
    """Python's marker between two tracebacks of one chain: `cause` for "The above exception was
    the direct cause of the following exception:", `context` for "During handling of the above
    exception, another exception occurred:"."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Exception",)
    process: Optional[str] = None
    link: str


@frozen_fact
class ExceptionIgnored(Fact):
    """`Exception ignored in: <function …__del__ …>`: the traceback after it is a clean-up's."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Exception",)
    process: Optional[str] = None


@frozen_fact
class ExceptionRaised(Fact):
    """The last line of a traceback: `pkg.ExceptionType: message` (or the bare type)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Error", "Exception", "Exit", "Interrupt", "Failure", "Timeout")
    process: Optional[str] = None
    type: str
    message: str = ""


@frozen_fact
class ValidationDetail(Fact):
    """A line an exception's reason continues on, below it: pydantic's under `ValidationError: N
    validation error for …` (`Value error, <message> [type=value_error, …]`), and the error a
    Triton `CompilationError: at L:C:` met, printed as a repr after the kernel's source
    (`ValueError("type fp8e4nv not supported in this architecture. …")`), and a kernel build's
    compiler diagnostics inside its exception's message (`…/source_location.h:8:10: fatal error:
    version: No such file or directory`, `nvcc warning : The -std=c++20 flag is not supported
    with the configured host compiler.`)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Value error,", 'Error("', "Error('", " error: ", "nvcc warning", "nvcc fatal")
    process: Optional[str] = None
    message: str


@frozen_fact
class ProcessKilled(Fact):
    """A bare `Killed` (the shell reporting SIGKILL, usually the kernel's out-of-memory killer)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("Killed",)
    process: Optional[str] = None
