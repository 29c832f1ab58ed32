"""The Python API: docs/api.md's examples run as doctests, `import capdiag` stays light, and the
CLI prints exactly what the API returns."""
from __future__ import annotations

import os

import doctest
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import capdiag
from capdiag.cli import main
from capdiag.errors import InputError
from helpers import fixture, run_entry

EXAMPLE_LOG = str(Path(capdiag.__file__).resolve().parent / "examples" / "sglang-llama31-8b-h100.log")

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_page_examples_run(monkeypatch):
    monkeypatch.chdir(ROOT)
    page = ROOT / "docs" / "api.md"
    # a code fence ends an example's expected output, as a blank line does for doctest
    text = re.sub(r"^```.*$", "", page.read_text(encoding="utf-8"), flags=re.M)
    test = doctest.DocTestParser().get_doctest(text, {}, "api.md", str(page), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 30 and result.failed == 0


def test_import_capdiag_loads_no_analysis():
    code = ("import sys, capdiag; heavy = ('lark', 'jinja2', 'click', 'attrs', 'capdiag.api', 'capdiag.analysis');"
            "print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == "[]"


def test_the_cli_prints_what_the_api_returns():
    out = CliRunner().invoke(main, ["explain", fixture("mla_tp2.log"), "--format", "json"]).output
    assert json.loads(out) == capdiag.explain(fixture("mla_tp2.log")).to_dict()
    text = CliRunner().invoke(main, ["explain", fixture("mla_tp2.log")], env={"COLUMNS": "90"}).output
    assert text == capdiag.explain(fixture("mla_tp2.log")).render("text", width=90)


@pytest.mark.parametrize("kwargs, message", [
    ({"gpu": "quantum9000"}, "gpu='quantum9000'"),
    ({"target_rank": 7}, "target_rank=7"),
    ({"what_if": {"mem_fraction_static": 2}}, "a fraction between 0 and 1"),
])
def test_errors_are_one_type_with_the_cli_message(kwargs, message):
    with pytest.raises(capdiag.InputError) as info:
        capdiag.explain(fixture("single_gpu_ready.log"), **kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_an_unknown_format_is_an_input_error():
    with pytest.raises(capdiag.InputError, match="fmt='pdf'"):
        capdiag.explain(fixture("single_gpu_ready.log")).render("pdf")


def test_a_text_stream_and_bytes_read_like_the_file():
    path = fixture("vllm_v092_tp2.log")
    expected = capdiag.explain(path).to_dict()
    with open(path, encoding="utf-8") as fh:
        from_stream = capdiag.explain(fh).to_dict()
    from_bytes = capdiag.explain(Path(path).read_bytes()).to_dict()
    for got in (from_stream, from_bytes):
        assert got["breakdown"] == expected["breakdown"] and got["findings"] == expected["findings"]


@pytest.mark.parametrize("call, message", [
    (lambda: capdiag.explain(EXAMPLE_LOG, token_lengths=[0]), "token_lengths=0: a whole number ≥ 1"),
    (lambda: capdiag.explain(EXAMPLE_LOG, token_lengths=[-5]), "token_lengths=-5: a whole number ≥ 1"),
    (lambda: capdiag.explain(EXAMPLE_LOG, token_lengths=[]), "token_lengths: give at least one length"),
    (lambda: capdiag.explain(EXAMPLE_LOG, token_lengths="4096"), "token_lengths='4096': a list of whole numbers"),
    (lambda: capdiag.explain(EXAMPLE_LOG, launch=0), "launch=0: a whole number ≥ 1"),
    (lambda: capdiag.gate([]), "a gate over no log would pass"),
    (lambda: capdiag.plan(params="8B", layers=32, kv_heads=8, head_dim=128, fraction=1.5), "fraction=1.5: a number > 0 and < 1"),
    (lambda: capdiag.plan(params="8B", layers=32, kv_heads=8, head_dim=128, tp=-2), "tp=-2: a whole number ≥ 1"),
    (lambda: capdiag.plan(params="8B", layers=32, kv_heads=8, head_dim=128, contexts=[-1]), "contexts=-1"),
    (lambda: capdiag.plan(params="8B", layers=float("nan"), kv_heads=8, head_dim=128), "layers=nan"),
    # an int is no path: open() would take it as a file descriptor (1: the caller's stdout, closed after)
    (lambda: capdiag.explain(EXAMPLE_LOG, config_json=1), "a file is given by its path"),
    (lambda: capdiag.explain(EXAMPLE_LOG, nvidia_smi=1), "a file is given by its path"),
    (lambda: capdiag.gate([EXAMPLE_LOG], policy=1), "a file is given by its path"),
    (lambda: capdiag.gate([EXAMPLE_LOG], baseline=1), "a file is given by its path"),
])
def test_the_api_refuses_what_the_cli_refuses(call, message):
    """The same refusal as the CLI's, naming the option as the parameter it is from Python."""
    with pytest.raises(InputError) as refused:
        call()
    assert message in str(refused.value)
    os.fstat(1)  # the process's stdout is still open


@pytest.mark.parametrize("args, message", [
    (["explain", "EXAMPLE", "--token-lengths", "0"], "--token-lengths 0: a whole number ≥ 1"),
    (["plan", "--params", "8B", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--fraction", "1.5"],
     "--fraction 1.5: a number > 0 and < 1"),
    (["plan", "--params", "8B", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--tp", "-2"],
     "--tp -2: a whole number ≥ 1"),
])
def test_the_cli_says_what_the_api_says(args, message, monkeypatch, capsys):
    args = [EXAMPLE_LOG if a == "EXAMPLE" else a for a in args]
    code, out, err = run_entry(monkeypatch, capsys, *args)
    assert code == 2 and message in err and "Traceback" not in err


def test_errors_name_options_as_the_caller_spells_them(monkeypatch, capsys):
    """From Python an option is a parameter (`gpu='a100'`); from the command line, a flag."""
    with pytest.raises(capdiag.InputError) as refused:
        capdiag.explain(EXAMPLE_LOG, gpu="a100")
    assert str(refused.value).startswith("gpu='a100': could be a100_40gb_sxm") and "--" not in str(refused.value)
    with pytest.raises(capdiag.InputError, match=r"^token_lengths=0: a whole number"):
        capdiag.explain(EXAMPLE_LOG, token_lengths=[0])
    with pytest.raises(capdiag.InputError, match=r"^fmt='pdf': one of text"):
        capdiag.explain(EXAMPLE_LOG).render("pdf")
    code, _, err = run_entry(monkeypatch, capsys, "explain", EXAMPLE_LOG, "--gpu", "a100")
    assert code == 2 and err.startswith("capdiag: error: --gpu a100: could be")
    # the command line's naming does not outlive the command
    with pytest.raises(capdiag.InputError, match=r"^gpu='a100'"):
        capdiag.explain(EXAMPLE_LOG, gpu="a100")


def test_the_trace_names_a_conclusion_without_a_key_by_its_topic():
    trace = capdiag.explain(EXAMPLE_LOG).trace(["breakdown.*", "kv-pool.*"])
    assert ".None" not in trace and "from target_rank = " in trace


def test_a_report_in_a_notebook():
    """A DataFrame of the breakdown has a column per field (the rows are dataclasses), each row
    has to_dict(), and the report shows itself as an escaped HTML fragment."""
    import dataclasses
    report = capdiag.explain(EXAMPLE_LOG, gpu="h100_sxm")
    row = report.breakdown[1]
    assert dataclasses.is_dataclass(row) and row.to_dict()["category"] == "weights" and row.to_dict()["gib"] == 14.99
    assert [f.name for f in dataclasses.fields(row)] == ["category", "gib", "status", "derivation", "rule",
                                                         "evidence", "parent"]
    assert report.findings[0].to_dict()["code"] == report.findings[0].code
    html = report._repr_html_()
    assert html.startswith('<div class="capdiag-report">') and "<style" not in html and "<html" not in html
    assert "<td>unattributed</td><td>0.18</td>" in html and "<td>└ other</td>" in html
    odd = capdiag.api.Report({**report.to_dict(), "source": {**report.to_dict()["source"], "path": "<b>x</b>.log"}})
    assert "&lt;b&gt;x&lt;/b&gt;.log" in odd._repr_html_() and "<b>x</b>" not in odd._repr_html_()
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(report.breakdown)
    assert list(frame.columns[:3]) == ["category", "gib", "status"]
    assert frame.set_index("category").loc["kv_cache", "gib"] == 50.74
