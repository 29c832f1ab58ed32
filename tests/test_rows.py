"""capdiag.rows: a report's per-rank rows made as they are read, and the JSON that streams them
byte for byte as json.dumps(indent=2) writes the same report with lists."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capdiag.analysis import analyse
from capdiag.printable import printable_data
from capdiag.render import render
from capdiag.report import build
from capdiag.rows import Rows, iterencode, pieces, plain
from helpers import write_log
from scale_logs import many_ranks

# JSON values as a report holds them: text with newlines, quotes, controls and non-ASCII letters,
# floats that need their repr, nesting
_SCALARS = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False) | st.text(max_size=12)
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                       max_leaves=12)


def _rows(values: list) -> Rows:
    return Rows(list(range(len(values))), values.__getitem__)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _VALUES | st.lists(_VALUES, max_size=5).map(_rows), max_size=6))
def test_streamed_json_is_json_dumps_of_the_same_report_with_lists(document):
    with_lists = {k: list(v) if isinstance(v, Rows) else v for k, v in document.items()}
    assert "".join(iterencode(document)) == json.dumps(with_lists, indent=2, ensure_ascii=False)
    assert json.dumps(document, indent=2, ensure_ascii=False, default=plain) == json.dumps(with_lists, indent=2, ensure_ascii=False)


def test_rows_are_made_each_time_they_are_read():
    made = []

    def make(key):
        made.append(key)
        return {"key": key}

    rows = Rows(["a", "b", "c"], make)
    assert made == [] and len(rows) == 3
    assert rows[1] == {"key": "b"} and rows[-1] == {"key": "c"} and rows[:2] == [{"key": "a"}, {"key": "b"}]
    first, again = list(rows), list(rows)
    assert first == again and all(x is not y for x, y in zip(first, again))
    assert rows == first and rows.map(lambda r: r["key"]) == ["a", "b", "c"]
    with pytest.raises(IndexError):
        rows[3]
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        json.dumps({"x": {1}}, default=plain)


def test_a_hostile_line_in_a_rank_row_is_made_printable(tmp_path):
    # the rank's worker name comes from the log; a control character in it is escaped in the row
    rows = printable_data({"ranks": _rows([{"label": "TP0 (Worker\x1b[2J)"}])})["ranks"]
    assert isinstance(rows, Rows) and rows[0] == {"label": "TP0 (Worker\\x1b[2J)"}


def test_a_report_of_many_ranks_streams_the_rows_it_would_list(tmp_path):
    log = write_log(tmp_path, "\n".join(many_ranks(64)) + "\n")
    report = build(analyse(log))
    assert isinstance(report["ranks"], Rows) and len(report["ranks"]) == 64
    streamed = json.loads(render(report, "json"))
    assert [r["label"] for r in streamed["ranks"]] == [f"DP{n // 8} TP{n % 8}" for n in range(64)]
    assert streamed == json.loads(json.dumps(report, default=plain))
    assert all(r["observed"]["kv_tokens"] == 415615 for r in streamed["ranks"])


@settings(max_examples=200, deadline=None)
@given(st.lists(_VALUES, max_size=6))
def test_streamed_rows_alone_are_json_dumps_of_the_list(values):
    # the facts listing: a top-level list written a row at a time, in pieces
    assert "".join(pieces(iterencode(_rows(values)))) == json.dumps(values, indent=2, ensure_ascii=False)
