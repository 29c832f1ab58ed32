"""The keyword pass over raw blocks: the anchors it searches for instead of the whole keyword
list, and that the lines it lets through are exactly those the whole list would."""
from unittest import mock

import ahocorasick_rs
from hypothesis import given, settings, strategies as st

from capdiag import source
from capdiag.source import ANCHORS, KEYWORDS, MAX_ANCHORS, anchors, candidate_runs


def test_every_keyword_holds_an_anchor_and_there_are_few_enough():
    assert len(ANCHORS) <= MAX_ANCHORS
    for keyword in KEYWORDS:
        assert any(anchor in keyword.lower() for anchor in ANCHORS), keyword


def test_too_many_keywords_share_their_common_word():
    keywords = [f"Free memory {n}x" for n in range(70)] + ["graph end", "graph begin"]
    assert anchors(keywords, limit=8) == ("graph begin", "graph end", "memory")
    assert anchors(["Load weight", "load weight end", "Error", "Value error,"]) == ("error", "load weight")


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


@settings(max_examples=300, deadline=None)
@given(_LOGS, st.integers(1, 7))
def test_anchors_let_through_exactly_the_lines_the_whole_list_does(log, blocks):
    step = max(1, len(log) // blocks)
    runs = []
    at, number = 0, 1
    while at < len(log):  # whole lines per block, as physical_runs gives them
        cut = log.find(b"\n", at + step)
        end = len(log) if cut < 0 else cut + 1
        runs.append((number, log[at:end]))
        number += log.count(b"\n", at, end)
        at = end
    with_anchors = list(candidate_runs(runs))
    with mock.patch.object(source, "_ANCHOR_SCANNER", _WHOLE_LIST):
        assert with_anchors == list(candidate_runs(runs))
