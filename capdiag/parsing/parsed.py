"""What a grammar's Transformer hands back for one line, before it is tied to its evidence."""
from __future__ import annotations

from typing import Any

import attrs

from capdiag import facts as F


@attrs.frozen
class Parsed:
    """A parsed line before it is tied to its evidence."""

    rank: F.Rank
    cls: type
    values: dict[str, Any]


def cli_option(items) -> tuple[str, str | None]:
    """A launch command's `--opt value` or `--opt=value` as (opt with underscores, value)."""
    name, _, inline = str(items[0]).lstrip("-").partition("=")
    return (name.replace("-", "_"), inline or (str(items[1]) if len(items) > 1 else None))
