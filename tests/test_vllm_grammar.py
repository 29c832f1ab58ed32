"""vLLM grammar cases: every line kind and version variant vLLM prints, one file per kind.

Each file under tests/vllm_cases/ holds cases of the form

    # free comment
    LINE: <one log line exactly as printed (after transport noise is removed)>
    EXPECT: <json>

`LINE_JSON: "<json string>"` spells a line with leading/trailing blanks or control characters.
`XFAIL: <reason>` before a case marks a known bug (strict: the case must keep failing until
the bug is fixed). EXPECT is `null` for a line that must state nothing, an object for a line
that states one fact, or a list of objects for a line that states several (0.28+ capacity).
An object reads

    {"cls": "VllmModelLoading",       fact class name (required)
     "rank": {"tp": 0},               the rank tags, exactly (absent tags are not listed)
     "fields": {...},                 engine config / args only: these fields, exactly
     "field_count": 3,                engine config / args only: how many fields were read
     "gib": 14.9889, ...}             every other key is a value of the fact; listed ones must
                                      match exactly, and null means "absent or None"

Nested reprs in `fields` are spelled {"__call__": "Name", kw: value, ...}, tuples
{"__tuple__": [...]}; `...` stands for an elided value.
"""
from __future__ import annotations

import pytest

from capdiag import facts as F
from capdiag.parsing import read_facts
from capdiag.parsing.process_tag import read_tag
from capdiag.parsing.vllm import parse_vllm_line
from capdiag.source import candidate_lines, clean
from helpers import TESTS, case_params, check_case_fact, dump, jsonable, load_case_files, rank_tags

VLLM_CASES = TESTS / "vllm_cases"
_RESERVED = ("cls", "rank", "fields", "field_count")

CASES = load_case_files(VLLM_CASES)
POSITIVE = [c for c in CASES if c[2] is not None]


def _expected(expect) -> list[dict]:
    return [] if expect is None else expect if isinstance(expect, list) else [expect]


def check_fact(parsed, want: dict) -> None:
    # a vLLM case lists the values beside the reserved keys
    check_case_fact(parsed, want, {k: v for k, v in want.items() if k not in _RESERVED})
    # the fact class accepts exactly what the parser hands it
    parsed.cls(evidence=F.Evidence(1, "x"), rank=parsed.rank, **parsed.values)


@pytest.mark.parametrize("line, expect", case_params(CASES))
def test_case(line, expect):
    parsed = parse_vllm_line(line)
    wanted = _expected(expect)
    if not wanted:
        assert parsed == [], "must state nothing, got " + "; ".join(
            f"{p.cls.__name__} {dump(jsonable(p.values))[:200]}" for p in parsed)
        return
    assert parsed, "the line did not parse"
    assert [p.cls.__name__ for p in parsed] == [w["cls"] for w in wanted]
    for p, w in zip(parsed, wanted):
        check_fact(p, w)


# ---- coverage of the case files themselves ---------------------------------------------------

PRODUCED = {F.VllmRankAssignment, F.VllmVersion, F.VllmEngineConfig, F.VllmArgs, F.VllmMaxModelLen, F.VllmModelName, F.VllmCpuKVSpace, F.VllmModelLoading,
            F.VllmMemoryProfile, F.VllmAvailableKV, F.VllmKVCacheSize, F.VllmMaxConcurrency, F.VllmGpuBlocks,
            F.VllmGraphCapture, F.VllmGraphPool, F.VllmGraphEstimate, F.VllmUtilizationAdvice,
            F.VllmStartupMemory, F.VllmInitialFree, F.VllmStartupError, F.VllmEngineReady, F.VllmHybridBlockSize,
            F.ServerReady, F.OutOfMemory, F.DeviceName, F.LaunchCommand}


def test_every_vllm_fact_class_is_named_here():
    """A new vLLM fact class must get cases: every class in capdiag.facts.vllm is in PRODUCED
    (but the base that says they are vLLM's)."""
    import capdiag.facts.vllm as module
    import attrs
    classes = {c for c in vars(module).values() if isinstance(c, type) and attrs.has(c) and c.__module__ == module.__name__}
    assert classes - PRODUCED == {module.VllmFact}


def test_every_line_kind_has_a_passing_case():
    covered = {w["cls"] for _, _, expect, xfail in POSITIVE if not xfail for w in _expected(expect)}
    # VllmUtilizationAdvice has xfail cases only while the advice line never parses (util_advice.txt)
    assert {c.__name__ for c in PRODUCED} - covered <= {"VllmUtilizationAdvice"}


def test_every_line_kind_has_a_case():
    covered = {w["cls"] for _, _, expect, _ in POSITIVE for w in _expected(expect)}
    assert {c.__name__ for c in PRODUCED} - covered == set()


def test_case_files_are_many_and_have_negatives():
    files = {case_id.split(":")[0] for case_id, *_ in CASES}
    assert len(files) >= 15
    assert sum(1 for c in CASES if c[2] is None) >= 20


def test_every_case_line_passes_the_keyword_filter():
    """A positive line that the source's keyword test drops would never reach the parser."""
    from capdiag.source import has_keyword
    missing = [case_id for case_id, line, _, xfail in POSITIVE if not has_keyword(line)]
    assert missing == []


def test_case_lines_survive_the_source_cleaning():
    """candidate_lines() hands the parser the line unchanged (no prefix stripped, not split)."""
    for case_id, line, expect, _ in POSITIVE:
        got = [l.text for l in candidate_lines([(1, line)])]
        assert got == [line.strip()], case_id


# ---- properties over the cases ---------------------------------------------------------------

