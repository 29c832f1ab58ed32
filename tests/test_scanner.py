"""The compiled traffic scanner (capdiag/_scan.c) against the Python path: the same facts from
random traffic logs of every wording the scanner reads and of the shapes it must hand back
(hybrid pools, several ranks, cut lines, stray fields), with figures at their extremes, cut
into blocks anywhere between lines and read through streams that return short reads."""
from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings, strategies as st

from capdiag import scanner, traffic_shapes as shapes
from capdiag.source import candidate_runs, physical_runs
from capdiag.traffic import TrafficAggregator
from tests.test_reader import ShortReads

built = scanner.loaded()[0] is not None
needs_scanner = pytest.mark.skipif(not built, reason="the compiled scanner is not built here: " + scanner.loaded()[1])


def _facts(lines: list[str], cuts: list[int], native: bool) -> list:
    """The traffic facts of `lines` fed in blocks that end after the line numbers in `cuts`."""
    with pytest.MonkeyPatch.context() as m:
        if not native:
            m.setattr(scanner, "loaded", lambda: (None, "Python (this test)"))
        sink = TrafficAggregator()
        blocks, start = [], 0
        for stop in sorted(set(cuts) | {len(lines)}):
            if stop > start:
                blocks.append((start + 1, "".join(line + "\n" for line in lines[start:stop]).encode()))
                start = stop
        list(candidate_runs(blocks, sink))
        return sink.facts()


# ---- figures, as servers print them and at their extremes: `Odd.rate` of the choices are odd
class Odd(random.Random):
    rate = 0.0

    def odd(self) -> bool:
        return self.random() < self.rate


def _int(rng: Odd) -> str:
    if rng.odd():
        return rng.choice(["00", "007", "9" * 15, "9" * 16, "1" * 19, str(rng.randint(0, 10 ** 15 - 1))])
    return str(rng.choice([0, 0, 1, rng.randint(0, 9), rng.randint(0, 99999)]))


def _num(rng: Odd) -> str:
    if rng.odd():
        whole = rng.choice(["0", "007", "9" * 15, "9" * 16, str(rng.randint(0, 100000))])
        return whole + rng.choice(["", ".", "." + "3" * 15, "." + "3" * 16, ".1.2", ".05", "." + str(rng.randint(0, 9999))])
    return rng.choice(["%.2f" % rng.uniform(0, 5000), "%.1f" % rng.uniform(0, 100), str(rng.randint(0, 50)), "0.0"])


def _usage(rng: Odd) -> str:
    return _num(rng) if rng.odd() else rng.choice(["%.2f" % rng.random(), "1.00", "0.00", "0.5"])


def _sglang(rng: Odd, tags: str) -> str:
    head = rng.choice(["[2026-05-01 10:%02d:%02d%s] " % (rng.randint(0, 59), rng.randint(0, 59), tags),
                       "[10:00:%02d%s] " % (rng.randint(0, 59), tags),
                       "[2026-05-01 10:00:01%s] INFO scheduler.py:1234: " % tags])
    it = rng.choice(["", "", " [%d]" % rng.randint(0, 999)])
    sep = rng.choice([",", ",", "."])
    full = rng.choice(["", "", "full "])
    kind = rng.random()
    if kind < 0.5:
        swa = rng.odd()
        middle = rng.choice(["cuda graph: True, ", "", "accept len: 1.50, ", "#transfer-req: 0, cuda graph: False, "])
        line = (f"Decode batch{it}{sep} #running-req: {_int(rng)}, #{full}token: {_int(rng)}, "
                f"{full}token usage: {_usage(rng)}, ")
        if swa:
            line += f"#swa token: {_int(rng)}, swa token usage: {_usage(rng)}, "
        if not rng.odd():  # else a line without its tail
            line += f"{middle}gen throughput (token/s): {_num(rng)}, #queue-req: {_int(rng)}"
        if rng.odd():
            line += ", gen throughput (token/s): 1.0, #queue-req: 0"  # a second tail
    elif kind < 0.85:
        line = (f"Prefill batch{it}{sep} #new-seq: {_int(rng)}, #new-token: {_int(rng)}, #cached-token: {_int(rng)}, "
                + rng.choice(["cache hit rate: 1.2.3%, ", "cache hit rate: x%, "] if rng.odd() else
                             ["", "", "cache hit rate: 12.5%, "])
                + f"{full}token usage: {_usage(rng)}, "
                + (f"swa token usage: {_usage(rng)}, " if rng.odd() else rng.choice(["", "", "mamba usage: 0.25, "]))
                + f"#running-req: {_int(rng)}, #queue-req: {_int(rng)}"
                + rng.choice(["", ", #pending-token: 0, cuda graph: False, input throughput (token/s): 99.50"]))
    elif kind < 0.9:
        line = f"KV cache pool is full. Retract requests. #retracted_reqs: {_int(rng)}, #new_tokens_gained: {_int(rng)}"
    else:
        line = rng.choice(["gen throughput (token/s): 5, #queue-req: 1", "Prefill batch, #new-seq: 1",
                           "Decode batch, #running-req: 1, #token: 5, token usage: 0.10, Decode batch, #running-req: 2"]
                          ) if rng.odd() else f"Capturing batches (bs={_int(rng)} avail_mem=12.50 GB)"
    if rng.odd():  # a line cut short by the paste
        line = line[:rng.randint(1, len(line))]
    return head + line


