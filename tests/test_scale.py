"""Work and memory linear in the input (issue 14), checked by structure and counts, not by
timing: lines that differ only in their rank tag share one parse; a line with no traceback
word never reaches the traceback parser; a launch's facts are let go once another is the one
to analyse, and so is its traffic; the JSON report is written a piece at a time. Inputs are
real-format logs from tests/scale_logs.py, at sizes CI runs in seconds (benchmarks/bench_scale.py
runs them at full size)."""
from __future__ import annotations

import tracemalloc

import pytest

import scale_logs
from capdiag import facts as F
from capdiag.analysis import analyse, read_launches
from capdiag.api import explain
from capdiag.parsing import sglang, traceback
from capdiag.render import render_pieces
from capdiag.rows import PIECE as JSON_PIECE
from capdiag.report import EVIDENCE_RANKS
from capdiag.traffic import TrafficAggregator


def _log(tmp_path, name: str, lines) -> str:
    path = tmp_path / name
    scale_logs.write(path, lines)
    return str(path)


class _Calls:
    def __init__(self, monkeypatch, module, name):
        self.n, original = 0, getattr(module, name)

        def counted(*args, **kwargs):
            self.n += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)


def test_two_thousand_ranks_share_their_parses_and_are_all_reported(tmp_path, monkeypatch):
    log = _log(tmp_path, "ranks.log", scale_logs.many_ranks(2000))
    sglang._parse_body.cache_clear()
    parses = _Calls(monkeypatch, sglang, "_parse")  # the Lark parse of a line's body
    lark_tracebacks = _Calls(monkeypatch, traceback, "_Lines")  # a traceback parse that succeeded
    report = explain(log).to_dict()
    per_rank = len(scale_logs._per_rank())
    # one parse per distinct body (the per-rank kinds, the record, the main process's lines), not per rank
    assert parses.n <= per_rank + 10, parses.n
    assert lark_tracebacks.n == 0
    assert len(report["ranks"]) == 2000 and report["source"]["launches"] == 1
    assert {r["label"] for r in report["ranks"]} == {f"DP{n // 8} TP{n % 8}" for n in range(2000)}
    assert all(r["observed"]["kv_tokens"] == 415615 for r in report["ranks"])
    # the lines of the first 64 ranks (DP0 TP0, the target, first) but the graph batch list (no
    # fact), and the untagged record and token budget line; the other ranks' lines are counted
    listed = report["framework_evidence"]
    assert len(listed) == EVIDENCE_RANKS * (per_rank - 1) + 2
    assert {e["rank"] for e in listed} - {None} == {f"DP{n // 8} TP{n % 8}" for n in range(EVIDENCE_RANKS)}
    assert [e["line"] for e in listed] == sorted(e["line"] for e in listed)
    omitted = report["framework_evidence_omitted"]
    assert (omitted["lines"], omitted["ranks"]) == ((2000 - EVIDENCE_RANKS) * (per_rank - 1), 2000 - EVIDENCE_RANKS)


def _peak(read) -> int:
    tracemalloc.start()
    try:
        read()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_the_number_of_launches(tmp_path, monkeypatch):
    from capdiag.launches import LaunchSplitter
    small = _log(tmp_path, "small.log", scale_logs.many_launches(400))
    large = _log(tmp_path, "large.log", scale_logs.many_launches(1600))
    read_launches(small)  # parsers built and cached before measuring
    a, b = _peak(lambda: read_launches(small)), _peak(lambda: read_launches(large))
    # 4x the launches: their outlines (~0.3 KB each) and the read buffers of a longer file on
    # top, not their facts (~5 KB a launch: 6 MiB more)
    assert b < a + (2560 << 10), (a, b)
    held = []
    original = LaunchSplitter._close

    def close(self, ended_by=None):
        original(self, ended_by)
        held.append(sum(len(l.facts) for l in self.kept))
    monkeypatch.setattr(LaunchSplitter, "_close", close)
    reading = read_launches(large)
    assert len(reading.outlines) == 1600 and [l.index for l in reading.launches] == [1600]
    assert max(held) <= 30  # one launch's facts at a time, in each framework's view
    assert all(o.phase == "ready" and o.ended_by == f"line {27 * o.index + 1} starts another start-up"
               for o in reading.outlines[:-1])


def test_memory_per_rank_is_bounded(tmp_path):
    small = _log(tmp_path, "small.log", scale_logs.many_ranks(200))
    large = _log(tmp_path, "large.log", scale_logs.many_ranks(800))
    read_launches(small)
    a, b = _peak(lambda: read_launches(small)), _peak(lambda: read_launches(large))
    per_line = (b - a) / (600 * len(scale_logs._per_rank()))
    assert per_line < 700, per_line  # the line's text, its fact and evidence; one Rank per rank


