"""Failed start-ups: traceback pieces, their assembly into chains, the root cause and its name.

tests/failure_cases/*.log are failed start-ups written in the frameworks' real formats (process
prefixes, interleaved ranks, chained exceptions, pydantic's `Value error, …`, Ray, SGLang's
sigquit, a bare `Killed`); the first line of each says what the report must name:
`# expect: line=N cause=NAME phase=PHASE rank=LABEL` (`-`: none).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from lark.exceptions import LarkError

from capdiag import facts as F
from capdiag.failures import Raised, catalogue, classify, exceptions, root_cause
from capdiag.parsing import traceback
from capdiag.parsing.traceback import parse_traceback_line
from capdiag.parsing.vllm import parse_vllm_line
from helpers import SHARED, corpus_report, finding

CASES = Path(__file__).resolve().parent / "failure_cases"
CORPUS = SHARED / "corpus"
EXPECT = re.compile(r"# expect: line=(\d+) cause=(\S+) phase=(\S+) rank=(.+)$")


def case_params():
    return [pytest.param(p, id=p.stem) for p in sorted(CASES.glob("*.log"))]


@pytest.mark.parametrize("path", case_params())
def test_failure_case_names_its_root_cause(path: Path):
    line, cause, phase, rank = EXPECT.match(path.read_text(encoding="utf-8").splitlines()[0]).groups()
    rep = corpus_report(str(path))
    f = failure_finding(rep)
    assert f is not None, [x["rule"] for x in rep["findings"]]
    assert f["detail"]["line"] == int(line) and f["main_evidence"]["line"] == int(line)
    assert f["detail"]["cause"] == cause
    assert f["detail"].get("failure_phase", f["detail"].get("phase")) == (None if phase == "-" else phase)
    assert f["detail"]["rank"] == (None if rank == "-" else rank)
    assert rep["source"]["all_launches"][-1]["failure"]["line"] == int(line)
    assert rep["findings"][0]["rule"] in ("startup-failed", "out-of-memory", "utilization-too-high")
    assert finding(rep, "startup-incomplete") is None


def failure_finding(rep):
    """The one finding that names a failed start-up: startup-failed, or — where the log's figures
    say more — the out-of-memory or utilization finding, which then carries the root cause."""
    return next((f for f in rep["findings"] if f["rule"] == "startup-failed" or
                 f["rule"] in ("out-of-memory", "utilization-too-high") and "cause" in f["detail"]), None)


def test_a_failure_is_one_finding():
    """An out-of-memory start-up is the out-of-memory finding alone, with the root cause's line."""
    rep = corpus_report(str(CASES / "oom-sampler.log"))
    rules = [f["rule"] for f in rep["findings"] if f["severity"] == "error"]
    assert rules == ["out-of-memory"], rules
    assert rep["findings"][0]["main_evidence"]["line"] == rep["findings"][0]["detail"]["line"]


def test_every_cause_of_the_catalogue_has_a_case_or_a_corpus_log():
    """Each named cause is exercised by a case file, a rule case or a corpus log."""
    covered = {EXPECT.match(p.read_text(encoding="utf-8").splitlines()[0]).group(2) for p in CASES.glob("*.log")}
    covered |= {"kv-cache-no-room", "kv-cache-below-max-model-len", "cuda-kernel-fault", "no-kernel-image",
                "moe-kernel-config-incomplete",  # rule cases and corpus logs (tests below)
                "moe-experts-unquantized", "peer-closed", "weights-do-not-split"}  # corpus sglang/501, 516, 515
    causes = {c.name for c in catalogue()[0] if c.role == "cause"}
    missing = causes - covered
    assert missing <= {"model-not-found", "hub-unreachable"}, missing
    for name in sorted(causes & {"model-not-found", "hub-unreachable"}):
        example = next(c.wording["example"] for c in catalogue()[0] if c.name == name)
        assert classify(_raised(example)).name == name


def _raised(text: str) -> Raised:
    parsed = parse_traceback_line(text)
    assert parsed is not None and parsed.cls is F.ExceptionRaised, text
    return Raised(parsed.cls(evidence=F.Evidence(1, text), rank=parsed.rank, **parsed.values))


@pytest.mark.parametrize("cause", [pytest.param(c, id=f"{c.name}:{c.wording['who']}") for c in catalogue()[0]
                                   if "pattern" in c.wording and "frames" not in c.wording])
