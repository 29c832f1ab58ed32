"""The command line: `capdiag explain`, `capdiag facts`, and input errors as exit code 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from capdiag.cli import main
from capdiag.render import FORMATS
from helpers import fixture, run_entry

LOG = fixture("single_gpu_ready.log")
CAPDIAG = Path(sys.executable).with_name("capdiag")


def invoke(*args: str):
    """`main` as the entry point calls it (standalone_mode=False): errors come back as exceptions."""
    result = CliRunner().invoke(main, list(args), standalone_mode=False, catch_exceptions=True)
    return result


# ---- explain --------------------------------------------------------------------------------

def test_explain_text():
    result = invoke("explain", LOG)
    assert result.exception is None, result.output
    out = result.output
    assert "MEMORY BREAKDOWN" in out and "CONCURRENCY" in out and "FINDINGS" in out
    assert "15.10" in out and "48.82" in out and "1.60" in out  # weights, kv (24.41 × 2), graphs
    assert "0.86" in out  # the stated mem_fraction_static


def test_explain_json_is_the_report_contract():
    result = invoke("explain", LOG, "--format", "json")
    assert result.exception is None
    report = json.loads(result.output)
    assert report["schema"] == "capdiag.report/1" and report["framework"] == "sglang"
    rows = {r["category"]: r["gib"] for r in report["breakdown"]}
    assert (rows["weights"], rows["kv_cache"], rows["cuda_graph"]) == (15.1, 48.82, 1.6)
    assert [c["max_concurrent"] for c in report["concurrency"]] == [48, 48, 48]
    # every observed key the contract names is there, null where the log does not print it
    from capdiag.observed import CONTRACT_KEYS, OOM_KEYS
    for observed in [report["observed"]] + [r["observed"] for r in report["ranks"]]:
        assert set(CONTRACT_KEYS["sglang"] + OOM_KEYS) <= set(observed)
    assert report["observed"]["weight_mem_usage_gib"] == 15.1 and report["observed"]["kv_size_gib"] is None


def test_explain_markdown():
    result = invoke("explain", LOG, "--format", "markdown")
    assert result.exception is None
    assert "|" in result.output and "15.10" in result.output


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_report_format_renders(fmt):
    """A format is its name in render.FORMATS and, unless written in code like JSON, its
    template: this is the test that says the two are wired to the CLI."""
    result = invoke("explain", LOG, "--format", fmt)
    assert result.exception is None, f"{fmt}: {result.exception!r}"
    assert "15.1" in result.output  # the weights, in every format


def test_explain_output_file(tmp_path):
    target = tmp_path / "report.json"
    result = invoke("explain", LOG, "--format", "json", "--output", str(target))
    assert result.exception is None and result.output == ""
    assert json.loads(target.read_text())["source"]["path"] == LOG


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_an_output_file_gets_the_umask_mode_and_keeps_an_old_files(tmp_path, umask, mode):
    """A new -o file has the mode any new file gets (a web server can serve the HTML report); a
    file written over keeps its own."""
    target, old = tmp_path / "report.html", os.umask(umask)
    try:
        assert invoke("explain", LOG, "--format", "html", "-o", str(target)).exception is None
        assert target.stat().st_mode & 0o777 == mode
        target.chmod(0o640)
        assert invoke("explain", LOG, "--format", "html", "-o", str(target)).exception is None
        assert target.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


def test_explain_token_lengths():
    result = invoke("explain", LOG, "--format", "json", "--token-lengths", "1000,100000")
    assert result.exception is None
    rows = json.loads(result.output)["concurrency"]
    assert [(r["request_tokens"], r["token_limit"], r["max_concurrent"]) for r in rows] == \
        [(1000, 400, 48), (100000, 4, 4)]


def test_explain_gpu_options():
    by_total = json.loads(invoke("explain", LOG, "--format", "json", "--gpu-total-gib", "80").output)
    assert next(r for r in by_total["breakdown"] if r["category"] == "framework")["gib"] == 1.5  # 80 − 78.5
    by_alias = json.loads(invoke("explain", LOG, "--format", "json", "--gpu", "h100_sxm").output)
    assert by_alias["gpu"]["alias"] == "h100_sxm" and by_alias["gpu"]["total_gib"] == 79.65


def test_explain_target_rank_and_launch():
    rank1 = json.loads(invoke("explain", fixture("mla_tp2.log"), "--format", "json", "--target-rank", "1").output)
    assert rank1["target_rank"] == "TP1"
    second = json.loads(invoke("explain", fixture("restart_furthest_first.log"), "--format", "json",
                               "--launch", "2").output)
    assert second["source"]["analyzed_launch"] == 2 and second["source"]["launches"] == 2


def test_explain_reads_stdin():
    text = Path(LOG).read_text()
    result = CliRunner().invoke(main, ["explain", "-", "--format", "json"], input=text, standalone_mode=False)
    assert result.exception is None
    assert json.loads(result.output)["source"]["lines"] == len(text.splitlines())


# ---- facts ----------------------------------------------------------------------------------

def test_facts_json():
    result = invoke("facts", LOG, "--format", "json")
    assert result.exception is None
    rows = json.loads(result.output)
    assert [(r["line"], r["kind"]) for r in rows] == [
        (1, "ServerArgs"), (2, "TorchDistributedEnd"), (3, "LoadWeightBegin"), (4, "LoadWeightEnd"),
        (5, "KVCacheAllocated"), (6, "MemoryPoolEnd"), (7, "GraphCaptureBegin"), (8, "GraphCaptureEnd"),
        (9, "GraphCaptureBegin"), (10, "GraphCaptureEnd"), (11, "TokenBudget"), (13, "ServerReady"),
        # the two traffic lines, summed: no fact per line, a summary and the lines it cites
        (14, "TrafficSummary"), (14, "TrafficMark"), (14, "TrafficMark"), (15, "TrafficMark"), (15, "TrafficMark")]
    kv = rows[4]
    assert kv["values"]["k_gib"] == 24.41 and kv["values"]["tokens"] == 400000
    assert kv["launch"] == 1 and kv["role"] == "target" and kv["text"].startswith("[2025-12-10 10:00:06]")


def test_facts_text():
    result = invoke("facts", fixture("eagle_v0513.log"))
    assert result.exception is None
    lines = result.output.splitlines()
    assert len(lines) == 17  # every line of the fixture states a fact
    assert "LoadWeightEnd" in lines[8] and "draft" in lines[8] and "mem_usage_gib=1.0" in lines[8]
    assert "target" in lines[2] and "mem_usage_gib=15.1" in lines[2]


# ---- input errors: one line on stderr, exit 2, no traceback ---------------------------------------

def _binary(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x00\x01\x02\x00" * 2048)
    return str(path)


def _empty(tmp_path):
    path = tmp_path / "empty.log"
    path.write_text("")
    return str(path)


def _unrecognised(tmp_path):
    path = tmp_path / "other.log"
    path.write_text("hello\nworld\nINFO:     127.0.0.1:1 - \"GET / HTTP/1.1\" 200 OK\n")
    return str(path)


ERRORS = [
    ("missing", lambda t: ["explain", str(t / "missing.log")], "no such file"),
    ("directory", lambda t: ["explain", str(t)], "directory"),
    ("empty", lambda t: ["explain", _empty(t)], "empty"),
    ("binary", lambda t: ["explain", _binary(t)], "binary"),
    ("unrecognised", lambda t: ["explain", _unrecognised(t)], "3 lines"),
    ("bad-launch", lambda t: ["explain", LOG, "--launch", "5"], "--launch 5"),
    ("unknown-gpu", lambda t: ["explain", LOG, "--gpu", "quantum9000"], "--gpu quantum9000"),
    ("bad-target-rank", lambda t: ["explain", LOG, "--target-rank", "3"], "--target-rank 3"),
    ("negative-total", lambda t: ["explain", LOG, "--gpu-total-gib", "-1"], "positive"),
    ("unwritable-output", lambda t: ["explain", LOG, "--output", str(t / "no" / "such" / "dir.txt")], "cannot be written"),
    ("facts-missing", lambda t: ["facts", str(t / "missing.log")], "no such file"),
]


@pytest.mark.parametrize("name, argv, words", ERRORS, ids=[e[0] for e in ERRORS])
def test_input_errors_exit_2_with_one_line(name, argv, words, tmp_path, monkeypatch, capsys):
    code, out, err = run_entry(monkeypatch, capsys, *argv(tmp_path))
    assert code == 2
    assert "Traceback" not in err and "Traceback" not in out
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("capdiag: error:") and words in lines[0], err


@pytest.mark.parametrize("argv", [["explain", LOG, "--launch", "0"], ["explain", LOG, "--token-lengths", "a,b"],
                                  ["explain", LOG, "--token-lengths", "0"], ["explain", LOG, "--format", "pdf"]],
                         ids=["launch-0", "lengths-words", "lengths-zero", "format"])
def test_bad_options_exit_2_without_traceback(argv, monkeypatch, capsys):
    code, out, err = run_entry(monkeypatch, capsys, *argv)
    assert code == 2 and "Traceback" not in err and err.startswith("capdiag: error: ")


def test_bad_option_is_one_line(monkeypatch, capsys):
    code, out, err = run_entry(monkeypatch, capsys, "explain", LOG, "--launch", "0")
    assert code == 2 and len([l for l in err.splitlines() if l.strip()]) == 1


def test_corrupt_gzip_exits_2(tmp_path, monkeypatch, capsys):
    path = tmp_path / "bad.log.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage-not-gzip" * 10)
    code, out, err = run_entry(monkeypatch, capsys, "explain", str(path))
    assert code == 2 and "Traceback" not in err


# ---- the installed console script (a few, by subprocess) -------------------------------------------

needs_script = pytest.mark.skipif(not CAPDIAG.exists(), reason="console script not installed next to python")


@needs_script
def test_console_script_explains():
    proc = subprocess.run([str(CAPDIAG), "explain", LOG, "--format", "json"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["source"]["ready"] is True


@needs_script
@pytest.mark.parametrize("make", [lambda t: str(t / "missing.log"), _binary, _empty], ids=["missing", "binary", "empty"])
def test_console_script_exit_2(make, tmp_path):
    proc = subprocess.run([str(CAPDIAG), "explain", make(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("capdiag: error:")


def test_the_readme_example_is_what_the_code_prints():
    """README.md's example block is the text report of the bundled log, as printed at 200
    columns from the repository root: regenerated from the code, never edited by hand."""
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Example\n\n```\n", 1)[1].split("```", 1)[0]
    done = subprocess.run([sys.executable, "-m", "capdiag", "explain", "capdiag/examples/sglang-llama31-8b-h100.log",
                           "--gpu", "h100_sxm"], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    assert done.returncode == 0, done.stderr
    assert block == done.stdout


@pytest.mark.parametrize("encoding", ["cp1252", "latin-1", "ascii"])
def test_a_console_without_the_reports_characters_gets_question_marks_not_a_traceback(encoding):
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    for args, code in ((["explain", LOG], 0), (["gate", fixture("oom_capture.log")], 1)):
        done = subprocess.run([sys.executable, "-m", "capdiag", *args], capture_output=True, env=env, timeout=120)
        assert done.returncode == code and b"Traceback" not in done.stderr, done.stderr[-300:]
        assert b"MEMORY BREAKDOWN" in done.stdout or b"FAIL" in done.stdout
