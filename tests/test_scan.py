"""The keyword pass over raw blocks: the anchors it searches for instead of the whole keyword
list, and that the lines it lets through are exactly those the whole list would."""
from pathlib import Path
from unittest import mock

import ahocorasick_rs
import pytest
from hypothesis import given, settings, strategies as st

import capdiag
from capdiag import source
from capdiag.source import ANCHORS, KEYWORDS, MAX_ANCHORS, anchor_groups, anchors, candidate_runs


def test_every_keyword_holds_an_anchor_and_each_automaton_keeps_its_prefilter():
    groups = anchor_groups(ANCHORS)
    assert all(0 < len(group) <= MAX_ANCHORS for group in groups)
    assert sorted(a for group in groups for a in group) == sorted(ANCHORS)
    for keyword in KEYWORDS:
        assert any(anchor in keyword.lower() for anchor in ANCHORS), keyword


def test_the_short_anchors_are_searched_apart_and_every_anchor_is_searched():
    """A short anchor in the long ones' automaton would shorten its prefilter's fingerprints."""
    groups = anchor_groups(ANCHORS)
    assert len(source._ANCHOR_SCANNERS) == len(groups)
    for group, scanner in zip(groups, source._ANCHOR_SCANNERS):
        assert len({len(a) < source.SHORT_ANCHOR for a in group}) == 1, group
        assert all(scanner.find_matches_as_indexes(a.encode()) for a in group)
    short_ones = [a for a in ANCHORS if len(a) < source.SHORT_ANCHOR]
    assert short_ones and not any(scanner.find_matches_as_indexes(a.encode()) for a in short_ones
                                  for group, scanner in zip(groups, source._ANCHOR_SCANNERS)
                                  if len(group[0]) >= source.SHORT_ANCHOR)


def test_keywords_no_word_folds_are_searched_by_a_further_automaton():
    """Past the limit, keywords that share no word stay whole: a further automaton searches them,
    instead of the reader refusing to start."""
    keywords = [f"distinct phrase {chr(97 + a)}{chr(97 + b)}" for a in range(9) for b in range(9)] + ["['"]
    found = anchors(keywords, limit=8)
    assert found == ("['", "distinct")  # the shared word still folds what it can
    keywords = ["alpha one", "bravo two", "charlie three", "delta four", "echo five", "['", '"--']
    found = anchors(keywords, limit=2)
    assert len(found) == 7
    assert anchor_groups(found, limit=2) == (("alpha one", "bravo two"), ("charlie three", "delta four"),
                                             ("echo five",), ('"--', "['"))


def test_too_many_keywords_share_their_common_word():
    keywords = [f"Free memory {n}x" for n in range(70)] + ["graph end", "graph begin"]
    assert anchors(keywords, limit=8) == ("graph begin", "graph end", "memory")
    assert anchors(["Load weight", "load weight end", "Error", "Value error,"]) == ("error", "load weight")


TRAFFIC_CASES = Path(__file__).resolve().parent / "traffic_cases"
_TRAFFIC = (b"Decode batch", b"Prefill batch", b"Avg prompt throughput: ", b"#retracted_reqs: ", b"is preempted by")


def test_no_anchor_lets_through_a_traffic_line_that_no_keyword_holds():
    """Request-time lines are most of a long log: an anchor found in one that no keyword is in
    would send each of them to be checked line by line (the fallback's speed)."""
    lines = [line for log in sorted(TRAFFIC_CASES.glob("*.log")) for line in log.read_bytes().lower().splitlines()
             if any(marker.lower() in line for marker in _TRAFFIC)]
    assert len(lines) > 20
    scanner = ahocorasick_rs.BytesAhoCorasick([a.encode() for a in ANCHORS])
    for line in lines:
        assert not scanner.find_matches_as_indexes(line) or _WHOLE_LIST.find_matches_as_indexes(line), line


# Pieces of real start-up and traffic lines, keyword fragments, anchor-only words and wraps.
_PIECES = st.sampled_from([
    "[2026-03-02 09:14:19] ", "KV Cache is allocated. #tokens: 415615", "Decode batch, #running-req: 3, cuda graph: True",
    "memory", "Memory ", "out of", " memory", "GPU KV cache usage: 4.1%", "Load weight end. mem usage=14.99 GB",
    "server_args=ServerArgs(model_path='m', ", "tp_size=1)", "\x1b[32m", "\x00", "\r", ", ", "--tp 8", " \\",
    "INFO:     127.0.0.1:51234 - \"POST /generate HTTP/1.1\" 200 OK", "ValueError: ", "Not enough memory",
    "(EngineCore_DP0 pid=4671) ", "Available KV cache memory: 9.51 GiB", "graph", "profiling",
])
_WHOLE_LIST = ahocorasick_rs.BytesAhoCorasick(sorted({k.lower().encode() for k in KEYWORDS}))
_LOGS = st.lists(st.lists(_PIECES, max_size=5).map("".join), max_size=40).map(lambda ls: "\n".join(ls).encode())


EXAMPLE = Path(__file__).resolve().parent.parent / "capdiag" / "examples" / "sglang-llama31-8b-h100.log"


def _runs_of(log: bytes, blocks: int) -> list[tuple[int, bytes]]:
    """The log in about `blocks` blocks of whole lines, numbered, as physical_runs gives them."""
    step = max(1, len(log) // blocks)
    runs = []
    at, number = 0, 1
    while at < len(log):  # whole lines per block, as physical_runs gives them
        cut = log.find(b"\n", at + step)
        end = len(log) if cut < 0 else cut + 1
        runs.append((number, log[at:end]))
        number += log.count(b"\n", at, end)
        at = end
    return runs


@settings(max_examples=300, deadline=None)
@given(_LOGS, st.integers(1, 7))
def test_anchors_let_through_exactly_the_lines_the_whole_list_does(log, blocks):
    runs = _runs_of(log, blocks)
    with_anchors = list(candidate_runs(runs))
    with mock.patch.object(source, "_ANCHOR_SCANNERS", (_WHOLE_LIST,)):
        assert with_anchors == list(candidate_runs(runs))


def _hyperscan_or_skip():
    pytest.importorskip("hyperscan", reason="the `fast` extra (hyperscan) is not installed")
    assert source._hyperscan() is not None


@settings(max_examples=300, deadline=None)
@given(_LOGS, st.integers(1, 7))
def test_hyperscan_lets_through_the_same_lines_as_the_fallback(log, blocks):
    _hyperscan_or_skip()
    runs = _runs_of(log, blocks)
    with mock.patch.object(source, "FAST_FROM", 0):
        fast = list(candidate_runs(runs))
    with mock.patch.object(source, "_hyperscan", lambda: None):
        assert fast == list(candidate_runs(runs))


def test_the_report_is_the_same_byte_for_byte_with_and_without_hyperscan(tmp_path):
    _hyperscan_or_skip()
    traffic = "[2026-03-02 09:20:01] Decode batch, #running-req: 3, #token: 1200, token usage: 0.01, gen throughput (token/s): 90.1\n"
    log = tmp_path / "big.log"
    log.write_text(EXAMPLE.read_text() + traffic * 5000 + EXAMPLE.read_text())
    with mock.patch.object(source, "FAST_FROM", 0):
        fast = capdiag.explain(log).render("json")
    with mock.patch.object(source, "_hyperscan", lambda: None):
        assert fast == capdiag.explain(log).render("json")