def test_parse_never_raises_on_prefixes_of_case_lines():
    """Any prefix of a known line either parses or is rejected; it never raises."""
    for _, line, _, _ in CASES:
        pieces = 4 if len(line) > 1000 else 30  # a long config record takes ~0.1-0.3 s per parse
        for cut in range(0, len(line), max(1, len(line) // pieces)):
            parse_vllm_line(line[:cut])


def test_header_does_not_change_the_body():
    """The same body under every header shape gives the same values."""
    body = "Model loading took 14.9889 GiB and 4.215733 seconds"
    headers = ["", "INFO 05-12 10:00:14 [gpu_model_runner.py:1347] ", "INFO 05-12 10:00:14 gpu_model_runner.py:1347] ",
               "(EngineCore_0 pid=2514) INFO 05-12 10:00:14 [gpu_model_runner.py:1347] ",
               "(Worker_TP3 pid=7) DEBUG 05-12 10:00:14 [v1/worker/gpu_model_runner.py:1347] ",
               "(Worker_PP0 pid=611) INFO [model_runner.py:329] ", "INFO 05-12 10:00:14 "]
    values = []
    for header in headers:
        parsed = parse_vllm_line(header + body)
        assert len(parsed) == 1, header
        values.append(parsed[0].values)
    assert all(v == values[0] for v in values)


def test_ansi_coloured_prefix_parses_after_cleaning():
    """Up to 0.11 the process prefix is coloured even in files; the source strips the colour."""
    raw = "\x1b[1;36m(VllmWorkerProcess pid=48211)\x1b[0;0m INFO 01-14 12:37:09 model_runner.py:1535] " \
          "Graph capturing finished in 16 secs, took 0.27 GiB"
    (text,) = clean(raw)
    (parsed,) = parse_vllm_line(text)
    assert parsed.cls is F.VllmGraphCapture and parsed.values["gib"] == 0.27
    assert rank_tags(parsed.rank) == {"worker": "VllmWorkerProcess pid=48211"}


@pytest.mark.parametrize("tag, want", [
    ("(APIServer pid=1)", {}), ("(ApiServer_1 pid=1)", {}), ("(MainProcess pid=1)", {}),
    ("(EngineCore pid=1)", {}), ("(EngineCore_0 pid=1)", {}), ("(EngineCore_DP0 pid=1)", {"dp": 0}),
    ("(EngineCore_DP3 pid=1)", {"dp": 3}), ("(VllmWorker rank=3 pid=1)", {"tp": 3}),
    ("(VllmWorker TP0 pid=1)", {"tp": 0}), ("(VllmWorker PP0_TP1 pid=1)", {"pp": 0, "tp": 1}),
    ("(VllmWorkerProcess pid=7)", {"worker": "VllmWorkerProcess pid=7"}), ("(Worker pid=1)", {}),
    ("(Worker_TP1 pid=1)", {"tp": 1}), ("(Worker_PP2 pid=1)", {"pp": 2}),
    ("(Worker_DP3_TP0_DCP0_EP12 pid=1)", {"dp": 3, "tp": 0, "ep": 12}),
    ("(RayWorkerWrapper pid=2, ip=10.0.0.2)", {"worker": "RayWorkerWrapper pid=2, ip=10.0.0.2"}),
])
def test_rank_of_process_tags(tag, want):
    assert rank_tags(read_tag(tag).rank) == want
    assert read_tag(tag).pid == int(tag.split("pid=")[1].split(",")[0].rstrip(")"))


@pytest.mark.parametrize("line, pid, rank", [
    # vLLM: Ray nests the worker's tag inside the engine's; the innermost is the process that printed
    ("(EngineCore_DP0 pid=941609) (RayWorkerWrapper pid=714, ip=10.0.3.17) INFO 10-02 08:12:20 "
     "[gpu_worker.py:1] Model loading took 14.99 GiB and 3.1 seconds", 714,
     {"worker": "RayWorkerWrapper pid=714, ip=10.0.3.17"}),
    ("(Worker_TP1 pid=7155) INFO 11-20 09:01:40 [gpu_worker.py:1] Model loading took 7.5 GiB", 7155, {"tp": 1}),
    ("INFO 11-20 09:01:40 [gpu_worker.py:1] Model loading took 7.5 GiB", None, {}),
    # a traceback piece under Ray's bare `(pid=…)` tag (the traceback grammar reads it)
    ("(pid=345, ip=10.0.0.2) Traceback (most recent call last):", 345, {"worker": "pid=345, ip=10.0.0.2"}),
    # SGLang under Ray: its rank from the bracket, its pid from the Ray tag
    ("(SGLangEngine pid=4242) [2026-02-26 05:35:13 TP3] Load weight begin. avail mem=78.50 GB", 4242, {"tp": 3}),
    ("[2026-02-26 05:35:13 TP3] Load weight begin. avail mem=78.50 GB", None, {"tp": 3}),
])
def test_the_pid_comes_from_the_one_reading_of_the_process_tag(line, pid, rank):
    """Every fact of a line carries the pid its process tag names, read by the same parse that
    gives its rank (grammar/process_tag.lark); a line without a tag names none."""
    (read,) = [f for f in read_facts(candidate_lines([(1, line)]))]
    assert read.evidence.pid == pid and rank_tags(read.rank) == rank


def test_worker_without_index_is_not_tp0():
    rank = read_tag("(VllmWorkerProcess pid=7)").rank
    assert rank.tp_index is None and rank.key() != F.NO_RANK.key()
    assert read_tag("(EngineCore_DP0 pid=1)").rank.tp_index == 0