def test_each_wording_example_is_named_by_its_own_cause(cause):
    """The catalogue's order matters (the first match names the cause): every wording's example
    must be named by the entry it belongs to, not an earlier one."""
    example = cause.wording["example"]
    # an example that is a reason line under an exception (pydantic's `Value error, …`, a kernel
    # build's compiler diagnostics) is read as one, under an exception that names nothing
    own = parse_traceback_line(example)
    detail = own is not None and own.cls is F.ValidationDetail
    text = ("pydantic_core._pydantic_core.ValidationError: 1 validation error" if example.startswith("Value error, ")
            else "RuntimeError: see the lines below") if detail else example
    stated = None if detail or parse_traceback_line(text) is not None else parse_vllm_line(text)
    if stated:  # an error a framework states on a line of its own (argparse's `vllm: error: …`)
        r = Raised(stated[0].cls(evidence=F.Evidence(1, text), rank=stated[0].rank, **stated[0].values))
    else:
        r = _raised(text)
    if detail:
        r = Raised(r.exception, details=(F.ValidationDetail(evidence=F.Evidence(2, example), **own.values),))
    assert classify(r) is not None and classify(r).name == cause.name, (example, classify(r))


def test_a_wording_with_text_and_frames_needs_both():
    """The OOM of MoE experts built unquantized is an OOM whose frames run through unquant.py."""
    text = "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 384.00 MiB."
    frame = F.TracebackFrame(evidence=F.Evidence(2, "frame"), path="/sglang/srt/layers/quantization/unquant.py",
                             lineno=219, function="create_weights")
    other = F.TracebackFrame(evidence=F.Evidence(2, "frame"), path="/sglang/srt/model_executor/model_runner.py",
                             lineno=1, function="load_model")
    bare = _raised(text)
    assert classify(Raised(bare.exception, (frame,))).name == "moe-experts-unquantized"
    assert classify(Raised(bare.exception, (other,))).name == "cuda-out-of-memory"
    assert classify(bare).name == "cuda-out-of-memory"


def _facts(lines: list[str]) -> list[F.Fact]:
    out = []
    for n, text in enumerate(lines, 1):
        parsed = parse_traceback_line(text)
        if parsed is not None:
            out.append(parsed.cls(evidence=F.Evidence(n, text), rank=parsed.rank, **parsed.values))
    return out


def test_interleaved_processes_keep_their_own_tracebacks():
    facts = _facts([
        "(Worker_TP1 pid=2) ERROR 04-02 10:00:31 [multiproc_executor.py:857] Traceback (most recent call last):",
        "(Worker_TP0 pid=1) ERROR 04-02 10:00:31 [multiproc_executor.py:857] Traceback (most recent call last):",
        '(Worker_TP1 pid=2) ERROR 04-02 10:00:31 [multiproc_executor.py:857]   File "/v/gpu_model_runner.py", line 9, in load_model',
        '(Worker_TP0 pid=1) ERROR 04-02 10:00:31 [multiproc_executor.py:857]   File "/v/gpu_worker.py", line 3, in init_device',
        "(Worker_TP0 pid=1) ERROR 04-02 10:00:31 [multiproc_executor.py:857] RuntimeError: NCCL error: remote process exited",
        "(Worker_TP1 pid=2) ERROR 04-02 10:00:31 [multiproc_executor.py:857] AssertionError: 151936 is not divisible by 5",
    ])
    got = [(r.exception.evidence.line, r.process, [f.function for f in r.frames]) for r in exceptions(facts)]
    assert got == [(5, "Worker_TP0 pid=1", ["init_device"]), (6, "Worker_TP1 pid=2", ["load_model"])]


def test_sglang_continuation_lines_belong_to_the_open_traceback_and_chains_link():
    facts = _facts([
        "[2025-11-03 08:13:55 TP3] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/s/model_runner.py", line 612, in init_memory_pool',
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "Traceback (most recent call last):",
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
        "[2025-11-03 08:13:55] Received sigquit from a child process. It usually means the child failed.",
    ])
    first, second = exceptions(facts)
    assert (first.process, first.rank.tp, [f.function for f in first.frames]) == ("TP3", 3, ["init_memory_pool"])
    assert second.chain == first.chain and second.link == "context"
    found = root_cause(facts)
    assert found.line.evidence.line == 3 and found.phase == "kv_pool"
    assert found.cause.name == "kv-cache-no-room"  # the unnamed KeyError takes its chain's named cause


