"""The one error type the CLI turns into a one-line message and exit code 2, and what is done
with a standard output that could not be written."""
import os
import sys
from typing import NoReturn


class InputError(Exception):
    """Input that cannot be analysed: missing, binary, empty, unrecognised or malformed."""


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