def _vllm(rng: Odd, engine: str) -> str:
    head = rng.choice(["INFO 05-01 10:00:%02d [loggers.py:127] " % rng.randint(0, 59),
                       "(APIServer pid=1) INFO 05-01 10:00:01 [loggers.py:123] ", "INFO 05-01 10:00:01 metrics.py:455] ",
                       "2026-05-12T08:01:39.331Z INFO 05-12 08:01:39 [loggers.py:127] "])
    if rng.random() < 0.1:
        return head + ("Sequence group 7 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough "
                       f"KV cache space. total_num_cumulative_preemption={_int(rng)}")
    line = (f"{engine}Avg prompt throughput: {_num(rng)} tokens/s, Avg generation throughput: {_num(rng)} tokens/s, "
            f"Running: {_int(rng)} reqs, " + rng.choice(["", "", f"Swapped: {_int(rng)} reqs, "])
            + rng.choice(["Waiting", "Pending"]) + f": {_int(rng)} reqs"
            + rng.choice(["", "", f", Deferred: {_int(rng)} reqs"])
            + rng.choice(["", "", ", KV fetch: 1 waiting to start, 2 in progress, 3 completed waiting"])
            + rng.choice(["", "", f", Preemptions: {_int(rng)}"])
            + rng.choice([f", GPU KV cache usage: {_num(rng)}%", f", CPU KV cache usage: {_num(rng)}%", "",
                          f", GPU KV cache usage: {_num(rng)}%, Prefix cache hit rate: 12.0%",
                          f", GPU KV cache usage: {_num(rng)}%, CPU KV cache usage: 0.0%."]))
    if rng.odd():
        line = line[:rng.randint(1, len(line))]
    return head + line


def _odd(seed: int, rate: float) -> Odd:
    rng = Odd(seed)
    rng.rate = rate
    return rng


def _log(rng: Odd, vllm: bool, count: int) -> list[str]:
    """`count` lines of one framework's traffic, with odd figures and shapes at `rng.rate`."""
    tags = rng.choice(["", "", " TP0", " DP1 TP0", " PP0 TP0"])
    engines = rng.choice([[""], ["Engine 000: "], ["Engine 000: ", "Engine 001: "]])
    out = []
    for _ in range(count):
        if rng.random() < 0.08:
            out.append('[2026-05-01 10:00:00] INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK')
        elif vllm:
            out.append(_vllm(rng, rng.choice(engines)))
        else:
            out.append(_sglang(rng, rng.choice([tags, tags, tags, " TP1"])))
    return out


@needs_scanner
@settings(max_examples=400, deadline=None)
@given(st.booleans(), st.integers(1, 80), st.lists(st.integers(0, 80), max_size=6), st.integers(0, 2 ** 32),
       st.sampled_from([0.0, 0.005, 0.03, 0.3]))
def test_both_paths_give_the_same_facts(vllm, count, cuts, seed, rate):
    lines = _log(_odd(seed, rate), vllm, count)
    assert _facts(lines, cuts, True) == _facts(lines, cuts, False)


@needs_scanner
@pytest.mark.parametrize("vllm", [False, True])
def test_both_paths_agree_on_long_blocks_of_well_formed_lines(vllm):
    """Thousands of distinct (usage, queued, running) keys a block: the histogram grows; no
    line is handed back, so the compiled scanner reads every block."""
    rng = random.Random(11)
    lines = []
    for i in range(30_000):
        if vllm:
            lines.append(f"INFO 05-01 10:{i // 600 % 60:02d}:{i // 10 % 60:02d} [loggers.py:127] Avg prompt throughput: "
                         f"{rng.uniform(0, 9000):.1f} tokens/s, Avg generation throughput: {rng.uniform(0, 900):.1f} "
                         f"tokens/s, Running: {rng.randint(0, 300)} reqs, Waiting: {rng.choice([0, 0, rng.randint(1, 50)])} "
                         f"reqs, GPU KV cache usage: {rng.uniform(0, 100):.1f}%, Prefix cache hit rate: 3.0%")
        else:
            lines.append(f"[2026-05-01 10:{i // 600 % 60:02d}:{i // 10 % 60:02d} TP0] Decode batch, #running-req: "
                         f"{rng.randint(0, 300)}, #token: {rng.randint(0, 10 ** 6)}, token usage: {rng.random():.2f}, "
                         f"cuda graph: True, gen throughput (token/s): {rng.uniform(0, 5000):.2f}, #queue-req: "
                         f"{rng.choice([0, 0, rng.randint(1, 50)])}")
    cuts = list(range(0, 30_000, 9_000))
    native = _facts(lines, cuts, True)
    assert native == _facts(lines, cuts, False)
    assert native[0].lines == 30_000 and len(native[0].samples) > 1000