def test_clean_up_tracebacks_and_consequences_are_never_the_root():
    facts = _facts([
        "(EngineCore_DP0 pid=9) Exception ignored in: <function ExecutorBase.__del__ at 0x7a42bd9a3420>",
        "(EngineCore_DP0 pid=9) Traceback (most recent call last):",
        "(EngineCore_DP0 pid=9) AttributeError: 'NoneType' object has no attribute 'ensure_kv_transfer_shutdown'",
        "(APIServer pid=8) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ])
    assert [r.ignored for r in exceptions(facts)] == [True, False]
    assert root_cause(facts) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_traceback_parser_never_raises(text):
    parse_traceback_line(text)


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[a-z_]{1,8}(\.[a-z_]{1,8}){0,3}\.[A-Z][a-zA-Z]{0,10}Error", fullmatch=True),
       st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=80))
def test_any_exception_line_reads_as_its_type_and_message(kind, message):
    parsed = parse_traceback_line(f"(Worker_TP3 pid=7) ERROR 04-02 10:00:31 [x.py:1] {kind}: {message}")
    assert parsed.cls is F.ExceptionRaised and parsed.values["type"] == kind
    assert parsed.values["message"] == message.strip() and parsed.rank.tp == 3


def _grammar_reads(text: str) -> bool:
    try:
        traceback._Lines().transform(traceback._parser().parse(text))
        return True
    except LarkError:
        return False


_SHAPED = st.one_of(st.text(max_size=120), st.builds(
    lambda head, gap, body, rest: head + gap + body + rest,
    st.sampled_from(["", "(EngineCore_DP0 pid=7) ", "(pid=1) (RayWorkerWrapper pid=2, ip=10.0.0.1) ", "ERROR ",
                     "INFO 04-02 10:00:31 [x.py:1] ", "04-02 10:00:31", "[2026-02-26 05:35:13 DP3 TP3] ",
                     "[2026-02-26 05:35:13] ERROR scheduler.py:12: ", "\t"]),
    st.sampled_from(["", " ", "\t "]),
    st.sampled_from(["Traceback (most recent call last):", 'File "/a/b.py", line 3, in f', "Killed", "Value error, x",
                     "torch.OutOfMemoryError: CUDA", "AssertionError", "Exception ignored in: <f>", "Scheduler hit an "
                     "exception: Traceback (most recent call last):", "The above exception was the direct cause",
                     "Received sigquit from a child process.", "During handling of the above exception", "WARNING: x"]),
    st.text(max_size=40)))


@settings(max_examples=400, deadline=None)
@given(_SHAPED)
def test_a_line_the_traceback_grammar_reads_always_has_its_shape(text):
    """The shape test in front of the parser drops no line the parser would read."""
    assert traceback._shape().match(text) is not None or not _grammar_reads(text)


def test_every_traceback_line_of_the_fixtures_has_the_shape_and_warnings_do_not():
    logs = sorted(CASES.glob("*.log")) + sorted(CORPUS.glob("*/*.log"))
    read = [line for p in logs for line in p.read_text(encoding="utf-8", errors="replace").splitlines()
            if _grammar_reads(line)]
    assert len(read) > 80 and all(traceback._shape().match(line) for line in read)
    # a server under a failing client: keywords of a traceback, no traceback line
    assert traceback._shape().match("[2026-03-02 10:00:00] WARNING: Exception in ASGI application: "
                                    "request 7 hit ReadTimeout after 7 ms") is None


# ---- the shared corpus -------------------------------------------------------------------------

def corpus_logs():
    return [pytest.param(p, id=f"{p.parent.name}/{p.name[:3]}") for p in sorted(CORPUS.glob("*/*.log"))]


def crashed(rep: dict) -> bool:
    return not rep["source"]["ready"] and any(
        f["rule"] in ("startup-failed", "out-of-memory", "utilization-too-high") or
        (f["rule"] == "startup-incomplete" and f["severity"] == "error") for f in rep["findings"])


@pytest.mark.skipif(not CORPUS.is_dir(), reason="shared corpus (../shared) is absent")
@pytest.mark.parametrize("log", corpus_logs())
def test_corpus_crash_names_a_root_cause_that_is_no_consequence(log: Path):
    rep = corpus_report(str(log))
    for launch in rep["source"]["all_launches"]:
        failure = launch["failure"]
        if failure is None:
            continue
        text = failure["text"]
        assert not re.search(r"Engine core initialization failed|WorkerProc (?:initialization failed|failed to start)|"
                             r"EngineCore failed to start|Received sigquit|LocalEntryNotFoundError|"
                             r"Scheduler hit an exception", text), f"{log.name}: a consequence named as the cause: {text}"
    if crashed(rep):
        analysed = rep["source"]["all_launches"][rep["source"]["analyzed_launch"] - 1]
        assert analysed["failure"] is not None, f"{log.name}: crashed, root cause not named"
        f = failure_finding(rep)
        assert f is not None and f["detail"]["line"] == analysed["failure"]["line"]


