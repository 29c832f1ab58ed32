"""The per-user cache of built parsers and compiled templates, and when it may be trusted.

What is cached is a pickle (Lark's parser tables) or marshalled code (Jinja's bytecode): loading
it runs whatever its writer put there. So it lives only in a directory that is this user's
alone — `$CAPDIAG_CACHE_DIR`, else `$XDG_CACHE_HOME/capdiag`, else `~/.cache/capdiag` — created
mode 0700, and is used only while that directory is owned by this user and open to no one
else, and each file in it is too. Never a shared temporary directory. When no such directory
can be had, nothing is cached: everything is built afresh, with the same results.
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Callable, IO, Optional

_OPEN_TO_OTHERS = stat.S_IRWXG | stat.S_IRWXO
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def cache_dir() -> Optional[Path]:
    """The user's private cache directory (made if missing), or None when there is none to trust."""
    if not hasattr(os, "getuid"):  # no POSIX owners to check (Windows): cache nothing
        return None
    base = os.environ.get("CAPDIAG_CACHE_DIR")
    if base:
        path = Path(base)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
        path = root / "capdiag"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except (OSError, RuntimeError):  # RuntimeError: no home directory to be found
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & _OPEN_TO_OTHERS:
        return None
    return path


def trusted(fh: IO[bytes]) -> bool:
    """Whether an opened cache file is this user's and writable by no one else."""
    info = os.fstat(fh.fileno())
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & _WRITABLE_BY_OTHERS


def write_atomically(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write a cache file so that a process reading it at the same time sees all of it or none."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
