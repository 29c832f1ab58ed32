"""Hostile input, class by class (issue 14): every case gives a report or one error line with
exit code 2, never a traceback, never an invented value, and no output carries a control
character or markup from the input. Fixtures are the bundled example log and the test
fixtures, mutated here."""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
import xml.dom.minidom
from pathlib import Path

import pytest

from capdiag.analysis import analyse
from capdiag.api import Report
from capdiag.report import build
from capdiag.engine import Knowledge
from capdiag import facts as F
from capdiag.source import MAX_JOINED, candidate_lines
from helpers import FIXTURES, run_entry

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "capdiag" / "examples" / "sglang-llama31-8b-h100.log"
TEXT = EXAMPLE.read_text()
VLLM = (FIXTURES / "vllm_v011_max_num_seqs.log").read_text()
VLLM_V064 = (FIXTURES / "vllm_v064_max_seq_len.log").read_text()
CAPDIAG = [sys.executable, "-m", "capdiag"]


def _sub(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


def _log(tmp_path, text: str, name: str = "hostile.log") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _clean_exit(code: int, out: str, err: str, allowed=(0, 2)) -> None:
    assert "Traceback (most recent call last)" not in out + err, err
    assert code in allowed, (code, err)
    if code == 2:
        lines = [l for l in err.splitlines() if l.strip()]
        assert len(lines) == 1 and lines[0].startswith("capdiag: error:"), err


# ---- errors while turning a parsed line into facts --------------------------------------------

CONVERSION = {
    "tokens-1e400": ("max_total_num_tokens=415615", "max_total_num_tokens=1e400", 19),
    "digits-5000": ("#tokens: 415615", "#tokens: " + "9" * 5000, 13),
    "avail-1e308": ("avail mem=78.43 GB", "avail mem=1e308 GB", 5),
    "tp-tag-5000-digits": ("[2026-03-02 09:14:16] Load", "[2026-03-02 09:14:16 TP" + "1" * 5000 + "] Load", 5),
    "tp-tag-10^20": ("[2026-03-02 09:14:16] Load", "[2026-03-02 09:14:16 TP" + "1" * 21 + "] Load", 5),
}


@pytest.mark.parametrize("name", sorted(CONVERSION))
def test_a_line_that_cannot_become_a_fact_is_named_not_a_traceback(name, tmp_path, monkeypatch, capsys):
    old, new, line = CONVERSION[name]
    code, out, err = run_entry(monkeypatch, capsys, "explain", _log(tmp_path, _sub(TEXT, old, new)), "--format", "json")
    _clean_exit(code, out, err, allowed=(0,))
    report = json.loads(out)
    assert [u["line"] for u in report["source"]["unread_lines"]] == [line]
    # the value that line states is nowhere else in the report
    report["source"]["unread_lines"] = []
    rest = json.dumps(report)
    assert "1e+308" not in rest and "Infinity" not in rest and "NaN" not in rest and "9" * 30 not in rest


@pytest.mark.parametrize("value", ["[" * 1000 + "]" * 1000, "{'a': 1, [1, [2]]: 3}", "'\\UFFFFFFFF'",
                                   "9" * 5000, "1e400", "-1e400", "nan"])
def test_server_args_values_of_any_shape(value, tmp_path, monkeypatch, capsys):
    text = _sub(TEXT, "tokenizer_mode='auto'", f"tokenizer_mode={value}")
    code, out, err = run_entry(monkeypatch, capsys, "explain", _log(tmp_path, text), "--format", "json")
    _clean_exit(code, out, err, allowed=(0,))
    report = json.loads(out)
    assert report["config"]["tp_size"] == 1 or report["source"]["server_args"]["style"] == "unparsed"
    assert "Infinity" not in out and "NaN" not in out


def test_a_record_entry_out_of_range_is_dropped_and_named(tmp_path):
    text = _sub(TEXT, "mem_fraction_static=0.838", "mem_fraction_static=1e400")
    a = analyse(_log(tmp_path, text))
    assert a.knowledge.get("config", "mem_fraction_static").known is False
    notes = [f.reason for f in a.launch.facts if isinstance(f, F.UnreadLine)]
    assert notes and "mem_fraction_static" in notes[0]


# ---- arithmetic on zero, infinity and NaN -----------------------------------------------------

ARITHMETIC = {
    "kv-0.00": (TEXT, "K size: 25.37 GB, V size: 25.37 GB", "K size: 0.00 GB, V size: 0.00 GB"),
    "avail-0": (TEXT, "avail mem=78.43 GB", "avail mem=0 GB"),
    "avail-negative": (TEXT, "avail mem=78.43 GB", "avail mem=-1 GB"),
    "avail-nan": (TEXT, "avail mem=78.43 GB", "avail mem=nan GB"),
    "tokens-0": (TEXT, "#tokens: 415615", "#tokens: 0"),
    "vllm-kv-1e308": (VLLM, "Available KV cache memory: 4.75 GiB", "Available KV cache memory: 1e308 GiB"),
    "vllm-kv-0": (VLLM, "Available KV cache memory: 4.75 GiB", "Available KV cache memory: 0 GiB"),
    "vllm-concurrency-0": (VLLM, "Maximum concurrency for 32,000 tokens", "Maximum concurrency for 0 tokens"),
    # every figure of vLLM v0.6's profile line at 0: the GPU total among them (a budget of 0)
    "vllm-profile-all-0": (VLLM_V064, VLLM_V064.split("\n")[1], re.sub(r"\d+(?:\.\d+)?", "0", VLLM_V064.split("\n")[1])),
}


@pytest.mark.parametrize("name", sorted(ARITHMETIC))
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_zero_infinity_nan_in_the_log(name, fmt, tmp_path, monkeypatch, capsys):
    text, old, new = ARITHMETIC[name]
    code, out, err = run_entry(monkeypatch, capsys, "explain", _log(tmp_path, _sub(text, old, new)), "--format", fmt,
                               "--gpu", "h100_sxm")
    _clean_exit(code, out, err, allowed=(0,))
    if fmt == "json":
        for finding in json.loads(out)["findings"]:
            suggested = finding["detail"].get("suggested")
            assert suggested is None or 0 < suggested < 1


OPTIONS = [
    (["explain", str(EXAMPLE), "--gpu-total-gib", v], "--gpu-total-gib") for v in ("inf", "nan", "1e308", "-0", "0")
] + [
    (["explain", str(EXAMPLE), "--target-rank", "9" * 5000], "--target-rank"),
    (["explain", str(EXAMPLE), "--framework", "vllm"], "no vllm start-up line"),
    (["explain", str(EXAMPLE), "--token-lengths", "9" * 5000], "token-lengths"),
    (["explain", str(EXAMPLE), "--what-if", "page_size=" + "9" * 30], "--what-if"),
    (["explain", str(EXAMPLE), "--what-if", "mem_fraction_static=nan"], "--what-if"),
] + [(["plan", "--params", p, "--gpu", "h100_sxm"], "--params") for p in ("-70B", "nanB", "infB", "1e400B", "0B", "9" * 5000)]


@pytest.mark.parametrize("argv, words", OPTIONS, ids=[" ".join(a)[:50] for a, _ in OPTIONS])
def test_options_out_of_range_are_one_line_errors(argv, words, monkeypatch, capsys):
    code, out, err = run_entry(monkeypatch, capsys, *argv)
    _clean_exit(code, out, err, allowed=(2,))
    assert words in err and len(err) < 600


# ---- side inputs -------------------------------------------------------------------------------

CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
          "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}
CONFIGS = {
    "string-heads": ({"num_key_value_heads": "8"}, 2),
    "zero-heads": ({"num_key_value_heads": 0}, 2),
    "negative-layers": ({"num_hidden_layers": -4}, 2),
    "billion-layers": ({"num_hidden_layers": 1_000_000_000}, 2),
    "negative-head-dim": ({"head_dim": -128}, 2),
    "string-experts": ({"num_local_experts": "8"}, 2),
    "float-hidden": ({"hidden_size": 4096.5}, 2),
    "bool-heads": ({"num_attention_heads": True}, 2),
    "quant-string": ({"quantization_config": "fp8"}, 2),
    "quant-group-zero": ({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 0}}, 0),
    "quant-groups-not-objects": ({"quantization_config": {"config_groups": {"g": "w4"}}}, 0),
    "missing-hidden-size": ({"hidden_size": None}, 0),
    "missing-heads": ({"num_attention_heads": None, "num_key_value_heads": None}, 0),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_json_fields_are_validated(name, tmp_path, monkeypatch, capsys):
    change, want = CONFIGS[name]
    cfg = {k: v for k, v in {**CONFIG, **change}.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    start = time.monotonic()
    for argv in (["explain", str(EXAMPLE), "--config-json", str(path)],
                 ["plan", "--config-json", str(path), "--gpu", "h100_sxm"]):
        code, out, err = run_entry(monkeypatch, capsys, *argv)
        _clean_exit(code, out, err, allowed=(want,))
        assert "-" + "128" not in out.split("bytes per token")[-1][:40]
    assert time.monotonic() - start < 20


RAW_JSON = {
    "deep": "[" * 100_000 + "]" * 100_000,
    "deep-object": '{"a":' * 5000 + "1" + "}" * 5000,
    "utf16": json.dumps({"schema": "x"}).encode("utf-16"),
    "invalid-utf8": b'{"a": "\xff\xfe\xfa"}',
    "infinity": '{"num_hidden_layers": Infinity}',
    "digits": '{"num_hidden_layers": ' + "9" * 5000 + "}",
    "array": "[1, 2, 3]",
}


@pytest.mark.parametrize("name", sorted(RAW_JSON))
@pytest.mark.parametrize("flag", ["--config-json", "--baseline"])
def test_json_side_inputs_of_any_content(name, flag, tmp_path, monkeypatch, capsys):
    path = tmp_path / "side.json"
    data = RAW_JSON[name]
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    command = "explain" if flag == "--config-json" else "gate"
    code, out, err = run_entry(monkeypatch, capsys, command, str(EXAMPLE), flag, str(path))
    _clean_exit(code, out, err, allowed=(2,))


@pytest.mark.parametrize("entries", [[1, 2], ["x"], [None], [{"rule": "x"}], [[{"fingerprint": "a"}]]])
def test_baseline_entries_must_be_objects(entries, tmp_path, monkeypatch, capsys):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"schema": "capdiag.baseline/2", "entries": entries}))
    code, out, err = run_entry(monkeypatch, capsys, "gate", str(EXAMPLE), "--baseline", str(path))
    _clean_exit(code, out, err, allowed=(2,))