# ---- advice a careful engineer would sign, on every corpus log and case --------------------------

# `mem_fraction_static 0.836 → 0.952`, `--gpu-memory-utilization to ≤ 0.76`, `… to about 0.83`, `… at least 0.92`
FRACTION_IN_TEXT = re.compile(r"(?:mem[-_]fraction[-_]static|gpu[-_]memory[-_]utilization)\s+(?:-?[\d.]+\s*→\s*|"
                              r"to\s+(?:about\s+|≤\s*|at least\s+)?)(-?\d+(?:\.\d+)?)")
FAILED_RULES = {"out-of-memory", "startup-failed", "utilization-too-high", "weights-exceed-budget"}


def every_log():
    logs = sorted(CORPUS.glob("*/*.log")) if CORPUS.is_dir() else []
    return [pytest.param(p, id=f"{p.parent.name}/{p.name[:3]}") for p in logs + sorted(CASES.glob("*.log"))]


@pytest.mark.parametrize("log", every_log())
def test_advice_is_bounded_and_never_beside_a_failure(log: Path):
    rep = corpus_report(str(log))
    for f in rep["findings"]:
        for key in ("suggested", "ceiling", "least"):
            value = (f.get("detail") or {}).get(key)
            assert value is None or 0 < value < 1, f"{log.name}: {f['rule']} {key}={value}"
        for text in (f["message"], f["action"]):
            for number in FRACTION_IN_TEXT.findall(text):
                assert 0 < float(number) < 1, f"{log.name}: {f['rule']} suggests {number}: {text}"
    names = {f["rule"] for f in rep["findings"]}
    failed = bool(names & FAILED_RULES) or any(l["failure"] for l in rep["source"]["all_launches"]
                                                if l["launch"] == rep["source"]["analyzed_launch"])
    if failed:
        assert "excess-headroom" not in names, f"{log.name}: excess headroom beside a failure"
    if not any(f["rule"] == "pool-capped" for f in rep["findings"]):
        return
    assert "excess-headroom" not in names, f"{log.name}: excess headroom although a setting caps the pool"


@pytest.mark.parametrize("log", every_log())
def test_held_memory_is_never_above_the_gpu_total(log: Path):
    rep = corpus_report(str(log))
    total = rep["gpu"]["total_gib"]
    for f in rep["findings"]:
        detail = f.get("detail") or {}
        if detail.get("held_gib") is not None:
            assert 0 <= detail["held_gib"] <= detail["total_gib"], f"{log.name}: {detail}"
    if total is None:
        return
    for r in rep["ranks"]:
        held = sum(s["gib"] for s in r["segments"] if s["category"] != "free" and s["gib"] is not None)
        assert held <= total + 0.05, f"{log.name}: {r['label']} holds {held} GiB of {total}"


@pytest.mark.parametrize("fmt,config_heading", [("text", "SERVING CONFIGURATION"), ("markdown", "## Serving configuration"),
                                                ("html", 'id="config"')])
def test_the_failure_summary_opens_every_format(fmt, config_heading):
    from capdiag.render import render
    rep = corpus_report(str(CASES / "parallel-size-does-not-divide.log"))
    assert rep["summary"]["outcome"] == "failed" and rep["summary"]["line"]["line"] == 18
    out = render(rep, fmt)
    flat = " ".join(out.split())  # the text report wraps long lines
    heading = " ".join(config_heading.split())
    title = "parallel size does not divide the model" + ("&#39;s" if fmt == "html" else "'s")
    for needle in (title, "151936 is not divisible by 5", "Choose a tensor-parallel size"):
        assert flat.index(needle) < flat.index(heading), needle
    if fmt == "text":
        assert out.splitlines().index(next(l for l in out.splitlines() if "START-UP FAILED" in l)) < 6


def test_a_ready_start_up_opens_with_its_headline_findings():
    from capdiag.render import render
    rep = corpus_report(str(Path(__file__).resolve().parents[1] / "capdiag" / "examples" / "sglang-llama31-8b-h100.log"))
    assert rep["summary"]["outcome"] == "ready" and rep["summary"]["title"] is None
    assert "START-UP" not in render(rep, "text")


