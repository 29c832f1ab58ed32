"""The one error type the CLI turns into a one-line message and exit code 2, and what is done
with a standard output that could not be written."""
import contextvars
import functools
import os
import re
import sys
from typing import Any, Callable, NoReturn, TypeVar


class InputError(Exception):
    """Input that cannot be analysed: missing, binary, empty, unrecognised or malformed."""


# A message names an option as the command line spells it (`--gpu a100: …`). Called from Python
# the same option is a parameter (`gpu='a100': …`): the CLI marks its calls, and the API's entry
# points reword what they raise for everyone else.
FROM_CLI = contextvars.ContextVar("capdiag_from_cli", default=False)
# a flag whose parameter is not its name with `_` for `-`
_PARAMETER = {"nvidia-smi-file": "nvidia_smi", "context": "contexts", "format": "fmt", "header": "headers",
              "metrics-file": "metrics_files", "workload": "workloads", "set": "settings"}
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")
_LEADING = re.compile(r"--([a-z][a-z0-9-]*) (.+?): ")


def _literal(value: str) -> bool:
    """The value as printed reads as Python already: a number, or a quoted string."""
    if len(value) > 1 and value[0] in "'\"" and value[-1] == value[0]:
        return True
    try:
        float(value)
    except ValueError:
        return False
    return True


def _parameter(flag: str) -> str:
    return _PARAMETER.get(flag, flag.replace("-", "_"))


def for_python(message: str) -> str:
    """The message with each option named as the Python API's parameter: a leading
    `--gpu a100: …` (the value refused) becomes `gpu='a100': …` (`launch=0: …` for a number),
    another `--flag` its name."""
    lead = _LEADING.match(message)
    if lead:
        value = lead.group(2)
        message = f"{_parameter(lead.group(1))}={value if _literal(value) else repr(value)}: " + message[lead.end():]
    return _FLAG.sub(lambda m: _parameter(m.group(1)), message)


F = TypeVar("F", bound=Callable[..., Any])


def python_errors(func: F) -> F:
    """An API entry point whose InputErrors name options as its parameters (unless the CLI called)."""
    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except InputError as refused:
            if FROM_CLI.get():
                raise
            raise InputError(for_python(str(refused))) from None
    return call  # type: ignore[return-value]


class ReaderGone(Exception):
    """Standard output's reader went away (a closed pipe). Not an OSError: click turns an EPIPE
    OSError into exit code 1 itself, which a CI gate would read as findings that fail it."""


def reader_gone() -> NoReturn:
    """End quietly: stdout's reader went away. 141 is the shell's code for a process whose
    reader closed the pipe (128 + SIGPIPE)."""
    quiet_stdout()
    sys.exit(141)


def output_failed(exc: OSError) -> NoReturn:
    """End with one line and exit code 2: stdout cannot take the output (a full disk, EIO)."""
    quiet_stdout()
    print(f"capdiag: error: the output cannot be written ({exc.strerror or exc})", file=sys.stderr)
    sys.exit(2)


def quiet_stdout() -> None:
    """After a failed write to stdout, point it at /dev/null so the interpreter's own flush at
    exit cannot fail again and print a traceback."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
