"""Reading a side input (config.json, a policy, a baseline, nvidia-smi output): at most a
bounded number of bytes (a path like /dev/zero is refused, not read until memory runs out),
decoded strictly, every failure an InputError."""
from __future__ import annotations

import gzip
import json
import math
import zlib
from typing import Any

from capdiag.errors import InputError
from capdiag.parsing.literal import MAX_DEPTH  # the bound on a log record's values, for any JSON too
from capdiag.source import open_input

MIB = 1 << 20
# far above any real file of the kind: a config.json is ~1-100 KiB, a policy < 10 KiB
LIMITS = {"config.json": 16 * MIB, "policy": MIB, "baseline": 64 * MIB, "nvidia-smi": 4 * MIB,
          "safetensors index": 64 * MIB, "metrics": 64 * MIB}  # metrics: a saved scrape, as endpoints.MAX_BODY


def read_bytes(path: str, what: str) -> bytes:
    """The file's bytes (decompressed when it is a .gz); InputError when over LIMITS[what]."""
    limit = LIMITS[what]
    stream = open_input(path)
    try:
        data = stream.read(limit + 1)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"{path}: the {what} cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    finally:
        if path != "-":
            stream.close()
    if len(data) > limit:
        raise InputError(f"{path}: larger than {limit // MIB} MiB, not a {what} file")
    return data


def read_text(path: str, what: str) -> str:
    """The file as text: UTF-8 (a BOM allowed) or UTF-16 with its BOM."""
    data = read_bytes(path, what)
    try:
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            return data.decode("utf-16")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: the {what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def json_problem(value: Any) -> str | None:
    """What makes parsed JSON unusable: nesting past MAX_DEPTH (json.loads takes ~900 levels,
    more than any walk of it should recurse through) or a number that is not finite."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return "holds a number that is not finite (Infinity, NaN, 1e400)"
        if isinstance(item, (list, dict)):
            if depth >= MAX_DEPTH:
                return f"nests deeper than {MAX_DEPTH} levels"
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return None


def read_json(path: str, what: str) -> Any:
    """The file as JSON (UTF-8, -16 or -32, as JSON allows); InputError when it is not, when it
    nests past MAX_DEPTH, or holds a number that is not finite."""
    text = read_text(path, what)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, int digit limit, depth
        raise InputError(f"{path}: the {what} is not valid JSON ({str(exc)[:120]})") from None
    problem = json_problem(data)
    if problem is not None:
        raise InputError(f"{path}: the {what} {problem}")
    return data