def _ready_then(tmp_path: Path, lines: list[str]) -> dict:
    """The bundled example start-up (it reaches ready), then the given lines, as a report."""
    from capdiag.api import explain
    from scale_logs import LINES
    path = tmp_path / "served.log"
    path.write_text("\n".join(LINES + lines) + "\n", encoding="utf-8")
    return explain(str(path)).to_dict()


_REQUEST_TRACEBACK = [
    "ERROR:    Exception in ASGI application",
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/site-packages/uvicorn/protocols/http/h11_impl.py", line 403, in run_asgi',
    "    result = await app(  # type: ignore[func-returns-value]",
    '  File "/sgl-workspace/sglang/python/sglang/srt/entrypoints/http_server.py", line 1012, in v1_chat_completions',
    "    return await raw_request.app.state.openai_serving_chat.handle_request(request, raw_request)",
    "ValueError: The input (135000 tokens) is longer than the model's context length (131072 tokens).",
]


def test_a_request_that_fails_while_serving_is_not_a_failed_start_up(tmp_path):
    """uvicorn logs a request's exception and answers 500; the server serves on."""
    rep = _ready_then(tmp_path, _REQUEST_TRACEBACK * 3)
    assert rep["source"]["ready"] is True
    assert rep["source"]["all_launches"][-1]["failure"] is None
    assert finding(rep, "startup-failed") is None


def test_a_crash_after_ready_outside_a_request_is_still_named(tmp_path):
    """The same exception raised by the scheduler (no HTTP server frames) stopped the server."""
    crash = [line.replace("uvicorn/protocols/http/h11_impl.py", "sglang/srt/managers/scheduler.py")
                 .replace("run_asgi", "event_loop_overlap") for line in _REQUEST_TRACEBACK[1:]]
    rep = _ready_then(tmp_path, crash)
    failure = rep["source"]["all_launches"][-1]["failure"]
    assert failure is not None and failure["text"].startswith("ValueError: The input")
    assert finding(rep, "startup-failed") is not None
    assert finding(rep, "startup-failed")["title"].startswith("The server failed after it was ready")  # not "Start-up"
    assert finding(rep, "startup-failed")["message"].startswith("The server failed after it was ready")


def test_a_traceback_logged_as_a_warning_and_a_bare_error_heading_are_no_root_cause():
    """vLLM logs a failed optional import with its traceback at WARNING level and goes on; a paste's
    `Error:` heading line names no exception. The root cause is the error after both."""
    text = (CASES / "cuda-toolkit-missing.log").read_text(encoding="utf-8").splitlines()[1:]
    text.insert(5, "Error:")
    facts = _facts(text)
    cause = root_cause(facts)
    assert cause is not None and cause.line.evidence.line == 12 and cause.cause.name == "cuda-toolkit-missing"
    warned = [r for r in exceptions(facts) if r.exception.evidence.line == 4]
    assert warned and warned[0].ignored


def test_an_exception_raised_while_handling_a_consequence_is_one_too():
    """A user stopped a start-up that hung (KeyboardInterrupt) and the clean-up raised again: the
    second exception names no cause, so neither is the root cause."""
    lines = ["Traceback (most recent call last):",
             '  File "/usr/lib/python3.12/site-packages/ray/_private/worker.py", line 3053, in wait',
             "KeyboardInterrupt",
             "",
             "During handling of the above exception, another exception occurred:",
             "",
             "Traceback (most recent call last):",
             '  File "/usr/lib/python3.12/site-packages/vllm/executor/ray_utils.py", line 250, in _wait_until_pg_ready',
             "RuntimeError: cancelled"]
    assert root_cause(_facts(lines)) is None
    # the same exception raised on its own is the root cause
    alone = root_cause(_facts(lines[6:]))
    assert alone is not None and alone.line.evidence.line == 3


