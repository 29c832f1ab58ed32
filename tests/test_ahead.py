"""Reading a long file ahead on worker threads (capdiag.ahead, source.scanned_runs): the same
blocks, numbers, keyword lines and report as reading it in order, never more than a few blocks
ahead, and never ahead of a live stream."""
import io
import os
import select
import signal
import threading
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings, strategies as st

import capdiag
from capdiag import scanner
from capdiag import ahead, source
from capdiag.source import LiveStream, candidate_runs, physical_runs, reads_ahead, scanned_runs

EXAMPLE = Path(__file__).resolve().parent.parent / "capdiag" / "examples" / "sglang-llama31-8b-h100.log"


def test_mapped_keeps_the_order_and_results_of_a_plain_map():
    items = list(range(200))
    assert list(ahead.mapped(lambda n: n * n, items, True)) == [(n, n * n) for n in items]
    assert list(ahead.mapped(lambda n: n * n, items, False)) == [(n, n * n) for n in items]


def test_mapped_takes_at_most_a_few_items_ahead_of_its_reader():
    taken = []

    def items():
        for n in range(100):
            taken.append(n)
            yield n

    out = ahead.mapped(str, items(), True)
    for n in range(10):
        assert next(out) == (n, str(n))
        assert len(taken) - (n + 1) <= ahead.WORKERS * ahead.DEPTH
    out.close()


def test_an_error_in_the_work_comes_out_at_its_item_after_those_before_it():
    def fn(n):
        if n == 7:
            raise ValueError("seven")
        return n

    got = []
    with pytest.raises(ValueError, match="seven"):
        for item, result in ahead.mapped(fn, range(20), True):
            got.append(result)
    assert got == list(range(7))


def test_the_work_runs_on_worker_threads_only_when_ahead():
    names = [name for _, name in ahead.mapped(lambda _: threading.current_thread().name, range(8), True)]
    assert all(name.startswith("capdiag-ahead") for name in names)
    assert {name for _, name in ahead.mapped(lambda _: threading.current_thread().name, range(3), False)} == \
        {threading.current_thread().name}


_LINE = st.one_of(
    st.sampled_from(["[2026-03-02 09:14:19] KV Cache is allocated. #tokens: 415615, K size: 3.17 GB",
                     "[2026-03-02 09:15:01] Decode batch, #running-req: 42, #token: 19758, token usage: 0.85, "
                     "cuda graph: True, gen throughput (token/s): 2613.20, #queue-req: 0,",
                     "Traceback (most recent call last):", "torch.OutOfMemoryError: CUDA out of memory.",
                     "INFO 05-12 08:01:39 [gpu_worker.py:227] Available KV cache memory: 9.51 GiB", ""]),
    st.text(alphabet="abc xyz:=,[]()\r\x1b\u00e9", max_size=30),
)
_LOG = st.lists(_LINE, max_size=60).map(lambda ls: "\n".join(ls).encode())


@settings(max_examples=200, deadline=None)
@given(_LOG, st.sampled_from([7, 64, 300, 1 << 16]), st.booleans())
def test_read_ahead_gives_the_blocks_numbers_and_keyword_lines_of_reading_in_order(log, chunk, fast):
    # small chunks: many blocks in flight at once; FAST_FROM 0: hyperscan (when installed) on
    # every block, on several threads at once
    with mock.patch.object(source, "CHUNK", chunk), mock.patch.object(source, "NUMPY_FROM", 0 if fast else 1 << 40), \
            mock.patch.object(source, "FAST_FROM", 0 if fast else source.FAST_FROM):
        plain = list(physical_runs(io.BytesIO(log)))
        read_ahead = list(scanned_runs(io.BytesIO(log)))
        assert [run[:2] for run in read_ahead] == plain
        assert [run[2] for run in read_ahead] == [source._hit_starts(block) for _, block in plain]
        assert list(candidate_runs(read_ahead)) == list(candidate_runs(plain))


def test_only_a_long_regular_file_is_read_ahead(tmp_path):
    path = tmp_path / "a.log"
    path.write_bytes(EXAMPLE.read_bytes())
    with path.open("rb") as fh:
        assert not reads_ahead(fh)  # short
        with mock.patch.object(source, "AHEAD_FROM", 1):
            assert reads_ahead(fh)
            # its reader must not wait for more than it was given, whatever size is known
            with mock.patch.object(source, "_size", lambda stream: 1 << 30):
                assert not reads_ahead(LiveStream(fh)) and reads_ahead(fh)
            assert not reads_ahead(io.BytesIO(b"x\n"))  # no size to know it by
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as pipe, os.fdopen(write_end, "wb"):
        with mock.patch.object(source, "AHEAD_FROM", 0):
            assert not reads_ahead(pipe)


def test_the_report_read_ahead_is_the_one_read_in_order_byte_for_byte(tmp_path):
    traffic = ("[2026-03-02 09:20:01] Decode batch, #running-req: 3, #token: 1200, token usage: 0.01, "
               "cuda graph: True, gen throughput (token/s): 90.1, #queue-req: 0,\n")
    log = tmp_path / "big.log"
    log.write_text(EXAMPLE.read_text() + traffic * 3000 + EXAMPLE.read_text() + traffic * 50)
    # small blocks, each searched by hyperscan (when installed) and counted by numpy, on the workers
    with mock.patch.object(source, "CHUNK", 4096), mock.patch.object(source, "NUMPY_FROM", 0), \
            mock.patch.object(source, "FAST_FROM", 0):
        with mock.patch.object(source, "AHEAD_FROM", 1 << 40):
            in_order = [capdiag.explain(log, runtime=runtime).render("json") for runtime in (False, True)]
        with mock.patch.object(source, "AHEAD_FROM", 0), \
                mock.patch.object(source, "mapped", wraps=ahead.mapped) as mapped:
            read_ahead = [capdiag.explain(log, runtime=runtime).render("json") for runtime in (False, True)]
    assert read_ahead == in_order
    # with the run-time section, read ahead only where the compiled scanner sums the traffic (it
    # lets go of the GIL; the Python path's patterns hold it, and the workers would wait)
    assert [call.args[2] for call in mapped.call_args_list] == [True, scanner.built()]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_reads_ahead_with_threads_of_its_own():
    list(ahead.mapped(str, range(10), True))  # the parent's pool and its threads exist now
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its inherited pool has no threads; reading ahead must not hang
        try:
            os.close(read_end)
            os.write(write_end, repr(list(ahead.mapped(str, range(10), True))).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    ready = []
    try:
        with os.fdopen(read_end, "rb") as got:
            ready = select.select([got], [], [], 10)[0]
            assert ready, "the child hung"
            assert got.read() == repr([(n, str(n)) for n in range(10)]).encode()
    finally:
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_an_error_of_the_items_comes_out_after_the_items_read_before_it():
    def items():
        yield from range(3)
        raise OSError("the disk went away")

    got = []
    with pytest.raises(OSError, match="went away"):
        for item, result in ahead.mapped(str, items(), True):
            got.append(result)
    assert got == ["0", "1", "2"]


def test_with_no_thread_to_be_had_the_map_goes_on_in_order():
    """After the interpreter began to shut down (an atexit handler, a thread left running), a
    pool takes no new work: the items are done in order instead of failing."""

    class Closed:
        def submit(self, fn, item):
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    with mock.patch.object(ahead, "_pool", Closed):
        assert list(ahead.mapped(str, range(20), True)) == [(n, str(n)) for n in range(20)]
