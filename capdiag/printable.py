"""Text that came from the inputs, made safe to print in any output format.

A log line, a path or a baseline entry may hold control characters: ESC sequences that move
a terminal's cursor or set its title, CR and BS that overwrite what was printed, C1 controls,
bidirectional overrides that reorder what a reader sees, lone surrogates that no encoder
writes, and characters XML 1.0 forbids. Every one is shown as a visible escape (`\\x1b`,
`\\u202e`) instead. Newline and tab stay: each format lays them out itself (the text report
folds them, JSON and the workflow commands escape them). Markup is each format's own escaping
(Jinja's autoescape, the markdown filter, the XML and JSON serialisers); this is the layer
under it, applied to the data every renderer receives and to every text written out.
"""
from __future__ import annotations

import re
from typing import Any

from capdiag.rows import Rows

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2069"
                     "\ufeff\ufff9-\ufffb\ufffe\uffff\ud800-\udfff]")


def _escape(found: re.Match) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control or invisible formatting character shown as an escape."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def printable_data(value: Any) -> Any:
    """A report, verdict or plan (dicts, lists, tuples, strings) with every string printable.
    What holds nothing to escape is handed back as it is, not copied (a report of 10,000 ranks
    would be held twice)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        pairs = [(printable_data(k), printable_data(v)) for k, v in value.items()]
        same = all(k is old_k and v is old_v for (k, v), (old_k, old_v) in zip(pairs, value.items()))
        return value if same else dict(pairs)
    if isinstance(value, (list, tuple)):
        items = [printable_data(v) for v in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, Rows):
        return value.map(printable_data)
    return value