def test_an_error_of_the_frameworks_own_code_is_called_a_bug_to_upgrade_past(tmp_path):
    """An AttributeError raised in SGLang's own scheduler after it was ready: no setting avoids
    it; the advice is a newer release, not a configuration change."""
    log = tmp_path / "sglang.log"
    log.write_text("\n".join([
        "[2025-03-06 06:14:02] server_args=ServerArgs(model_path='Qwen/Qwen2.5-7B-Instruct', tp_size=1, "
        "mem_fraction_static=0.88)",
        "[2025-03-06 06:14:40] The server is fired up and ready to roll!",
        "[2025-03-06 06:15:33 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 552, in event_loop_overlap',
        "    self.check_memory()",
        '  File "/usr/local/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 935, in check_memory',
        "    self.token_to_kv_pool.available_size()",
        "AttributeError: 'Scheduler' object has no attribute 'token_to_kv_pool'",
    ]) + "\n")
    rep = corpus_report(str(log))
    failed = finding(rep, "startup-failed")
    assert failed["title"] == "The server failed after it was ready: AttributeError"
    assert failed["action"].startswith("This is a bug in the framework's own code (the innermost frame, "
                                       "/usr/local/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py:935")
    assert "upgrade to a newer release" in failed["action"] and "no setting of this launch avoids it" in failed["action"]
    assert rep["summary"]["outcome"] == "ready"


def test_the_frameworks_own_advice_is_quoted_beside_the_next_step(capsys, monkeypatch):
    """SGLang's `Not enough memory` error names the fraction in use and says what to try: the
    fraction becomes the stated setting (no server_args line survives here), the advice is shown
    as the framework's, with its line, next to capdiag's own next step."""
    from helpers import fixture, run_entry
    rep = corpus_report(str(fixture("sglang_not_enough_fraction_in_error.log")))
    assert rep["config"]["mem_fraction_static"] == 0.5
    assert "stated by the `Not enough memory` error" in rep["config_sources"]["mem_fraction_static"]
    summary = rep["summary"]
    assert summary["outcome"] == "failed"
    assert summary["framework_says"] == {"line": 10, "text": "Please try to increase --mem-fraction-static."}
    code, out, _ = run_entry(monkeypatch, capsys, "explain", str(fixture("sglang_not_enough_fraction_in_error.log")))
    assert 'the framework\'s own advice, line 10: "Please try to increase --mem-fraction-static."' in out


def test_a_vllm_error_gives_its_advice_and_a_torch_oom_gives_none():
    rep = corpus_report(str(Path(__file__).resolve().parent / "rule_cases" / "weights-exceed-budget" / "fires-3.log"))
    assert rep["summary"]["framework_says"] == {
        "line": 8, "text": "Try increasing `gpu_memory_utilization` when initializing the engine."}
    rep = corpus_report(str(Path(__file__).resolve().parent / "rule_cases" / "weights-exceed-budget" / "fires.log"))
    assert rep["summary"]["outcome"] == "failed" and rep["summary"]["framework_says"] is None


def test_a_capture_oom_reraised_by_sglang_is_read_in_graph_capture_with_sglangs_list():
    """The first raise's frames (an attention kernel) name no phase; SGLang's re-raise of the same
    out-of-memory (`Capture cuda graph failed: …`) does. Its `Possible solutions:` list is quoted as
    SGLang's, and capdiag's own step lowers the fraction (weight loading would say the opposite)."""
    rep = corpus_report(str(CASES / "graph-capture-oom-reraised.log"))
    said = rep["summary"]["framework_says"]
    assert said["line"] == 19 and said["text"].startswith(
        "Possible solutions: set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7); set --cuda-graph-max-bs")
    assert "disable CUDA graph by --disable-cuda-graph" in said["text"] and "Open an issue" not in said["text"]
    assert "Lower --mem-fraction-static" in rep["summary"]["next_step"]


def test_a_next_step_names_the_flags_of_the_logs_own_framework():
    from capdiag.failures import in_framework
    step = next(c.next_step for c in catalogue()[0] if c.name == "kernel-compile-failed")
    assert "--disable-cuda-graph" in in_framework(step, "sglang") and "--enforce-eager" not in in_framework(step, "sglang")
    assert "--enforce-eager" in in_framework(step, "vllm") and "~/.cache/vllm" in in_framework(step, "vllm")
    assert "--disable-cuda-graph / --enforce-eager" in in_framework(step, None)
    assert all("{" not in in_framework(c.next_step, fw) for c in catalogue()[0] for fw in ("sglang", "vllm", None))


def test_rocms_abort_is_read_as_the_exception_it_names():
    line = (":0:rocdevice.cpp            :3586: 4637341784 us:  Callback: Queue 0x7f5bfe700000 aborting with error : "
            "HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware exception. code: 0x1016")
    parsed = parse_traceback_line(line)
    assert parsed.cls is F.ExceptionRaised and parsed.values["type"] == "HSA_STATUS_ERROR_EXCEPTION"
    assert parsed.values["message"].startswith("An HSAIL operation resulted in a hardware exception")
