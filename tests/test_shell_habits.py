"""The shell's habits: -h, a log piped in without `-`, a stream that stays open after the
ready line, text wrapped to the terminal, --color, the shared input options on every command
that reads logs, and a --trace that can be filtered and says why a rule did not fire."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from capdiag.cli import main
from helpers import fixture, run_entry

LOG = fixture("single_gpu_ready.log")
CAPDIAG = Path(sys.executable).with_name("capdiag")
needs_script = pytest.mark.skipif(not CAPDIAG.exists(), reason="console script not installed next to python")


def invoke(*args, input=None, env=None):
    return CliRunner().invoke(main, list(args), input=input, env=env, standalone_mode=False, catch_exceptions=True)


@pytest.mark.parametrize("argv", [["-h"], ["explain", "-h"], ["gate", "-h"], ["plan", "-h"], ["diff", "-h"],
                                  ["facts", "-h"], ["rules", "-h"], ["baseline", "-h"]])
def test_dash_h_is_help(argv):
    result = invoke(*argv)
    assert result.exception is None and result.output.startswith("Usage: ")


def test_a_piped_log_needs_no_dash():
    result = invoke("explain", "--format", "json", input=Path(LOG).read_bytes())
    assert result.exception is None, result.output
    report = json.loads(result.output)
    assert report["source"]["path"] == "-" and report["source"]["ready"] is True
    assert {r["category"]: r["gib"] for r in report["breakdown"]}["weights"] == 15.1


def test_no_log_and_a_terminal_on_stdin_is_one_line(monkeypatch, capsys):
    class Terminal:
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    code, _, err = run_entry(monkeypatch, capsys, "explain")
    assert code == 2 and err.startswith("capdiag: error: give a LOG") and len(err.splitlines()) == 1


def _open_stream(log: str, *args: str) -> tuple[subprocess.Popen, float]:
    """The console script reading a pipe that gets `log` and then stays open."""
    proc = subprocess.Popen([str(CAPDIAG), "explain", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdin.write(Path(log).read_bytes())
    proc.stdin.flush()
    return proc, time.monotonic()


@needs_script
@pytest.mark.parametrize("log, phase", [(LOG, "ready"), (fixture("oom_capture.log"), "graph_capture")])
def test_a_stream_that_stays_open_is_reported_once_the_startup_is_over(log, phase):
    proc, start = _open_stream(log, "--format", "json")
    try:
        out, err = proc.communicate(timeout=20)  # the pipe is never closed by the writer
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert time.monotonic() - start < 20
    report = json.loads(out)
    assert report["source"]["phase_reached"] == phase and report["source"]["path"] == "-"


@needs_script
def test_a_stream_before_the_ready_line_is_waited_for():
    lines = Path(LOG).read_text().splitlines(keepends=True)
    ready = next(i for i, line in enumerate(lines) if "ready to roll" in line)
    proc = subprocess.Popen([str(CAPDIAG), "explain", "--format", "json"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write("".join(lines[:ready]).encode())
        proc.stdin.flush()
        time.sleep(1.0)
        assert proc.poll() is None  # not ready yet: still reading
        proc.stdin.write("".join(lines[ready:]).encode())
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert json.loads(out)["source"]["ready"] is True


def test_to_end_reads_a_pipe_to_its_end():
    result = invoke("explain", "-", "--to-end", "--format", "json", input=Path(LOG).read_bytes())
    assert result.exception is None and json.loads(result.output)["source"]["ready"] is True


@pytest.mark.parametrize("columns", [60, 80, 132])
def test_text_wraps_to_columns_and_cuts_no_derivation(columns):
    result = invoke("explain", fixture("mla_tp2.log"), "--gpu-total-gib", "80", env={"COLUMNS": str(columns)})
    assert result.exception is None
    # the header's path stays whole however deep the checkout (a word longer than a line is not cut)
    lines = [line for line in result.output.splitlines() if fixture("mla_tp2.log") not in line]
    assert max(len(line) for line in lines) <= columns
    joined = re.sub(r"\n +", " ", result.output)
    for row in json.loads(invoke("explain", fixture("mla_tp2.log"), "--gpu-total-gib", "80", "--format",
                                 "json").output)["breakdown"]:
        assert row["derivation"] in joined  # whole, not cut with "…"


def test_a_path_longer_than_a_line_is_not_cut(tmp_path):
    """A log under a deep directory: its path in the header stays whole, to copy or grep for."""
    deep = tmp_path / ("deployments-" + "x" * 70) / "sglang-startup.log"
    deep.parent.mkdir()
    deep.write_bytes(Path(fixture("mla_tp2.log")).read_bytes())
    result = invoke("explain", str(deep), "--gpu-total-gib", "80", env={"COLUMNS": "60"})
    assert result.exception is None
    assert any(line.startswith(str(deep)) for line in result.output.splitlines())
    assert max(len(line) for line in result.output.splitlines() if str(deep) not in line) <= 60


def test_width_is_100_without_a_terminal(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    result = invoke("explain", fixture("mla_tp2.log"))
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 100 and any(len(line) > 90 for line in lines)


def test_color_always_colours_bars_and_severities():
    out = invoke("explain", LOG, "--gpu", "h100_sxm", "--color", "always", env={"NO_COLOR": "1"}).output
    assert "\x1b[" in out
    severity = re.search(r"\[(INFO|WARNING|ERROR)\]", click.unstyle(out)).group(0)
    assert re.search(r"\x1b\[[0-9;]+m" + re.escape(severity), out)


@pytest.mark.parametrize("args, env", [(["--color", "never"], {}), (["--no-color"], {}), ([], {}),
                                       (["--color", "auto"], {"NO_COLOR": "1"})])
def test_no_colour_unless_asked_or_a_terminal(args, env):
    out = invoke("explain", LOG, "--gpu", "h100_sxm", *args, env=env).output
    assert "\x1b" not in out and "[INFO]" in out


@pytest.mark.parametrize("command", [["gate"], ["baseline", "-o", "{tmp}/b.json"], ["diff", LOG]])
def test_shared_input_options_on_every_log_command(command, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in command] + [LOG, "--target-rank", "tp0", "--launch", "1",
                                                                   "--what-if", "mem_fraction_static=0.9"]
    result = invoke(*argv)
    assert not isinstance(result.exception, click.UsageError), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit) and result.exception.code in (0, 1)


@pytest.mark.parametrize("command", [["gate"], ["diff", LOG]])
def test_shared_input_options_are_checked_the_same(command, monkeypatch, capsys):
    code, out, err = run_entry(monkeypatch, capsys, *command, LOG, "--launch", "5")
    assert code == 2 and "--launch 5: the log holds 1 launch(es)" in out + err


def test_trace_filtered_by_rule_shows_inputs_values_and_misses(monkeypatch, capsys):
    code, _, err = run_entry(monkeypatch, capsys, "explain", LOG, "--format", "json",
                             "--trace", "breakdown.weights,CD110", "--trace", "unexplained-memory")
    assert code == 0
    assert re.search(r"^#\d+ breakdown\.weights → breakdown\.weights = 15\.1$", err, re.M)
    assert "from LoadWeightEnd (line" in err
    assert re.search(r"^-- unexplained-memory did not fire: needs .*--nvidia-smi-file", re.sub(r"\n +", " ", err),
                     re.M)
    assert "-- thin-headroom did not fire: " in err  # plenty of headroom: a rule that judged and passed
    assert "target-rank" not in err  # other rules are left out
    assert "= None" not in err


def test_trace_shows_a_finding_by_severity_and_title(monkeypatch, capsys):
    code, _, err = run_entry(monkeypatch, capsys, "explain", LOG, "--format", "json", "--trace")
    finding = next(line for line in err.splitlines() if "→ finding." in line)
    assert re.search(r"= \[(INFO|WARNING|ERROR)\] \w", finding) and "= None" not in err


def test_trace_of_an_unknown_rule_is_one_line(monkeypatch, capsys):
    code, _, err = run_entry(monkeypatch, capsys, "explain", LOG, "--trace", "no-such-rule")
    assert code == 2 and err.startswith("capdiag: error: --trace no-such-rule:") and len(err.splitlines()) == 1


def test_trace_patterns_match_codes_and_say_why_a_rule_had_nothing_to_judge(monkeypatch, capsys):
    code, _, err = run_entry(monkeypatch, capsys, "explain", LOG, "--format", "json", "--trace", "CD10*")
    assert code == 0
    assert re.search(r"^-- utilization-too-high did not fire: applies to vllm logs only$", err, re.M)
    assert "excess-headroom" not in err  # CD111 is not CD10*
    code, _, err = run_entry(monkeypatch, capsys, "explain", LOG, "--format", "json", "--trace", "CD102")
    assert "-- out-of-memory did not fire: " in err


def test_a_path_whose_name_holds_a_newline_is_a_path(tmp_path, monkeypatch, capsys):
    """A file name may hold a newline; on the command line (and in a directory) it names a file,
    never the log's text, and no output line is broken by it."""
    odd = tmp_path / "odd\nname.log"
    odd.write_text(Path(LOG).read_text())
    code, out, _ = run_entry(monkeypatch, capsys, "explain", str(odd), "--format", "json")
    assert code == 0 and json.loads(out)["source"]["path"] == str(odd) and json.loads(out)["framework"] == "sglang"
    code, out, _ = run_entry(monkeypatch, capsys, "gate", str(odd))
    assert code == 0 and f"{tmp_path}/odd\\nname.log: sglang" in out
    code, out, _ = run_entry(monkeypatch, capsys, "diff", str(odd), str(odd))
    assert code == 0 and "CONFIGURATION CHANGES (0)" in out
    code, out, _ = run_entry(monkeypatch, capsys, "explain", str(tmp_path), "--format", "jsonl")
    assert code == 0 and json.loads(out.splitlines()[0])["source"]["path"] == str(odd)
    code, _, err = run_entry(monkeypatch, capsys, "explain", str(tmp_path / "gone\nname.log"))
    assert code == 2 and "no such file" in err and "neither an SGLang" not in err


def test_a_crash_is_an_error_exit_never_a_failing_gates_1(monkeypatch, capsys):
    """A bug inside capdiag exits 2 with one line (CI tells it from a gate that failed, exit 1),
    and shows the traceback only when asked."""
    import capdiag.api
    from capdiag.cli import run

    def broken(*args, **kwargs):
        raise KeyError("secret-token-123")
    monkeypatch.setattr(capdiag.api, "gate", broken)
    monkeypatch.setattr(sys, "argv", ["capdiag", "gate", LOG])
    with pytest.raises(SystemExit) as ended:
        run()
    err = capsys.readouterr().err
    assert ended.value.code == 2
    assert err.startswith("capdiag: error: internal error (KeyError): capdiag could not finish; this is a bug")
    assert "secret-token-123" not in err and "Traceback" not in err
    monkeypatch.setenv("CAPDIAG_TRACEBACK", "1")
    with pytest.raises(SystemExit) as ended:
        run()
    assert ended.value.code == 2 and "Traceback (most recent call last)" in capsys.readouterr().err