@needs_scanner
@settings(max_examples=60, deadline=None)
@given(st.booleans(), st.integers(0, 2 ** 32))
def test_short_reads_and_buffer_sizes_do_not_change_the_facts(vllm, seed):
    """Through the reader: a stream of short reads, blocks as the reader cuts them."""
    from unittest import mock

    from capdiag import source

    data = "".join(line + "\n" for line in _log(_odd(seed, 0.002), vllm, 400)).encode()
    out = []
    for native in (True, False):
        with pytest.MonkeyPatch.context() as m, mock.patch.object(source, "CHUNK", 4096 + seed % 5000):
            if not native:
                m.setattr(scanner, "loaded", lambda: (None, "Python (this test)"))
            sink = TrafficAggregator()
            list(candidate_runs(physical_runs(ShortReads(data, seed)), sink))
            out.append(sink.facts())
    assert out[0] == out[1]


def test_every_wording_compiles_to_the_pattern_the_python_path_uses():
    from capdiag import traffic

    for pattern, wording in ((traffic._S_DECODE, shapes.SGLANG_DECODE), (traffic._S_DECODE_TAIL, shapes.SGLANG_DECODE_TAIL),
                             (traffic._S_PREFILL, shapes.SGLANG_PREFILL), (traffic._VLLM, shapes.VLLM_METRICS)):
        assert pattern.pattern == wording.regex()
        assert re.compile(wording.regex()).groups == len(wording.fields)
    source = shapes.c_source()
    for wording in shapes.WORDINGS:
        ident = re.sub(r"\W+", "_", wording.name).upper()
        assert f"static int match_{ident.lower()}(" in source
        assert all(f"{ident}_{field.upper()} = {at}" in source for at, field in enumerate(wording.fields))


@needs_scanner
def test_the_scanner_was_built_from_the_wordings_declared_now(monkeypatch):
    assert scanner.loaded()[0].digest() == shapes.digest()
    monkeypatch.setattr(shapes, "digest", lambda: "another")
    scanner.loaded.cache_clear()
    try:
        native, why = scanner.loaded()
        assert native is None and "reinstall capdiag" in why
    finally:
        monkeypatch.undo()
        scanner.loaded.cache_clear()
    assert scanner.loaded()[0] is not None


@pytest.mark.parametrize("pieces, why", [
    ((b"a ", shapes.opt(shapes.Lit(b"b ")), b"b"), "begin alike"),          # optional b, then b
    ((b"a ", shapes.Run(shapes.DIGITS), b"7"), "character of the class"),   # [0-9]+7
    ((b"a ", shapes.Int("x"), shapes.digits()), "could continue it"),       # a figure, then digits
    ((b"a ", shapes.Num("x"), b".x"), "could continue it"),                 # a decimal, then a point
    ((b"a ", shapes.Either((b"ab", b"ac"))), "begin alike"),
    ((b"a ", shapes.Flag("f", b", x"), b", y"), "begin alike"),
])
def test_a_wording_greedy_matching_could_misread_is_refused(pieces, why):
    with pytest.raises(ValueError, match=why):
        shapes.wording("bad", *pieces).checked()


def test_optional_runs_at_the_end_may_begin_alike():
    """The vLLM metrics line's tail: `, Deferred…`, `, Preemptions…`, `, GPU KV cache usage…`."""
    assert shapes.VLLM_METRICS.checked()


def test_without_the_scanner_the_python_path_is_named(monkeypatch):
    monkeypatch.setenv(scanner.PURE_ENV, "1")
    scanner.loaded.cache_clear()
    try:
        native, why = scanner.loaded()
        assert native is None and why.startswith("Python (") and scanner.PURE_ENV in why
        assert scanner.histogram() is None and scanner.scan(False, b"", [], None) is None
    finally:
        monkeypatch.delenv(scanner.PURE_ENV)
        scanner.loaded.cache_clear()


def test_version_verbose_names_the_scanner():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "capdiag", "--version", "--verbose"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0].startswith("capdiag, version ")
    assert lines[1] == "traffic scanner: " + scanner.loaded()[1]