POLICIES = {
    "request-tokens-0": "[rules.low-concurrency]\nrequest_tokens = 0\n",
    "request-tokens-inf": "[rules.low-concurrency]\nrequest_tokens = inf\n",
    "request-tokens-fraction": "[rules.low-concurrency]\nrequest_tokens = 4096.5\n",
    "keep-nan": "[rules.excess-headroom]\nkeep_gib = nan\n",
    "keep-negative": "[rules.excess-headroom]\nkeep_gib = -3.0\n",
    "huge": "[rules.excess-headroom]\nkeep_gib = 1e300\n",
    "deep": "x = " + "[" * 100_000 + "]" * 100_000 + "\n",
    "not-utf8": b"fail-on = \"\xff\"\n",
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_thresholds_are_validated(name, tmp_path, monkeypatch, capsys):
    path = tmp_path / "capdiag.toml"
    data = POLICIES[name]
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    code, out, err = run_entry(monkeypatch, capsys, "gate", str(EXAMPLE), "--policy", str(path))
    _clean_exit(code, out, err, allowed=(2,))


def test_a_threshold_pair_that_would_give_a_negative_fraction_gives_no_advice(tmp_path, monkeypatch, capsys):
    path = tmp_path / "capdiag.toml"
    path.write_text("[rules.excess-headroom]\nkeep_gib = 100\nmax_free_gib = 1\n")
    code, out, err = run_entry(monkeypatch, capsys, "gate", str(EXAMPLE), "--policy", str(path), "--format", "json",
                               "--fail-on", "error")
    _clean_exit(code, out, err, allowed=(0,))
    assert "excess-headroom" not in out and "-0." not in out


SMI = {
    "unicode-digits": "index, memory.used [MiB], memory.free [MiB]\n0, ²³ MiB, 100 MiB\n",
    "negative": "index, memory.used [MiB], memory.free [MiB]\n0, -5 MiB, 100 MiB\n",
    "text": "index, memory.used [MiB], memory.free [MiB]\n0, lots MiB, 100 MiB\n",
    "huge-index": "0" * 5000 + ", 100, 100\n",
    "unicode-index": "٣, 100, 100\n",
    "huge-pid": "pid, process_name, used_gpu_memory [MiB]\n" + "9" * 5000 + ", python3, 9836 MiB\n",
    "unicode-pid": "pid, process_name, used_gpu_memory [MiB]\n٣٣, python3, 9836 MiB\n",
}


@pytest.mark.parametrize("name", sorted(SMI))
def test_nvidia_smi_cells_that_are_not_figures(name, tmp_path, monkeypatch, capsys):
    path = tmp_path / "smi.csv"
    path.write_text(SMI[name], encoding="utf-8")
    code, out, err = run_entry(monkeypatch, capsys, "explain", str(EXAMPLE), "--nvidia-smi-file", str(path))
    _clean_exit(code, out, err, allowed=(2,))


@pytest.mark.parametrize("version", ["0." + "9" * 5000 + ".1", "0.²7.1", "9" * 5000])
def test_a_vllm_version_of_any_digits_is_no_traceback(version, tmp_path, monkeypatch, capsys):
    text = (FIXTURES / "vllm_v0271_hybrid_tp2.log").read_text()
    code, out, err = run_entry(monkeypatch, capsys, "explain", _log(tmp_path, _sub(text, "(v0.27.1)", f"(v{version})")))
    _clean_exit(code, out, err, allowed=(0,))


def test_not_applicable_cells_stay_unknown(tmp_path, monkeypatch, capsys):
    path = tmp_path / "smi.csv"
    path.write_text("index, memory.used [MiB], memory.free [MiB]\n0, [N/A], [N/A]\n")
    code, out, err = run_entry(monkeypatch, capsys, "explain", str(EXAMPLE), "--nvidia-smi-file", str(path))
    _clean_exit(code, out, err, allowed=(0,))


@pytest.mark.parametrize("flag, command", [("--config-json", "explain"), ("--policy", "gate"), ("--baseline", "gate"),
                                           ("--nvidia-smi-file", "explain")])
def test_dev_zero_as_a_side_input_is_refused_quickly(flag, command, monkeypatch, capsys):
    start = time.monotonic()
    code, out, err = run_entry(monkeypatch, capsys, command, str(EXAMPLE), flag, "/dev/zero")
    _clean_exit(code, out, err, allowed=(2,))
    assert time.monotonic() - start < 10


# ---- streams and files -------------------------------------------------------------------------

def _run(args, **kwargs):
    done = subprocess.run(CAPDIAG + args, capture_output=True, text=True, timeout=60, cwd=REPO, **kwargs)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_closed_stdin_and_stdout():
    done = subprocess.run(CAPDIAG + ["explain", "-"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    closed_in = subprocess.run(" ".join(CAPDIAG) + " explain - <&-", shell=True, capture_output=True, text=True,
                               timeout=60, cwd=REPO)
    assert closed_in.returncode == 2 and "standard input is closed" in closed_in.stderr
    for args in (f"explain {EXAMPLE}", "--version"):
        closed_out = subprocess.run(" ".join(CAPDIAG) + f" {args} >&-", shell=True, capture_output=True,
                                    text=True, timeout=60, cwd=REPO)
        assert closed_out.returncode == 2 and "standard output is closed" in closed_out.stderr, args


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("args", [["--version"], ["rules"], ["explain", str(EXAMPLE)],
                                  ["explain", str(EXAMPLE), "--format", "json"]])
def test_a_full_disk_on_stdout_is_one_line(args):
    with open("/dev/full", "w") as full:
        done = subprocess.run(CAPDIAG + args, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "cannot be written" in done.stderr


@pytest.mark.parametrize("args, reader", [(f"explain {EXAMPLE} --format json", "head -c 10"),
                                          (f"explain {EXAMPLE}", "true"), (f"gate {EXAMPLE}", "true"),
                                          ("--version", "true"), ("--version", "head -c 1"), ("--help", "true"),
                                          ("explain --help", "true")])
def test_a_reader_that_goes_away_ends_the_run_quietly(args, reader):
    # exit code 141 (128 + SIGPIPE) when the write failed, as a shell's own commands end: not 1,
    # which click gives an EPIPE and a CI gate would read as failing findings
    done = subprocess.run(["bash", "-c", " ".join(CAPDIAG) + f" {args} | {reader}; exit ${{PIPESTATUS[0]}}"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr
    assert done.returncode in ((141,) if reader == "true" and args != "--version" else (0, 141)), done.returncode


def test_an_unreadable_file_is_one_line():
    done = _run(["explain", "/proc/self/mem"])
    assert done.returncode == 2


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))


def test_a_failed_output_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("the previous report\n")
    done = subprocess.run(CAPDIAG + ["explain", str(EXAMPLE), "--format", "json", "-o", str(target)],
                          capture_output=True, text=True, timeout=60, cwd=REPO, preexec_fn=_limit_file_size)
    assert done.returncode == 2 and "cannot be written" in done.stderr and "Traceback" not in done.stderr
    assert target.read_text() == "the previous report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temporary file left
    ok = _run(["explain", str(EXAMPLE), "--format", "json", "-o", str(target)])
    assert ok.returncode == 0 and json.loads(target.read_text())["framework"] == "sglang"


def test_an_output_that_is_no_regular_file_is_written_in_place(tmp_path):
    # renaming a temporary file over a FIFO (or /dev/null, as root) would replace it with a file
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    done = _run(["explain", str(EXAMPLE), "--format", "json", "-o", str(fifo)])
    reader.join(timeout=30)
    assert done.returncode == 0 and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got[0])["framework"] == "sglang"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]
    # a directory is refused in one line; a symlink's file is replaced, the link kept
    done = _run(["explain", str(EXAMPLE), "-o", str(tmp_path)])
    assert done.returncode == 2 and "is a directory" in done.stderr and len(done.stderr.splitlines()) == 1
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("old\n")
    link.symlink_to(real)
    assert _run(["explain", str(EXAMPLE), "--format", "json", "-o", str(link)]).returncode == 0
    assert link.is_symlink() and json.loads(real.read_text())["framework"] == "sglang"


# ---- .gz edge cases ---------------------------------------------------------------------------

def test_a_gz_with_trailing_garbage_is_refused_in_one_line(tmp_path):
    import gzip
    path = tmp_path / "trailing.log.gz"
    path.write_bytes(gzip.compress(TEXT.encode()) + b"garbage after the gzip stream\n")
    done = _run(["explain", str(path)])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"capdiag: error: {path}: not a whole gzip file: data that is not gzip "
                                        "follows its compressed stream (trailing garbage); `gunzip -c` "
                                        "decompresses the part before it"]
    piped = _run(["explain", "-"], input=None, stdin=open(path, "rb"))
    assert piped.returncode == 2 and "standard input: not a whole gzip file" in piped.stderr


def test_a_gz_padded_with_nuls_or_of_several_members_is_read_as_gunzip_reads_it(tmp_path):
    import gzip
    data = TEXT.encode()
    padded = tmp_path / "padded.log.gz"
    padded.write_bytes(gzip.compress(data) + b"\0" * 512)
    members = tmp_path / "members.log.gz"
    members.write_bytes(gzip.compress(data[:2000]) + gzip.compress(data[2000:]))
    for path in (padded, members):
        assert analyse(str(path)).knowledge.value("kv_pool", "tokens") == 415615


def test_a_gz_piped_to_stdin_is_decompressed(tmp_path, monkeypatch, capsys):
    import gzip
    path = tmp_path / "piped.log.gz"
    path.write_bytes(gzip.compress(TEXT.encode()))
    for args in (["explain", "-", "--format", "json"], ["explain", "--format", "json", "--until-ready"]):
        with open(path, "rb") as stdin:  # a real pipe's descriptor: the live-stream path
            done = _run(args, stdin=stdin)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["source"]["lines"] == 27 and report["observed"]["kv_tokens"] == 415615
    # in process, standard input without peek() (click's runner gives a BytesIO)
    from click.testing import CliRunner
    from capdiag.cli import main
    result = CliRunner().invoke(main, ["explain", "-", "--format", "json"], input=path.read_bytes())
    assert result.exit_code == 0 and json.loads(result.output)["observed"]["kv_tokens"] == 415615


def test_an_osc_sequence_ended_by_st_is_stripped_where_the_line_is_read():
    from capdiag.source import line_text
    raw = "\x1b]0;title by ST\x1b\\\x1b]8;;http://x\x1b\\[2026-03-02 09:14:16] Load weight begin. avail mem=78.43 GB" \
          "\x1b]2;bell\x07"
    assert line_text(raw.encode()) == "[2026-03-02 09:14:16] Load weight begin. avail mem=78.43 GB"
    # an OSC left open runs to the end of the line and is not stripped: printable() shows its ESC
    assert line_text(b"a \x1b]0;open") == "a \x1b]0;open"


# ---- duplicate per-rank lines -------------------------------------------------------------------

def _lines_with(index: int, extra: str) -> str:
    """The example log with `extra` put in after its line `index` (1-based)."""
    lines = TEXT.splitlines()
    return "\n".join(lines[:index] + [extra] + lines[index:]) + "\n"


@pytest.mark.parametrize("repeated", [1, 5], ids=["server_args", "load-weight-begin"])
def test_a_line_printed_twice_is_read_once_and_named(repeated, tmp_path):
    lines = TEXT.splitlines()
    a = analyse(_log(tmp_path, _lines_with(repeated, lines[repeated - 1])))
    assert len(a.launches) == 1 and a.launch.phase == "ready"
    unread = [f for f in a.launch.facts if isinstance(f, F.UnreadLine)]
    assert [(f.evidence.line, f.reason.split(": ", 1)[1]) for f in unread] == [
        (repeated + 1, f"repeats line {repeated} word for word (one line printed twice); read once")]
    assert a.knowledge.value("config", "mem_fraction_static") == 0.838
    assert a.knowledge.value("kv_pool", "tokens") == 415615
    report = json.loads(Report(build(a), a).to_json())
    assert report["source"]["unread_lines"] == [{"line": repeated + 1, "reason": unread[0].reason}]


def test_a_second_start_up_record_before_any_rank_printed_is_a_restart(tmp_path):
    first = TEXT.splitlines()[0].replace("mem_fraction_static=0.838", "mem_fraction_static=0.9").replace(
        "09:14:07", "09:13:01")
    a = analyse(_log(tmp_path, first + "\n" + TEXT))
    assert [(l.index, l.first_line, l.last_line, l.phase) for l in a.launches] == [(1, 1, 1, "init"), (2, 2, 28, "ready")]
    assert a.launches[0].ended_by == "line 2 opens another start-up record before any rank printed"
    assert a.launch.index == 2 and a.knowledge.value("config", "mem_fraction_static") == 0.838


def test_a_rank_loading_weights_again_without_a_draft_model_is_a_restart(tmp_path, monkeypatch, capsys):
    again = "[2026-03-02 09:15:02] Load weight begin. avail mem=78.40 GB"
    text = _lines_with(12, again)  # after Load weight end, before the KV pool: no draft is stated
    assert "speculative_algorithm=None" in text
    a = analyse(_log(tmp_path, text))
    assert [(l.first_line, l.phase) for l in a.launches] == [(1, "weights"), (13, "ready")]
    ended = "line 13: untagged (TP0) begins loading again (server_args states no draft model)"
    assert a.launches[0].ended_by == ended and a.launch.index == 2
    assert [f.avail_gib for f in a.launch.facts if isinstance(f, F.LoadWeightBegin)] == [78.40]
    code, out, err = run_entry(monkeypatch, capsys, "explain", _log(tmp_path, text), "--no-color")
    _clean_exit(code, out, err, allowed=(0,))
    assert f"launch 1: lines 1–12, reached weights; ended: {ended}" in " ".join(out.split())
    # with a draft model stated, the second load is the draft's, in the same launch
    spec = _sub(text, "speculative_algorithm=None", "speculative_algorithm='EAGLE'")
    b = analyse(_log(tmp_path, spec, "spec.log"))
    assert len(b.launches) == 1
    assert [f.role for f in b.launch.facts if isinstance(f, F.LoadWeightBegin)] == ["target", "draft"]
    # a fork's own draft worker, named by a `*_draft_model_path` option, loads second too
    fork = _sub(text, "speculative_algorithm=None", "speculative_algorithm=None, pvd_draft_model_path='/models/d-0.5B'")
    c = analyse(_log(tmp_path, fork, "fork.log"))
    assert len(c.launches) == 1
    assert [f.role for f in c.launch.facts if isinstance(f, F.LoadWeightBegin)] == ["target", "draft"]


# ---- unbounded work ----------------------------------------------------------------------------

def test_soft_wrapped_lines_join_within_a_bound():
    lines = [(1, "[2026-03-02 09:14:16] Load weight begin. avail mem=78.43 GB,")]
    lines += [(n, "x" * 90 + ",") for n in range(2, 100_002)]  # 9 MB of comma-continued lines
    start = time.monotonic()
    found = list(candidate_lines(lines))
    assert time.monotonic() - start < 10
    assert found and all(len(l.text) <= MAX_JOINED and len(l.raw) <= MAX_JOINED for l in found)


def test_a_record_continued_by_long_lines_stays_bounded():
    head = TEXT.splitlines()[0][:-1] + ", extra=["
    lines = [(1, head)] + [(n, "1, " * (1 << 17)) for n in range(2, 40)] + [(40, "])")]
    start = time.monotonic()
    found = list(candidate_lines(lines))
    assert time.monotonic() - start < 10
    assert all(len(l.text) <= MAX_JOINED for l in found)


def test_one_long_server_args_line_is_parsed_in_bounded_time(tmp_path):
    text = _sub(TEXT, "tokenizer_mode='auto'", "tokenizer_mode='auto', extra='" + "y" * (1 << 20) + "'")
    start = time.monotonic()
    a = analyse(_log(tmp_path, text))
    assert time.monotonic() - start < 15
    # the fields before the cut are kept
    assert a.knowledge.value("config", "model") == "meta-llama/Llama-3.1-8B-Instruct"


def test_random_binary_without_nuls_is_refused(tmp_path, monkeypatch, capsys):
    import random
    rng = random.Random(14)
    data = bytes(rng.choice(range(1, 256)) for _ in range(200_000))
    path = tmp_path / "random.bin"
    path.write_bytes(data)
    code, out, err = run_entry(monkeypatch, capsys, "explain", str(path))
    _clean_exit(code, out, err, allowed=(2,))
    assert "binary" in err


def test_lookups_per_rank_do_not_scan_every_fact():
    facts = tuple(F.LoadWeightBegin(evidence=F.Evidence(n, "x"), rank=F.Rank(tp=n), avail_gib=1.0)
                  for n in range(20_000))
    kb = Knowledge(facts)
    start = time.monotonic()
    assert all(kb.first(F.LoadWeightBegin, (0, 0, n, "")).rank.tp == n for n in range(20_000))
    assert time.monotonic() - start < 5


def test_many_ranks_and_many_launches_finish(tmp_path):
    lines = TEXT.splitlines()
    body = [l.split("] ", 1)[1] for l in lines[2:19] if l.startswith("[")]
    ranks = [lines[0].replace("tp_size=1", "tp_size=500")]
    ranks += [f"[2026-03-02 09:14:16 TP{r}] {b}" for b in body for r in range(500)]
    start = time.monotonic()
    a = analyse(_log(tmp_path, "\n".join(ranks + lines[19:]) + "\n", "ranks.log"))
    assert len({f.rank.tp for f in a.launch.facts if f.rank.tp is not None}) == 500
    launches = analyse(_log(tmp_path, (TEXT + "\n") * 300, "launches.log"))
    assert len(launches.launches) == 300
    assert time.monotonic() - start < 60


# ---- an invented value -------------------------------------------------------------------------

def test_an_unstated_kv_dtype_stays_unknown(tmp_path):
    text = _sub(TEXT, "kv_cache_dtype='auto', ", "")
    a = analyse(_log(tmp_path, text))
    assert not a.knowledge.get("kv_pool", "dtype").known
    assert a.knowledge.get("finding", "fp8-kv-opportunity") is None
    stated = analyse(str(EXAMPLE))
    assert stated.knowledge.value("kv_pool", "dtype") == "torch.bfloat16"


LLAMA_8B = REPO / "tests" / "plan_configs" / "llama-3.1-8b.json"  # 32 layers, 8 KV heads, head_dim 128


def _unstated_dtype(tmp_path, k_gib: str, tokens: int = 415615, v_gib: str = "") -> str:
    text = _sub(TEXT, "kv_cache_dtype='auto', ", "")
    return _log(tmp_path, _sub(text, "#tokens: 415615, K size: 25.37 GB, V size: 25.37 GB",
                               f"#tokens: {tokens}, K size: {k_gib} GB, V size: {v_gib or k_gib} GB"))


@pytest.mark.parametrize("k_gib, dtype, width", [("12.69", "fp8", 1), ("25.37", "bf16 or fp16", 2)])
def test_an_unstated_kv_dtype_is_read_from_the_bytes_per_token_with_config_json(k_gib, dtype, width, tmp_path):
    a = analyse(_unstated_dtype(tmp_path, k_gib), config_json=str(LLAMA_8B))
    found = a.knowledge.get("kv_pool", "dtype")
    assert found.known and found.value == dtype and found.detail == {"inferred": True}
    # 8 KV heads × (128 + 128) × 32 layers = 65,536 elements a token
    assert f"= 8 × (128 + 128) × 32 layers × {width} B = {65536 * width} B fits the log's " in found.formula
    assert found.formula.endswith(f"; only {width} B an element does")
    cited = {type(p).__name__ for p in found.premises}
    assert "ModelConfig" in cited and any(getattr(p, "key", None) == "bytes_per_token" for p in found.premises)
    theory = a.knowledge.get("kv_pool", "theoretical_bytes_per_token")
    assert theory.value == 65536 * width
    assert (a.knowledge.get("finding", "fp8-kv-opportunity") is not None) == (width == 2)
    # without config.json the width has nothing to be read against: unknown, as before
    assert not analyse(_unstated_dtype(tmp_path, k_gib)).knowledge.get("kv_pool", "dtype").known


def test_a_kv_width_that_the_printed_rounding_cannot_tell_stays_unknown(tmp_path):
    # 0.01 GiB over 20,000 tokens: 268–805 B a token, where 65,536 elements fit no width
    a = analyse(_unstated_dtype(tmp_path, "0.01", tokens=20000), config_json=str(LLAMA_8B))
    found = a.knowledge.get("kv_pool", "dtype")
    assert not found.known and "no width of 1, 2 or 4 B" in found.value.reason
    # a pool printed so coarsely that 1 and 2 bytes both fit its rounding (0.01 GiB over 109 tokens: 49,258–147,774 B)
    b = analyse(_unstated_dtype(tmp_path, "0.01", tokens=109, v_gib="0.00"), config_json=str(LLAMA_8B))
    unsure = b.knowledge.get("kv_pool", "dtype")
    assert not unsure.known and "1 B and 2 B all fit" in unsure.value.reason


# ---- output injection --------------------------------------------------------------------------

HOSTILE = ("\x1b]0;owned\x07\x1b]2;t\x1b\\\x1b[2J\x1b[1;1H\r\r<img src=x onerror=alert(1)>\b\b\x9b31m"
           "\u202e| *x* [a](javascript:1) ::error::injected\x0b\x0c\x7f")


def _hostile_log(tmp_path) -> str:
    text = _sub(TEXT, "tokenizer_mode='auto'", "tokenizer_mode='" + HOSTILE.replace("'", "") + "'")
    text = _sub(text, "Init torch distributed begin.", "Init torch distributed begin. " + HOSTILE)
    text = _sub(text, "mem usage=14.99 GB.", "mem usage=14.99 GB. " + HOSTILE)
    return _log(tmp_path, text)


def _markup_outside_code(text: str) -> bool:
    """Whether `<img`/`<script` stands outside a markdown code span (inside one it is shown as text)."""
    plain = re.sub(r"`[^`\n]*`", "", text)
    return "<img" in plain or "<script" in plain


_CONTROL = [chr(c) for c in range(32) if chr(c) not in "\n\t"] + [chr(c) for c in range(0x7f, 0xa0)] + ["\u202e"]


def _no_control(text: str) -> None:
    bad = sorted({repr(c) for c in text if c in _CONTROL})
    assert not bad, bad


@pytest.mark.parametrize("fmt", ["text", "markdown", "json", "html"])
def test_explain_outputs_carry_no_control_character_or_markup(fmt, tmp_path, monkeypatch, capsys):
    code, out, err = run_entry(monkeypatch, capsys, "explain", _hostile_log(tmp_path), "--format", fmt, "--no-color")
    _clean_exit(code, out, err, allowed=(0,))
    _no_control(out)
    if fmt == "html":
        assert "<img" not in out
    if fmt == "markdown":
        assert not _markup_outside_code(out)


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
def test_unread_lines_are_shown_escaped_in_every_report_format(fmt, tmp_path, monkeypatch, capsys):
    key = "<img src=x onerror=alert(1)>\x1b[2J"
    log = _log(tmp_path, f"[2026-03-02 09:14:07] server_args={{'model_path': 'm', 'tp_size': 1, '{key}': 1e400}}\n"
                         + "\n".join(TEXT.splitlines()[2:]).replace("#tokens: 415615", "#tokens: " + "9" * 5000) + "\n")
    code, out, err = run_entry(monkeypatch, capsys, "explain", log, "--format", fmt, "--no-color")
    _clean_exit(code, out, err, allowed=(0,))
    _no_control(out)
    shown = [l for l in out.splitlines() if "Not read" in l]
    assert len(shown) == 2, shown
    assert "line 12" in shown[1] and "a number of 5000 digits" in shown[1]
    assert "entries with a number out of range not read" in shown[0]
    if fmt == "markdown":
        assert not _markup_outside_code(out) and "&lt;img src=x" in shown[0]
    if fmt == "html":
        assert "<img" not in out
        assert '<a href="#L1">line 1</a>' in shown[0] and "&lt;img src=x" in shown[0]


@pytest.mark.parametrize("fmt", ["text", "json", "sarif", "junit", "github"])
def test_gate_outputs_carry_no_control_character_or_markup(fmt, tmp_path, monkeypatch, capsys):
    summary = tmp_path / "summary.md"
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"schema": "capdiag.baseline/2", "entries": [
        {"fingerprint": "stale", "code": HOSTILE, "rule": "<script>x</script>", "log": HOSTILE}]}))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = run_entry(monkeypatch, capsys, "gate", _hostile_log(tmp_path), "--format", fmt,
                               "--fail-on", "info", "--baseline", str(baseline))
    _clean_exit(code, out, err, allowed=(0, 1, 2))
    _no_control(out + err)
    if fmt == "junit":
        xml.dom.minidom.parseString(out.encode("utf-8"))  # well-formed
    if fmt == "github":
        written = summary.read_text()
        _no_control(written)
        assert not _markup_outside_code(written)
        assert all(l.startswith(("::", "capdiag gate:")) for l in out.splitlines())


