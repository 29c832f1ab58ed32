"""What a grammar's Transformer hands back for one line, before it is tied to its evidence."""
from __future__ import annotations

from typing import Any, Callable, Optional

from lark import Tree
from lark.exceptions import LarkError, UnexpectedInput

from capdiag import facts as F
from capdiag.frozen import frozen


@frozen
class Parsed:
    """A parsed line before it is tied to its evidence."""

    rank: F.Rank
    cls: type
    values: dict[str, Any]
    read_to: Optional[int] = None  # the line is damaged after this column: only the text before it was read
    pid: Optional[int] = None  # the process that printed it, where its process tag names one
    host: Optional[str] = None  # the label of the outermost process tag (Evidence.host)


def parse_to_damage(parse: Callable[[str], Tree], text: str) -> Optional[tuple[Tree, Optional[int]]]:
    """The tree of a line, and None; or, for a line damaged part-way (a column cut, a paste that
    lost text), the tree of the fields before the last comma ahead of the damage and that
    column — what was cut is left unread, never guessed. None when neither parses."""
    try:
        return parse(text), None
    except UnexpectedInput as exc:
        at = getattr(exc, "pos_in_stream", None)
        cut = text.rfind(",", 0, len(text) if at is None or at < 0 else at)
    except LarkError:
        return None
    if cut <= 0:
        return None
    try:
        return parse(text[:cut]), cut
    except LarkError:
        return None


def kv_scale_fields(items) -> dict[str, str | None]:
    """The fp8 format a `kv_scale_default` line names (common.lark's KV_SCALE_DTYPE), or None
    (SGLang's names none)."""
    return {"dtype": next((str(i) for i in items if getattr(i, "type", None) == "KV_SCALE_DTYPE"), None)}


def cli_option(items) -> tuple[str, str | None]:
    """A launch command's `--opt value` or `--opt=value` as (opt with underscores, value)."""
    name, _, inline = str(items[0]).lstrip("-").partition("=")
    return (name.replace("-", "_"), inline or (str(items[1]) if len(items) > 1 else None))
