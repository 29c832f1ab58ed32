"""The block reader (physical_runs/physical_lines) against a reference line splitter: random
logs, read-buffer sizes smaller and larger than the lines, streams that return short reads."""
import io
import random
from unittest import mock

import pytest
from hypothesis import given, settings, strategies as st

from capdiag import source
from capdiag.source import line_text, physical_lines

MAX_LINE = 48  # small, so that lines longer than it (and than the buffer) are common


class ShortReads(io.RawIOBase):
    """A stream whose every read returns between 1 byte and the size asked, as a pipe may."""

    def __init__(self, data: bytes, seed: int):
        self.data, self.at, self.random = data, 0, random.Random(seed)

    def readable(self):
        return True

    def read(self, size=-1):
        size = len(self.data) - self.at if size is None or size < 0 else size
        n = min(size, len(self.data) - self.at, self.random.randint(1, max(1, size)))
        piece = self.data[self.at:self.at + n]
        self.at += n
        return piece

    def readinto(self, buffer):
        piece = self.read(len(buffer))
        buffer[:len(piece)] = piece
        return len(piece)


def reference(data: bytes) -> list[tuple[int, str]]:
    """Split on "\n" only; a line is kept up to MAX_LINE bytes; no line after a final "\n"."""
    lines = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        lines.pop()
    return [(number, line_text(line[:MAX_LINE])) for number, line in enumerate(lines, 1)]


_LINE = st.one_of(
    st.text(alphabet="abc xyz:=,[]()\r\x1b\u00e9\u4e2d", max_size=12),  # short, with CR, ANSI and non-ASCII
    st.integers(MAX_LINE - 2, 4 * MAX_LINE).map(lambda n: "L" * n),  # around and beyond MAX_LINE
    st.just("[2026-03-02 09:14:19] KV Cache is allocated. #tokens: 415615"),
)
_LOG = st.tuples(st.lists(_LINE, max_size=30), st.booleans()).map(
    lambda t: ("\n".join(t[0]) + ("\n" if t[1] and t[0] else "")).encode())


@settings(max_examples=400, deadline=None)
@given(_LOG, st.sampled_from([1, 2, 3, 7, 16, 47, 48, 49, 100, 1 << 16]),
       st.sampled_from(["bytes", "short", "buffered"]), st.booleans(), st.integers(0, 2 ** 16))
def test_the_reader_splits_as_the_reference_whatever_the_buffer_and_reads(data, chunk, kind, numpy, seed):
    # "bytes" and "buffered" are read straight into the reader's buffer (readinto), the
    # buffered one over a raw stream of short reads; "short" through read()
    stream = {"bytes": lambda: io.BytesIO(data), "short": lambda: ShortReads(data, seed),
              "buffered": lambda: io.BufferedReader(ShortReads(data, seed), buffer_size=8)}[kind]()
    # numpy (the fast extra) counts the newlines from the first byte on, when it is installed
    with mock.patch.object(source, "CHUNK", chunk), mock.patch.object(source, "MAX_LINE", MAX_LINE), \
            mock.patch.object(source, "NUMPY_FROM", 0 if numpy else source.NUMPY_FROM):
        assert list(physical_lines(stream)) == reference(data)


@pytest.mark.skipif(source._numpy() is None, reason="numpy (the fast extra) is not installed")
def test_a_large_regular_file_counts_with_numpy_from_its_first_block(tmp_path):
    data = b"".join(b"[2026-03-02 09:14:19] line %d\n" % n for n in range(400))
    path = tmp_path / "big.log"
    path.write_bytes(data)
    used: list[bool] = []
    real = source._numpy()

    def numpy():
        used.append(True)
        return real

    def counted(stream) -> list[tuple[int, str]]:
        used.clear()
        with mock.patch.object(source, "CHUNK", 1024), mock.patch.object(source, "NUMPY_FROM", len(data) // 2), \
                mock.patch.object(source, "_numpy", numpy):
            return list(physical_lines(stream))

    with path.open("rb") as fh:  # the size is known: numpy for every block
        assert counted(fh) == reference(data)
    blocks = len(used)
    assert blocks == -(-len(data) // 1024)
    # a stream of unknown size: numpy only once half has been read
    assert counted(io.BytesIO(data)) == reference(data) and 0 < len(used) < blocks
