"""The run-time section: traffic lines in every wording, summed without a fact per line.

tests/traffic_cases/<name>.log is a start-up followed by request-time lines in one version's
wording (written for these tests in the frameworks' formats); <name>.expect.json holds the
`runtime` values the report must give (a subset: every key named must match), the findings
that must and must not appear, and the analysed launch.
"""
from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings, strategies as st

from capdiag import facts as F
from capdiag.analysis import analyse
from capdiag.report import build
from capdiag.render import render
from capdiag.source import candidate_runs
from capdiag.traffic import SERIES_POINTS, TrafficAggregator
from click.testing import CliRunner

from capdiag.cli import main

CASES = Path(__file__).resolve().parent / "traffic_cases"
LOGS = sorted(CASES.glob("*.log"))


def _subset(want, got, where="runtime"):
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{where}: want an object, got {got!r}"
        for key, value in want.items():
            assert key in got, f"{where}.{key} missing"
            _subset(value, got[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert len(want) == len(got), f"{where}: want {len(want)} items, got {len(got)}"
        for i, (w, g) in enumerate(zip(want, got)):
            _subset(w, g, f"{where}[{i}]")
    else:
        assert want == got, f"{where}: want {want!r}, got {got!r}"


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_traffic_case(log):
    expect = json.loads(log.with_suffix(".expect.json").read_text())
    report = build(analyse(str(log)))
    _subset(expect["runtime"], report["runtime"])
    names = {f["name"] for f in report["findings"]}
    assert set(expect.get("findings", ())) <= names
    assert not set(expect.get("not_findings", ())) & names
    assert report["source"]["analyzed_launch"] == expect.get("analyzed_launch", 1)
    # every cited traffic line is the file's line, word for word
    lines = log.read_text().splitlines()
    cited = list(report["runtime"]["evidence"].values())
    cited += [e for f in report["findings"] for e in f["evidence"] if e["kind"] in ("TrafficSummary", "TrafficMark")]
    for e in cited:  # a request line, which may hold a whole prompt, is cited by its head
        line = lines[e["line"] - 1]
        assert line == e["text"] or (e["text"].endswith(" …") and line.startswith(e["text"][:-2])), e


def test_fractions_and_shares_lie_in_0_1():
    for log in LOGS:
        rt = build(analyse(str(log)))["runtime"]
        for entry in [rt, *rt["ranks"]]:
            usage = entry["kv_usage"] or {}
            for key, value in usage.items():
                assert 0 <= value <= 1, (log.name, key, value)


def test_no_traffic_lines_give_null():
    log = CASES.parent / "fixtures" / "crash_capture.log"
    assert build(analyse(str(log)))["runtime"] is None


def test_switch_turns_the_section_off():
    log = CASES / "sglang-v04-period.log"
    off = analyse(str(log), runtime=False)
    assert not [f for f in off.launch.facts if isinstance(f, (F.TrafficSummary, F.TrafficMark))]
    assert build(off)["runtime"] is None
    result = CliRunner().invoke(main, ["explain", str(log), "--no-runtime", "--format", "json"], standalone_mode=False)
    assert json.loads(result.output)["runtime"] is None
    assert "kv-retractions" not in result.output


def test_text_and_html_show_the_section():
    log = CASES / "sglang-v05-tp0.log"
    report = build(analyse(str(log)))
    text = render(report, "text")
    assert "RUN TIME (the server's own traffic lines: 4 from 2026-02-01 12:00:01 to 2026-02-01 12:00:04)" in text
    assert "|▁▁▂▂|" in text  # the sparkline: 0.05, 0.07, 0.15, 0.16 of a full pool
    html = render(report, "html")
    assert 'class="runtime-chart"' in html and "<polyline" in html
    markdown = render(report, "markdown")
    assert "## Run time (the server's own traffic lines)" in markdown
    assert "| TP0 | 4 | 16 % | 7 % | 16 % | 16 % | 0.0 % | 0.0 % | 48 / 48 | 31 | request limit | 1 |" in markdown


# ---- the aggregator itself ----------------------------------------------------------------

DECODE = ("[2026-05-01 10:{m:02d}:{s:02d} TP0] Decode batch, #running-req: {r}, #token: {t}, token usage: {u:.2f}, "
          "cuda graph: True, gen throughput (token/s): {g:.2f}, #queue-req: {q}")
PREFILL = ("[2026-05-01 10:{m:02d}:{s:02d} TP0] Prefill batch, #new-seq: {n}, #new-token: {t}, #cached-token: 0, "
           "token usage: {u:.2f}, #running-req: {r}, #queue-req: {q}, #pending-token: 0, cuda graph: False, "
           "input throughput (token/s): {g:.2f}")


def _traffic(rng: random.Random, count: int) -> list[str]:
    out = []
    for i in range(count):
        fields = dict(m=i // 60 % 60, s=i % 60, r=rng.randint(0, 64), t=rng.randint(1, 9000), u=rng.random(),
                      g=rng.uniform(1, 5000), q=rng.choice((0, 0, rng.randint(1, 9))), n=rng.randint(1, 4))
        out.append((DECODE if rng.random() < 0.75 else PREFILL).format(**fields))
    return out


def _blocks(lines: list[str], size: int) -> list[tuple[int, bytes]]:
    return [(i + 1, ("\n".join(lines[i:i + size]) + "\n").encode()) for i in range(0, len(lines), size)]


def test_fast_and_line_by_line_reading_agree(monkeypatch):
    lines = _traffic(random.Random(3), 900)
    a, b = TrafficAggregator(), TrafficAggregator()
    monkeypatch.setattr(b, "_sglang_fast", lambda *args: False)
    for sink in (a, b):
        list(candidate_runs(_blocks(lines, 300), sink))
    # the series may cut its stretches elsewhere (by bytes, or by lines); every sum is the same
    assert [attrs.evolve(f, series=()) if isinstance(f, F.TrafficSummary) else f for f in a.facts()] == \
        [attrs.evolve(f, series=()) if isinstance(f, F.TrafficSummary) else f for f in b.facts()]
    summary = a.facts()[0]
    assert summary.lines == 900 and sum(n for *_, n in summary.samples) == 900


def test_block_boundaries_do_not_change_the_sums():
    lines = _traffic(random.Random(5), 500)
    one, many = TrafficAggregator(), TrafficAggregator()
    list(candidate_runs(_blocks(lines, 500), one))
    list(candidate_runs(_blocks(lines, 7), many))
    a, b = one.facts()[0], many.facts()[0]
    assert (a.lines, a.samples, a.peak_queue, a.throughput, a.context_tokens, a.prompt_tokens) == \
        (b.lines, b.samples, b.peak_queue, b.throughput, b.context_tokens, b.prompt_tokens)
    assert {m.mark: m.evidence.line for m in one.facts()[1:]} == {m.mark: m.evidence.line for m in many.facts()[1:]}


def test_memory_stays_bounded_on_a_long_run():
    """100,000 lines: the series is thinned to a bounded number of points, the histogram is keyed
    by printed values, so neither grows with the lines."""
    rng = random.Random(9)
    sink = TrafficAggregator()
    for first in range(1, 100_001, 2000):
        list(candidate_runs([(first, ("\n".join(_traffic(rng, 2000)) + "\n").encode())], sink))
    summary = sink.facts()[0]
    assert summary.lines == 100_000
    assert len(summary.series) <= 2 * SERIES_POINTS
    assert len(summary.samples) <= 101 * 2 * 65  # usage values × queued or not × running counts


def test_ansi_coloured_traffic_lines_are_read():
    line = "\x1b[32m[2026-05-01 10:00:01]\x1b[0m Decode batch, #running-req: 3, #token: 90, token usage: 0.42, " \
           "cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 0"
    sink = TrafficAggregator()
    list(candidate_runs([(1, (line + "\n").encode())], sink))
    summary = sink.facts()[0]
    assert summary.lines == 1 and summary.samples == ((0.42, False, 3, 1),)


@settings(max_examples=60, deadline=None)
@given(st.booleans(), st.lists(st.sampled_from(["batch", "retract", "noise"]), max_size=40), st.integers(0, 2**16))
def test_any_mix_of_lines_is_counted_exactly(vllm, kinds, seed):
    rng = random.Random(seed)
    noise = '[2026-05-01 10:00:00] INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK'
    if vllm:
        batch = ("INFO 05-01 10:00:00 [loggers.py:127] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
                 "Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
                 "GPU KV cache usage: 3.0%, Prefix cache hit rate: 0.0%")
        retract = ("WARNING 05-01 10:00:00 scheduler.py:1560] Sequence group 7 is preempted by PreemptionMode.SWAP "
                   "mode because there is not enough KV cache space. total_num_cumulative_preemption={n}")
    else:
        retract = ("[2026-05-01 10:00:00] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
                   "#new_token_ratio: 0.1000 -> 0.2000")
    lines = []
    for n, kind in enumerate(kinds, 1):
        if kind == "batch":
            lines.append(batch if vllm else _traffic(rng, 1)[0])
        else:
            lines.append(noise if kind == "noise" else retract.format(n=n))
    sink = TrafficAggregator()
    list(candidate_runs(_blocks(lines, 5) if lines else [], sink))
    summaries = [f for f in sink.facts() if isinstance(f, F.TrafficSummary)]
    assert sum(s.lines for s in summaries) == kinds.count("batch")
    if vllm:
        last = max((n for n, k in enumerate(kinds, 1) if k == "retract"), default=None)
        assert max((s.preemptions or 0 for s in summaries), default=0) == (last or 0)
    else:
        assert sum(s.retractions for s in summaries) == 2 * kinds.count("retract")


def test_every_documented_wording_is_summed():
    """references/log-patterns.md section 5 lists the traffic wordings: each is read."""
    from tests.test_log_patterns_doc import DOC, examples

    wordings = [e for e in examples(DOC) if e.section == "5"]
    assert len(wordings) >= 12
    for example in wordings:
        sink = TrafficAggregator()
        list(candidate_runs([(1, (example.text + "\n").encode())], sink))
        summary = next((f for f in sink.facts() if isinstance(f, (F.TrafficSummary, F.RequestLengths))), None)
        assert summary is not None, example.text
        if isinstance(summary, F.RequestLengths):  # a request line: its prompt's ids and its max_tokens
            assert summary.requests == 1 and summary.prompt_lengths and summary.max_tokens, example.text
        else:
            assert summary.lines == 1 or summary.retractions or summary.preemptions, example.text


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_every_case_renders_in_every_format(log):
    report = build(analyse(str(log)))
    for fmt in ("text", "markdown", "html"):
        out = render(report, fmt)
        assert "traffic lines" in out or "request lines, no metrics lines" in out


_RETRACTING = (CASES.parent / "rule_cases" / "kv-retractions" / "fires.log").read_text()


@settings(max_examples=30, deadline=None)
@given(fraction=st.integers(50, 99), before=st.integers(2000, 9000), free=st.integers(0, 3000),
       gained=st.integers(0, 400000))
def test_retraction_advice_stays_inside_0_1(fraction, before, free, gained):
    """Whatever the start-up's figures, a suggested mem_fraction_static lies between the one in
    use and 1, and asks for no more than the start-up left free."""
    log = (_RETRACTING.replace("mem_fraction_static=0.86", f"mem_fraction_static=0.{fraction}")
           .replace("avail mem=78.50 GB", f"avail mem={before / 100:.2f} GB")
           .replace("available_gpu_mem=12.40 GB", f"available_gpu_mem={free / 100:.2f} GB")
           .replace("#new_tokens_gained: 646", f"#new_tokens_gained: {gained}"))
    with tempfile.TemporaryDirectory() as where:
        path = Path(where) / "retract.log"
        path.write_text(log)
        report = build(analyse(str(path)))
    found = next(f for f in report["findings"] if f["name"] == "kv-retractions")
    if "→" in found["message"]:
        now, suggested = (float(x) for x in found["message"].split("mem_fraction_static ")[1].split(" would")[0].split(" → "))
        assert now == fraction / 100 and now < suggested < 1
        assert found["detail"]["tokens_missing"] == gained > 0
        short = gained * report["kv_pool"]["bytes_per_token"] / (1 << 30)
        assert short < free / 100


@pytest.mark.parametrize("edit, mean, reason", [
    # a server_args repr without the field: that SGLang had no pages (one token a page)
    (lambda log: log.replace(", page_size=1", ""), 2208, None),
    # the field's absence proves nothing when the repr is cut short
    (lambda log: log.replace(", page_size=1", ", ..."), None, "page_size is not stated"),
])
def test_mean_prompt_needs_the_page_size(tmp_path, edit, mean, reason):
    log = (CASES / "sglang-chunked-prefill.log").read_text().replace("#new-token: 8192,", "#new-token: 4000,")
    path = tmp_path / "paged.log"
    path.write_text(edit(log))
    lengths = build(analyse(str(path)))["runtime"]["observed_lengths"]
    assert lengths["prompt_tokens_per_prefill_entry"] == round((4000 + 1024 + 3808) / 4)
    assert lengths["mean_prompt_tokens"] == mean
    assert (lengths["mean_prompt_unknown_reason"] or "").endswith(reason or "")


def test_runtime_premises_name_their_rank_and_figures():
    """A finding resting on run-time summaries names each by its rank and headline figures, in
    every format (not a rank key tuple and a dict), and JSON's premise leaves the series out."""
    report = build(analyse(str(CASES / "sglang-dp-attention.log")))
    binds = next(f for f in report["findings"] if f["name"] == "kv-capacity-binds")
    runtime = [b for b in binds["because"] if b["topic"] == "runtime"]
    assert [(b["key"], b["rank"]) for b in runtime] == [("all", None), ([0, 0, 0, ""], "DP0 TP0"),
                                                        ([1, 0, 1, ""], "DP1 TP1")]
    assert all("series" not in b["value"] for b in runtime)
    assert runtime[2]["value"]["kv_usage"]["p90"] == 0.93
    wanted = ("runtime of DP1 TP1 = KV usage p90 93 %, ≥ 90 % in 50.0 % of lines; running peak 6 of the limit 48; "
              "queued peak 4 (1 with KV ≥ 90 %, 0 at the request limit, 1 otherwise)")
    for fmt in ("text", "markdown", "html"):
        out = " ".join(render(report, fmt).split())
        assert "[0, 0, 0" not in out and "{'lines'" not in out and "{&#39;lines" not in out, fmt
        assert "runtime of all ranks = KV usage p90 93 %" in out, fmt
        assert wanted in out, fmt


def test_traffic_alone_is_read_and_every_start_up_figure_is_unknown():
    # an excerpt pasted from a running server: no start-up line, request traffic only
    report = build(analyse(str(CASES / "sglang-traffic-only-excerpt.log")))
    source = report["source"]
    assert report["framework"] == "sglang" and source["traffic_only"] and source["ready"]
    assert source["phase_reached"] == "ready" and source["stopped_at"] is None
    assert {row["status"] for row in report["breakdown"]} == {"unknown"}
    assert report["runtime"]["retractions"] == 3
    text = render(report, "text")
    assert "Start-up: not in the log" in text and "Start-up stops" not in text
    # a start-up log with traffic is not traffic alone
    assert not build(analyse(str(CASES / "sglang-dp-attention.log")))["source"]["traffic_only"]
