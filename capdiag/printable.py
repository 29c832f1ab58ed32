"""Text that came from the inputs, made safe to print in any output format.

A log line, a path or a baseline entry may hold control characters: ESC sequences that move
a terminal's cursor or set its title, CR and BS that overwrite what was printed, C1 controls,
bidirectional overrides that reorder what a reader sees, lone surrogates that no encoder
writes, and characters XML 1.0 forbids. Every one is shown as a visible escape (`\\x1b`,
`\\u202e`) instead. Newline and tab stay where the format lays them out itself in JSON (which
escapes them) and the workflow commands; in every other document — text, markdown, HTML, the
diff, the plan, the trace — a newline inside a value is shown as `\\n`, so no value from the
input starts a line of its own (a CI runner reads `::error::` at a line's start as a command,
whatever document was printed). Markup is each format's own escaping
(Jinja's autoescape, the markdown filter, the XML and JSON serialisers); this is the layer
under it, applied to the data every renderer receives and to every text written out.
"""
from __future__ import annotations

import re
from typing import Any

from capdiag.rows import Rows

# control and invisible formatting characters (newline and tab are not among them)
_CONTROLS = ("\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2069"
             "\ufeff\ufff9-\ufffb\ufffe\uffff\ud800-\udfff")
_UNSAFE = re.compile(f"[{_CONTROLS}]")
# For a plain-text report, whose every line a CI runner reads for workflow commands (`::error::`
# at a line's start): a newline inside a value from the input is shown as `\n` too, so no value
# starts a line of its own.
_UNSAFE_IN_LINE = re.compile(f"[{_CONTROLS}\n]")


def _escape(found: re.Match) -> str:
    code = ord(found.group())
    return "\\n" if code == 10 else f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, lines: bool = True) -> str:
    """`text` with every control or invisible formatting character shown as an escape (with
    `lines=False`, a newline too)."""
    unsafe = _UNSAFE if lines else _UNSAFE_IN_LINE
    return unsafe.sub(_escape, text) if unsafe.search(text) else text


def printable_data(value: Any, lines: bool = True) -> Any:
    """A report, verdict or plan (dicts, lists, tuples, strings) with every string printable
    (`lines` as for printable()). What holds nothing to escape is handed back as it is, not
    copied (a report of 10,000 ranks would be held twice)."""
    if isinstance(value, str):
        return printable(value, lines)
    if isinstance(value, dict):
        pairs = [(printable_data(k, lines), printable_data(v, lines)) for k, v in value.items()]
        same = all(k is old_k and v is old_v for (k, v), (old_k, old_v) in zip(pairs, value.items()))
        return value if same else dict(pairs)
    if isinstance(value, (list, tuple)):
        items = [printable_data(v, lines) for v in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, Rows):
        return value.map(lambda v: printable_data(v, lines))
    return value
