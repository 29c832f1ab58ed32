"""Grammar cases: one file per line kind, in the style of pylint's functional tests.

Each file under tests/grammar_cases/ holds cases of the form

    # free comment
    LINE: <one log line exactly as printed>
    EXPECT: <json>

`LINE_JSON: "<json string>"` spells a line with trailing blanks or control characters.
`XFAIL: <reason>` before a case marks a known bug (strict: the case must keep failing until
the bug is fixed). EXPECT is `null` for a line that must not parse, else an object:

    {"cls": "LoadWeightEnd",            fact class name (required)
     "rank": {"tp": 0},                 the rank tags, exactly (absent tags are not listed)
     "values": {"avail_gib": 63.46},    the values that matter; listed ones must match exactly,
                                        null included (a value the line does not print)
     "fields": {...},                   server_args only: these fields, exactly
     "field_count": 3}                  server_args only: how many fields were read

Nested reprs in `fields` are spelled {"__call__": "Name", kw: value, ...}; tuples
{"__tuple__": [...]}; `...` stands for an elided value.
"""
from __future__ import annotations

import pytest

from capdiag import facts as F
from capdiag.parsing.sglang import parse_sglang_line
from helpers import GRAMMAR_CASES, case_params, check_case_fact, dump, load_case_files

CASES = load_case_files(GRAMMAR_CASES)
POSITIVE = [c for c in CASES if c[2] is not None]


def check_parsed(line: str, expect) -> None:
    parsed = parse_sglang_line(line)
    if expect is None:
        assert parsed is None, f"must not parse, got {parsed.cls.__name__} {dump(parsed.values)}"
        return
    assert parsed is not None, "the line did not parse"
    # an SGLang case lists the values under "values"
    check_case_fact(parsed, expect, expect.get("values", {}))


@pytest.mark.parametrize("line, expect", case_params(CASES))
def test_case(line, expect):
    check_parsed(line, expect)


def test_every_line_kind_has_cases():
    """Every fact class the SGLang grammar can produce has at least one positive case."""
    produced = {F.ServerArgs, F.LaunchCommand, F.ModelPathHint, F.ServerReady, F.TorchDistributedBegin,
                F.TorchDistributedEnd, F.LoadWeightBegin, F.LoadWeightEnd, F.WeightsCommitted,
                F.KVCacheAllocated, F.SWAKVPoolUsage, F.MambaCacheAllocated, F.MemoryPoolEnd,
                F.GraphCaptureBegin, F.GraphCaptureEnd, F.TokenBudget, F.MemoryProfiling,
                F.DSV4MemoryCalculation, F.PostCaptureKVSizing, F.KVCacheDtype, F.SlidingWindowSplit,
                F.OutOfMemory, F.NotEnoughMemory, F.SchedulerException, F.DeepGEMMActivity, F.DeviceName}
    covered = {expect["cls"] for _, _, expect, xfail in POSITIVE if not xfail}
    assert {c.__name__ for c in produced} - covered == set()


def test_case_files_are_many_and_have_negatives():
    files = {case_id.split(":")[0] for case_id, *_ in CASES}
    assert len(files) >= 15
    assert sum(1 for c in CASES if c[2] is None) >= 10


def test_parse_never_raises_on_truncations_of_case_lines():
    """Any prefix of a known line either parses or is rejected; it never raises."""
    for _, line, _, xfail in POSITIVE:
        if xfail:
            continue
        for cut in range(0, len(line), max(1, len(line) // 25)):
            parse_sglang_line(line[:cut])


def test_untagged_lines_are_tp0():
    parsed = parse_sglang_line("[2026-08-20 10:00:02] Load weight begin. avail mem=78.58 GB")
    assert parsed.rank == F.NO_RANK
    assert parsed.rank.tp_index == 0
    assert parsed.rank.key() == F.Rank(tp=0).key()
    assert parsed.rank.key() != F.Rank(tp=1).key()
    tagged = parse_sglang_line("[2026-08-20 10:00:12 DP1 PP1 TP3 EP3] Load weight begin. avail mem=78.58 GB")
    assert tagged.rank.key() == F.Rank(dp=1, pp=1, tp=3).key()
    assert tagged.rank.label == "DP1 PP1 TP3 EP3"