def test_the_target_ranks_lines_are_listed_first_and_the_text_report_says_what_is_left_out(tmp_path):
    report = explain(_log(tmp_path, "ranks.log", scale_logs.many_ranks(800)), target_rank="DP90 TP3")
    data = report.to_dict()
    ranks = {e["rank"] for e in data["framework_evidence"]} - {None}
    assert "DP90 TP3" in ranks and len(ranks) == EVIDENCE_RANKS
    omitted = data["framework_evidence_omitted"]
    assert omitted["ranks"] == 800 - EVIDENCE_RANKS
    assert f"and {omitted['lines']} more lines of {omitted['ranks']} other ranks, not listed" in report.render("text")


def test_a_reports_memory_per_rank_is_bounded(tmp_path):
    """The whole report (facts, conclusions, the report's data) per rank, not only the reading."""
    small = _log(tmp_path, "small.log", scale_logs.many_ranks(200))
    large = _log(tmp_path, "large.log", scale_logs.many_ranks(1000))

    def written(log):  # as `explain --format json -o FILE` writes it
        for _ in explain(log).render_pieces("json"):
            pass
    written(small)
    a, b = _peak(lambda: written(small)), _peak(lambda: written(large))
    per_rank = (b - a) / 800
    # nine lines a rank (~3.3 KB: text, fact, evidence), its observed figures, bars and table
    # row in the knowledge base and in the report; the listed evidence is capped
    assert per_rank < 9000, per_rank


def test_tracebacks_after_ready_are_kept_up_to_a_bound_and_counted(tmp_path):
    from capdiag.launches import AFTER_END
    # four lines of each traceback are pieces: past the bound in both, and both past the size
    # at which the reader's buffers stop growing (a few read chunks)
    small = _log(tmp_path, "small.log", scale_logs.tracebacks_after_ready(AFTER_END))
    large = _log(tmp_path, "large.log", scale_logs.tracebacks_after_ready(2 * AFTER_END))
    read_launches(small)
    a, b = _peak(lambda: read_launches(small)), _peak(lambda: read_launches(large))
    assert b < a + (1 << 20), (a, b)  # 4,096 tracebacks more (28,672 lines): counted, not kept
    launch = read_launches(large).launches[0]
    pieces = [f for f in launch.facts if isinstance(f, (F.TracebackStart, F.TracebackFrame, F.ExceptionRaised))]
    assert len(pieces) == AFTER_END
    lines = 27 + 7 * 2 * AFTER_END
    assert launch.phase == "ready" and launch.last_line == lines
    report = explain(large).to_dict()
    assert report["source"]["last_line"] == lines
    assert report["source"]["all_launches"][0]["failure"] is None  # requests failed; the server served on
    first, last = [u for u in report["source"]["unread_lines"] if "counted, not kept" in u["reason"]]
    dropped = 4 * 2 * AFTER_END - AFTER_END
    assert first["line"] == 27 + 7 * (AFTER_END // 4) + 2 and last["line"] == lines
    assert f"this and {dropped - 1} more traceback lines up to line {lines}" in first["reason"]


def test_traffic_of_launches_no_longer_analysed_is_dropped(tmp_path, monkeypatch):
    kept = []
    original = TrafficAggregator.facts

    def facts(self):
        kept.append(len(self.segments))
        return original(self)
    monkeypatch.setattr(TrafficAggregator, "facts", facts)
    a = analyse(_log(tmp_path, "launches.log", scale_logs.many_launches(300)))
    assert kept == [2]  # the analysed launch's traffic and the one before it, not 300
    summary = next(f for f in a.launch.facts if isinstance(f, F.TrafficSummary))
    assert a.launch.first_line <= summary.evidence.line <= a.launch.last_line


def test_the_json_report_is_handed_out_in_bounded_pieces(tmp_path):
    report = explain(_log(tmp_path, "ranks.log", scale_logs.many_ranks(200)))
    pieces = list(render_pieces(report.to_dict(), "json"))
    assert len(pieces) > 5 and max(len(p) for p in pieces) < JSON_PIECE + 4096
    assert "".join(pieces) == report.render("json") == report.to_json() + "\n"


@pytest.mark.parametrize("name, lines", [("paste", scale_logs.soft_wrapped_paste(300_000)),
                                         ("comma", scale_logs.comma_continued(20_000)),
                                         ("keywords", scale_logs.keyword_lines(20_000))])
def test_large_inputs_of_other_shapes_read_in_flat_memory(name, lines, tmp_path):
    log = _log(tmp_path, f"{name}.log", lines)
    read_launches(str(scale_logs.EXAMPLE))
    peak = _peak(lambda: read_launches(log))
    assert peak < 24 << 20, peak
    reading = read_launches(log)
    assert reading.launches[-1].phase == "ready"