@pytest.mark.parametrize("args", [["facts"], ["facts", "--format", "json"], ["explain", "--trace"],
                                  ["diff", str(EXAMPLE)]])
def test_other_outputs_carry_no_control_character(args, tmp_path, monkeypatch, capsys):
    argv = [args[0], _hostile_log(tmp_path), *args[1:]]
    code, out, err = run_entry(monkeypatch, capsys, *argv)
    _clean_exit(code, out, err, allowed=(0,))
    _no_control(out + err)
    if "json" in args:  # escaped before it was encoded, so still JSON (a DEL made `\x7f` after was not)
        assert json.loads(out)


def test_an_error_message_carries_no_control_character(tmp_path, monkeypatch, capsys):
    code, out, err = run_entry(monkeypatch, capsys, "explain", str(tmp_path / ("x\x1b]0;t\x07\r.log")))
    _clean_exit(code, out, err, allowed=(2,))
    _no_control(err)


def test_an_optional_figure_out_of_range_is_unknown_and_the_rest_of_the_line_read():
    # PyTorch's OOM message can print an absurd "memory in use" beside real figures: the line
    # must still be read (it is the root cause), with that one figure unknown and named
    from capdiag.parsing import read_facts
    from capdiag.source import Line

    text = ("(EngineCore_DP0 pid=88) ERROR 03-10 07:38:43 [core.py:1006] torch.OutOfMemoryError: CUDA out "
            "of memory. Tried to allocate 260.00 MiB. GPU 0 has a total capacity of 6.00 GiB of which 0 bytes "
            "is free. Including non-PyTorch memory, this process has 17179869184.00 GiB memory in use. Of the "
            "allocated memory 12.43 GiB is allocated by PyTorch, and 53.63 MiB is reserved by PyTorch but "
            "unallocated.")
    found = list(read_facts([Line(1, text, text)]))
    oom = [f for f in found if isinstance(f, F.OutOfMemory)]
    assert len(oom) == 1
    assert (oom[0].tried_to_allocate_mib, oom[0].total_capacity_gib, oom[0].allocated_by_pytorch_gib) == \
        (260.0, 6.0, 12.43)
    assert oom[0].process_in_use_gib is None
    notes = [f.reason for f in found if isinstance(f, F.UnreadLine)]
    assert notes == ["OutOfMemory: process_in_use_gib=17179869184.0 is out of range: left unknown"]


