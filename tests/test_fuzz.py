"""Fuzzing over mutations of real-format logs: capdiag gives a report or one InputError (exit 2),
never a traceback, and never cites a line or a value the mutated input does not hold.

Deterministic (a fixed seed) and bounded so CI stays fast."""
from __future__ import annotations

import gzip
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from capdiag.analysis import analyse
from capdiag.errors import InputError
from capdiag.render import render
from capdiag.report import build
from helpers import FIXTURES, SGLANG_CORPUS

SEED = 20261129
SUMMED = {"draft_cuda_graph_mem_usage_gib"}  # the contract sums every draft graph of the rank
SOURCES = sorted(FIXTURES.glob("*.log")) + sorted(SGLANG_CORPUS.glob("*.log"))[:4]


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def truncate_lines(rng, data):
    lines = _lines(data)
    for _ in range(max(1, len(lines) // 4)):
        i = rng.randrange(len(lines))
        lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
    return b"\n".join(lines)


def delete_and_duplicate(rng, data):
    lines = _lines(data)
    out = []
    for line in lines:
        roll = rng.random()
        if roll < 0.15:
            continue
        out.append(line)
        if roll > 0.9:
            out.append(line)
    return b"\n".join(out)


def swap_digits(rng, data):
    chars = bytearray(data)
    digits = [i for i, c in enumerate(chars) if 48 <= c <= 57]
    for i in rng.sample(digits, min(len(digits), 20)):
        chars[i] = 48 + rng.randrange(10)
    return bytes(chars)


def random_bytes(rng, data):
    chars = bytearray(data)
    for _ in range(30):
        chars.insert(rng.randrange(len(chars) + 1), rng.randrange(256))
    return bytes(chars)


def nuls(rng, data):
    lines = _lines(data)
    i = rng.randrange(len(lines))
    lines[i] = lines[i] + b"\x00" * rng.randrange(1, 40) + lines[i]
    return b"\n".join(lines)


def huge_line(rng, data):
    lines = _lines(data)
    lines.insert(rng.randrange(len(lines) + 1), b"x" * (1 << 20) + b" Load weight begin. avail mem=1.00 GB")
    return b"\n".join(lines)


def invalid_utf8(rng, data):
    lines = _lines(data)
    for _ in range(5):
        i = rng.randrange(len(lines))
        lines[i] = lines[i] + b"\xff\xfe\xc3(" + lines[i][:10]
    return b"\n".join(lines)


def shuffle_block(rng, data):
    lines = _lines(data)
    i = rng.randrange(len(lines))
    block = lines[i:i + 8]
    rng.shuffle(block)
    return b"\n".join(lines[:i] + block + lines[i + 8:])


MUTATIONS = (truncate_lines, delete_and_duplicate, swap_digits, random_bytes, nuls, huge_line, invalid_utf8,
             shuffle_block)


def cases():
    rng = random.Random(SEED)
    out = []
    for source in SOURCES:
        for mutate in rng.sample(MUTATIONS, 2):
            out.append(pytest.param(source, mutate, rng.randrange(1 << 30), id=f"{source.stem[:28]}-{mutate.__name__}"))
    return out


def _converted_from_mib(value: float, text: str) -> bool:
    """A GiB figure the log printed in MiB (XPU's `MB`, HPU's `MiB`): a number of the input / 1024,
    to the 4 places capdiag keeps."""
    return any(abs(round(float(n) / 1024, 4) - value) < 1e-9 for n in re.findall(r"\d+(?:\.\d+)?", text))


def _check(path: Path, data: bytes):
    try:
        report = build(analyse(str(path)))
    except InputError as exc:
        assert "\n" not in str(exc)  # one line
        return
    for fmt in ("text", "markdown", "json"):
        render(report, fmt)
    text = data.decode("utf-8", errors="replace").replace("\x00", "")
    cited = [e for f in report["findings"] for e in f["evidence"]] + \
            [e for row in report["breakdown"] for e in row["evidence"]]
    for e in cited:
        if e["source"] == "log":
            for piece in e["text"].split("\n"):
                assert piece[:200] in text, f"cited text not in the input: {piece[:120]!r}"
    for rank in report["ranks"]:
        for key, value in rank["observed"].items():
            if key in SUMMED:
                continue
            if isinstance(value, float):
                # PyTorch's OOM figures are filed in the unit the key names: a GiB figure may be in MiB
                forms = [value] + ([value / 1024, value * 1024] if key.startswith("oom_") else [])
                assert any(f in text for v in forms for f in (f"{v}", f"{v:.2f}", f"{v:.1f}", f"{v:.4f}", f"{v:g}")) \
                    or _converted_from_mib(value, text), f"{key}={value} is not in the input"
            elif isinstance(value, int) and not isinstance(value, bool):
                assert str(value) in text.replace(",", ""), f"{key}={value} is not in the input"


@pytest.mark.parametrize("source, mutate, seed", cases())
def test_mutated_logs_never_crash_nor_invent(tmp_path, source, mutate, seed):
    data = mutate(random.Random(seed), source.read_bytes())
    path = tmp_path / "mutated.log"
    path.write_bytes(data)
    _check(path, data)


def test_only_a_traceback(tmp_path):
    path = tmp_path / "tb.log"
    path.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nValueError: boom\n")
    with pytest.raises(InputError, match="neither an SGLang nor a vLLM start-up log"):
        analyse(str(path))


def test_gzip_of_a_mutated_log(tmp_path):
    data = truncate_lines(random.Random(SEED), (FIXTURES / "single_gpu_ready.log").read_bytes())
    path = tmp_path / "log.gz"
    path.write_bytes(gzip.compress(data))
    _check(path, data)


@pytest.mark.parametrize("payload", [b"\x00\x01\x02" * 4000, b"\xff" * 5000, b"", b"\n\n\n",
                                     b"[2026-01-01 00:00:00] hello\n" * 50])
def test_cli_bad_inputs_exit_2_in_one_line(tmp_path, payload):
    path = tmp_path / "in.log"
    path.write_bytes(payload)
    proc = subprocess.run([sys.executable, "-m", "capdiag", "explain", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("capdiag: error: ")
