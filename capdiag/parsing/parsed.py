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