def test_a_baseline_of_a_log_named_with_control_characters_is_json(tmp_path, monkeypatch, capsys):
    log = tmp_path / "crash\x7f\x85.log"
    log.write_text(_sub(TEXT, "mem usage=14.99 GB.", "mem usage=14.99 GB. " + HOSTILE))
    target = tmp_path / "baseline.json"
    code, out, err = run_entry(monkeypatch, capsys, "baseline", str(log), "-o", str(target))
    _clean_exit(code, out, err, allowed=(0,))
    document = json.loads(target.read_text())
    _no_control(json.dumps(document, ensure_ascii=False))


def test_no_value_from_the_log_starts_a_line_of_the_text_report(tmp_path, monkeypatch, capsys):
    """A model id holding `\\n::error::` (server_args' repr decodes the escape to a newline) would
    put a workflow command at a line's start in a CI log: in the text report a newline inside a
    value is shown as `\\n`."""
    text = _sub(TEXT, "model_path='meta-llama/Llama-3.1-8B-Instruct'",
                "model_path='m\\n::error::pwned\\n::add-mask::x'")
    code, out, err = run_entry(monkeypatch, capsys, "explain", _log(tmp_path, text), "--no-color")
    _clean_exit(code, out, err, allowed=(0,))
    assert "pwned" in out and not any(line.lstrip().startswith("::") for line in out.splitlines())
    assert "m\\n::error::pwned" in out


@pytest.mark.parametrize("args", [("explain", "--format", "markdown"), ("explain", "--format", "html"),
                                  ("explain", "--trace"), ("diff",), ("diff", "--format", "markdown")],
                         ids=["markdown", "html", "trace", "diff", "diff-markdown"])
def test_no_value_from_the_log_starts_a_line_of_any_document(args, tmp_path, monkeypatch, capsys):
    """Whatever a CI step prints — the HTML or markdown report, the trace, a diff — a newline
    inside a value from the log is shown as `\\n`: none starts a line with a workflow command.
    (JSON escapes it itself; the github format writes its own escaped commands.)"""
    text = _sub(TEXT, "model_path='meta-llama/Llama-3.1-8B-Instruct'",
                "model_path='m\\n::error::pwned\\n::add-mask::x'")
    evil = _log(tmp_path, text)
    paths = (evil, _log(tmp_path, TEXT, "plain.log")) if args[0] == "diff" else (evil,)
    code, out, err = run_entry(monkeypatch, capsys, args[0], *paths, *args[1:])
    _clean_exit(code, out, err, allowed=(0, 1))
    printed = out + err
    assert "pwned" in printed and not any(line.lstrip().startswith("::") for line in printed.splitlines())
