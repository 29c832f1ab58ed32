"""Request-time traffic lines, summed as the source streams past them: no fact per line.

A server that has run for days leaves a log that is mostly these lines (SGLang's `Prefill
batch` / `Decode batch` and retraction warnings, vLLM's periodic `Avg prompt throughput: …`
metrics and preemption warnings). The source hands every block of raw lines to `feed()`, and
calls `restart()` where a start-up record begins, so traffic stays with its start-up. Each
block is read by one regular-expression pass per framework (in C); the values go into counters
whose size does not grow with the log: KV usage is printed to two decimals (a percent to one),
so its histogram is exact and small. `facts()` turns the sums into one TrafficSummary per rank
and start-up, and the few TrafficMark lines a finding cites.
"""
from __future__ import annotations

import bisect
import functools
from collections import Counter
from typing import Callable, Optional

from capdiag import facts as F
from capdiag import scanner
from capdiag import traffic_shapes as shapes
from capdiag.lazyre import LazyPattern
from capdiag.request_log import RequestLog
from capdiag.source import line_text

SERIES_POINTS = 240  # points kept of the usage/running/queue series (pairs merge beyond)
SERIES_PER_BLOCK = 16  # points one block of lines gives at most
FULL = 1.0  # usage printed as 1.00 (SGLang) or 100.0% (vLLM)

# SGLang: `[2026-03-02 09:14:28 DP1 TP0] Decode batch, …` — the date is absent before v0.3,
# rank tags as the start-up lines have them (`DP-1`, no DP rank, is none of them), then perhaps `INFO scheduler.py:123: `.
# Figures as the patterns take them: at most 15 digits (a 5000-digit run is no figure a server
# prints, and int() refuses one past 4,300 digits), a decimal point only between digits
_INT, _NUM = shapes.INT, shapes.NUM
_SGL_HEAD = rb"\[(?:(\d{4}-\d\d-\d\d) )?(\d\d:\d\d:\d\d)(?:[.,]\d+)?(?: DP-1)?((?: [A-Z_]+\d{1,7})*)\] (?:[A-Z]+ [\w./-]+:\d+: )?"
# Both batch lines in every field set seen across versions: `.` after `batch` before ~v0.4.4,
# an iteration counter `[N]` with SGLANG_LOG_FORWARD_ITERS, `full`/`swa`/`mamba` usages for
# hybrid pools (the KV usage is the larger of full and SWA, as SGLang's own get_kv_token_stats;
# mamba state is not KV), `cache hit rate` in v0.3.x prefill lines, and whatever sits between
# the usages and `gen throughput` (speculative accept length, PD-disaggregation queues).
_SGLANG = LazyPattern(
    _SGL_HEAD + rb"(?:Decode batch(?: \[\d+\])?[,.] #running-req: " + _INT + rb", #(?:full )?token: " + _INT + rb", "
    rb"(?:full )?token usage: " + _NUM + rb", (?:#swa token: \d+, swa token usage: " + _NUM + rb", )?"
    rb"[^\n]*?gen throughput \(token/s\): " + _NUM + rb", #queue-req: " + _INT +
    rb"|Prefill batch(?: \[\d+\])?[,.] #new-seq: " + _INT + rb", #new-token: " + _INT + rb", #cached-token: " + _INT + rb", "
    rb"(?:cache hit rate: [\d.]+%, )?(?:full )?token usage: " + _NUM + rb", (?:swa token usage: " + _NUM + rb", )?"
    rb"(?:mamba usage: [\d.]+, )?#running-req: " + _INT + rb", #queue-req: " + _INT + rb")")
# `KV cache pool is full. Retract requests.` (v0.4.8+), `Decode out of memory happened.` before;
# `#new_tokens_gained` (the tokens the retraction freed) in newer versions.
_RETRACT = LazyPattern(
    _SGL_HEAD + rb"(?:KV cache pool is full\. Retract requests\.|[Dd]ecode out of memory happened[.,]) "
    rb"#retracted_reqs: " + _INT + rb"(?:, #new_tokens_gained: " + _INT + rb")?")
# vLLM: V0 `Avg prompt throughput: … Running: R reqs, Swapped: S reqs, Pending: W reqs, GPU KV
# cache usage: U%, CPU KV cache usage: C%.` (C: the swap space), early V1 without the usage, V1
# `Engine 000: … Running: R reqs, Waiting: W reqs, GPU KV cache usage: U%, Prefix cache hit rate:
# H%` (one engine per DP rank); since 0.2x (0.32's v1/metrics/loggers.py) the usage is the KV
# device's — `GPU` for CUDA, else the device type (`CPU KV cache usage` on the CPU backend) — and
# `Deferred: N reqs`, `KV fetch: …` and `Preemptions: N` (those of the interval since the last
# line; printed only when some were) may come between.
_VLLM = LazyPattern(shapes.VLLM_METRICS.regex())
_ENGINE = LazyPattern(rb"Engine " + _INT + rb": $")
# Python's regular expressions cost about a character matched, so the fast reading of a block
# takes only the runs of figures that stand together (the start of a decode line, its end, a
# prefill line up to its queue) and checks that every line gave them (else the block is read
# line by line with the full patterns above). The compiled scanner runs the same wordings.
_S_DECODE = LazyPattern(shapes.SGLANG_DECODE.regex())
_S_DECODE_TAIL = LazyPattern(shapes.SGLANG_DECODE_TAIL.regex())
_S_PREFILL = LazyPattern(shapes.SGLANG_PREFILL.regex())
_S_HEAD = LazyPattern(_SGL_HEAD)
# SGLang names every scheduler's lines the same way (no tags with one GPU, ` TP0` with TP only, and
# ` DP1 TP0`, ` PP1 TP0`… otherwise), and only attention-TP rank 0 prints traffic: lines without
# these tags all come from one scheduler.
_MULTI_RANK = (b"DP", b"PP", b"ATTN_CP", b"MOE_DP")
_V_ENGINES = LazyPattern(shapes.VLLM_ENGINE.regex())
_VLLM_TIME = LazyPattern(rb"(?:(\d{4}-)?(\d\d-\d\d) )?(\d\d:\d\d:\d\d)")
# V0 warns every 50th preemption, with the running total
_PREEMPT = LazyPattern(rb"is preempted by PreemptionMode\.\w+ mode[^\n]*?total_num_cumulative_preemption=" + _INT)
_TAG = LazyPattern(r"([A-Z_]+?)(\d+)")
_NOT_QUEUED = b"0".__ne__


def _line_at(block: bytes, pos: int) -> tuple[int, int]:
    """Start and end offsets of the line holding `pos`."""
    end = block.find(b"\n", pos)
    return block.rfind(b"\n", 0, pos) + 1, len(block) if end < 0 else end


def _columns(rows: list[tuple], width: int) -> tuple[tuple, ...]:
    """findall()'s rows of `width` groups as one tuple a group."""
    return tuple(zip(*rows)) if rows else ((),) * width


def _ranges(block: bytes, parts: int) -> list[tuple[int, int]]:
    """`parts` runs of whole lines covering the block (fewer for a short one)."""
    cuts, step = [0], max(1, len(block) // parts)
    for at in range(step, len(block), step):
        cut = block.find(b"\n", at) + 1
        if cut == 0:
            break
        if cut > cuts[-1]:
            cuts.append(cut)
    if cuts[-1] < len(block):
        cuts.append(len(block))
    return list(zip(cuts, cuts[1:]))


class _Rank:
    """One rank's sums within one start-up."""

    def __init__(self, framework: str, tags: bytes):
        self.framework, self.tags = framework, tags
        self.lines = 0
        self.samples: Counter = Counter()  # (usage bytes, queued, running bytes) -> lines
        self.counted = None  # the same, of the lines the compiled scanner read (capdiag.scanner)
        self.first_time = self.last_time = ""
        self.peak_queue = 0
        self.peak_usage = -1.0
        self.peak_running = -1
        self.low = self.high = None  # throughput range
        self.context = [0, 0]
        self.prompt = [0, 0]
        self.prefill_max = 0  # the most new tokens one prefill line printed: has a batch hit the chunk budget?
        self.retracted = self.retract_events = 0
        self.retract_tokens: Optional[int] = None
        self.preemptions: Optional[int] = None
        self.series: list[list] = []
        self.marks: dict[str, tuple[int, str, object]] = {}  # mark -> (line, text, value)
        self.last_block: tuple[int, bytes] = (0, b"")

    # ---- adding
    def add(self, first: int, block: bytes, usages: list, queues: list, runnings: list, when: tuple[str, str]) -> None:
        """A run of this rank's lines, in line order: their usages (b"" where not printed), queue
        and running counts as printed; `when` the times of the run's first and last line."""
        self.samples.update(zip(usages, map(_NOT_QUEUED, queues), runnings))
        known = [u for u in set(usages) if u]
        self.add_counted(first, block, len(usages), max(map(float, known)) if known else None,
                         max(map(int, set(runnings))), max(map(int, set(queues))), lambda: when[0], when[1])

    def add_counted(self, first: int, block: bytes, lines: int, top_usage: Optional[float], top_running: int,
                    top_queue: int, first_time: Callable[[], str], last_time: str) -> None:
        """A run of `lines` of this rank's lines, already counted into the samples: the fullest
        usage as printed (None where none was), the most running and queued requests; the time
        of its last line, and how to find its first's (only the rank's first run needs it). The
        run becomes one point of the series."""
        self.lines += lines
        if not self.first_time:
            self.first_time = first_time()
            self.cite_edge("first", first, block)
        self.last_time = last_time
        self.last_block = (first, block)
        scale = 100.0 if self.framework == "vllm" else 1.0
        top_usage = -1.0 if top_usage is None else top_usage / scale
        if top_usage > self.peak_usage:
            self.peak_usage = top_usage
            self._mark("peak_usage", first, block, self._usage_needles(top_usage), top_usage)
        if top_usage >= FULL and "first_full" not in self.marks:
            self._mark("first_full", first, block, self._usage_needles(top_usage), top_usage)
        if top_running > self.peak_running:
            self.peak_running = top_running
            self._mark("peak_running", first, block, self._running_needles(top_running), top_running)
        if top_queue > self.peak_queue:
            self.peak_queue = top_queue
            self._mark("peak_queue", first, block, self._queue_needles(top_queue), top_queue)
        point = [last_time, top_usage, top_running, top_queue]
        if self.series and self.series[-1][0] == point[0]:
            self.series[-1] = _merged(self.series[-1], point)
        else:
            self.series.append(point)
        if len(self.series) > 2 * SERIES_POINTS:
            self.series = [_merged(a, b) for a, b in zip(self.series[::2], self.series[1::2])] + (
                [self.series[-1]] if len(self.series) % 2 else [])

    def throughput(self, values: list[float]) -> None:
        if values:
            self.throughput_range(min(values), max(values))

    def throughput_range(self, low: float, high: float) -> None:
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)

    def histogram(self):
        """The compiled scanner's histogram this rank's lines are counted in (None without it)."""
        if self.counted is None:
            self.counted = scanner.histogram()
        return self.counted

    def _usage_needles(self, usage: float) -> tuple[bytes, ...]:
        if self.framework == "vllm":
            return (b"cache usage: %.1f%%" % (usage * 100),)
        return (b"token usage: %.2f" % usage,)

    def _running_needles(self, running: int) -> tuple[bytes, ...]:
        return (b"Running: %d reqs" % running,) if self.framework == "vllm" else (b"#running-req: %d," % running,)

    def _queue_needles(self, queue: int) -> tuple[bytes, ...]:
        if self.framework == "vllm":
            return b"Waiting: %d reqs" % queue, b"Pending: %d reqs" % queue
        return b"#queue-req: %d" % queue,

    def _mark(self, mark: str, first: int, block: bytes, needles: tuple[bytes, ...], value: object) -> None:
        """Cite the first line of the block that holds a needle and is this rank's."""
        for needle in needles:
            pos = block.find(needle)
            while pos >= 0:
                start, end = _line_at(block, pos)
                if self._mine(block[start:end]):
                    self.cite(mark, first, block, start, value)
                    return
                pos = block.find(needle, end)

    def _mine(self, line: bytes) -> bool:
        if self.framework == "vllm":
            return (b"Engine %s: " % self.tags in line) if self.tags else True
        return self.tags + b"]" in line

    def cite(self, mark: str, first: int, block: bytes, pos: int, value: object) -> None:
        start, end = _line_at(block, pos)
        self.marks[mark] = (first + block.count(b"\n", 0, start), line_text(block[start:end]), value)

    def _traffic_line(self, line: bytes) -> bool:
        if self.framework == "vllm":
            return b"Avg prompt throughput: " in line and self._mine(line)
        return (b"Decode batch" in line or b"Prefill batch" in line) and self._mine(line)

    def cite_edge(self, mark: str, first: int, block: bytes) -> None:
        """Cite the block's first (mark "first") or last ("last") traffic line of this rank."""
        needle = b"Avg prompt throughput: " if self.framework == "vllm" else b" batch"
        forward = mark == "first"
        pos = block.find(needle) if forward else block.rfind(needle)
        while pos >= 0:
            start, end = _line_at(block, pos)
            if self._traffic_line(block[start:end]):
                self.cite(mark, first, block, start, None)
                return
            pos = block.find(needle, end) if forward else block.rfind(needle, 0, start)

    def close(self) -> None:
        """Cite the last traffic line (only the last block is kept while reading)."""
        first, block = self.last_block
        self.cite_edge("last", first, block)
        self.last_block = (0, b"")


def _merged(a: list, b: list) -> list:
    return [b[0], max(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])]


class TrafficAggregator:
    """The sink the source feeds: `feed(first_line_number, block)`, `restart(line_number)`."""

    def __init__(self) -> None:
        self.segments: list[dict[tuple, _Rank]] = [{}]
        self.starts: list[int] = [0]  # the line each segment's start-up record is on
        self.framework: Optional[str] = None  # once one's traffic is seen, the other's is not looked for
        self.requests = RequestLog()  # vLLM's request-logging lines, one sum per segment

    def restart(self, line: int) -> None:
        """A start-up record begins at `line`: later traffic belongs to that start-up. The
        ended start-up's ranks cite their last line now and let go of the block they kept
        for it (a log of 20,000 restarts would hold a block each)."""
        if self.segments[-1] or self.requests.segments[-1].lines:
            for rank in self.segments[-1].values():
                rank.close()
            self.segments.append({})
            self.starts.append(line)
            self.requests.restart()

    def forget_before(self, line: int) -> None:
        """Drop the sums of start-ups that ended before `line` (no launch from there on is
        analysed); the one in progress at `line` stays."""
        keep = max(bisect.bisect_right(self.starts, line) - 1, 0)
        if keep:
            del self.segments[:keep], self.starts[:keep]
            self.requests.forget(keep)

    def feed(self, first: int, block: bytes) -> None:
        """Sum the traffic lines of `block`, whose first line is number `first`."""
        has = functools.partial(scanner.contains, block)
        seen = self.framework
        if seen != "vllm":
            if has(b" batch"):
                self._sglang(first, block)
            if has(b"#retracted_reqs: "):
                self._retractions(first, block)
        if seen != "sglang":
            if has(b"Avg prompt throughput: "):
                self._vllm(first, block)
            if has(b"total_num_cumulative_preemption="):
                self._preemptions(first, block)
            self.requests.feed(first, block)

    def _rank(self, framework: str, tags: bytes) -> _Rank:
        return self._keep(self._candidate(framework, tags))

    def _candidate(self, framework: str, tags: bytes) -> _Rank:
        """The rank lines of these tags are counted under, not yet kept: a block the compiled
        scanner hands back to the Python path may turn out to give it no line."""
        return self.segments[-1].get((framework, tags)) or _Rank(framework, tags)

    def _keep(self, rank: _Rank) -> _Rank:
        ranks = self.segments[-1]
        if (rank.framework, rank.tags) not in ranks:
            ranks[(rank.framework, rank.tags)] = rank
            self.framework = rank.framework
        return rank

    # ---- SGLang
    def _sglang(self, first: int, block: bytes) -> None:
        at = _batch_at(block, 0, len(block), True)
        if at < 0:
            return
        head = _S_HEAD.search(block, _line_at(block, at)[0], at + 1)
        tags = head.group(3) if head else b""
        if any(tag in tags for tag in _MULTI_RANK) or not self._sglang_fast(first, block, tags):
            self._sglang_rows(first, block)

    def _sglang_fast(self, first: int, block: bytes, tags: bytes) -> bool:
        """One scheduler's lines, a few contiguous figures at a time; False when some line did not
        give them (a hybrid pool prints two usages: the line-by-line reading takes the fuller).
        Each pattern passes over the block once, and the figures are handled a column at a time
        (zip(*rows)), so no Python runs per line."""
        cuts = _ranges(block, SERIES_PER_BLOCK)
        rank = self._candidate("sglang", tags)
        counted = scanner.scan(False, block, cuts, rank.histogram())
        if counted is not None:
            self._sglang_counted(first, block, rank, cuts, counted)
            return True
        runs, decodes, prefills = [], 0, 0
        for start, stop in cuts:
            decode = _S_DECODE.findall(block, start, stop)  # (running, tokens, usage, swa)
            tail = _S_DECODE_TAIL.findall(block, start, stop)  # (throughput, queue)
            prefill = _S_PREFILL.findall(block, start, stop)  # (new, new tokens, cached, usage, running, queue)
            if len(decode) != len(tail):
                return False
            if decode or prefill:
                d_running, d_tokens, d_usage, swa = _columns(decode, 4)
                if any(swa):
                    return False
                runs.append((start, stop, (d_running, d_tokens, d_usage), _columns(tail, 2), _columns(prefill, 6)))
                decodes += len(decode)
                prefills += len(prefill)
        # every " batch" inside a line read proves both counts below in one pass
        if decodes + prefills != block.count(b" batch") and (
                decodes != block.count(b"Decode batch") or prefills != block.count(b"Prefill batch")):
            return False
        if not runs:
            return True
        rank = self._rank("sglang", tags)
        for start, stop, (d_running, d_tokens, d_usage), (throughput, d_queue), prefill in runs:
            p_seqs, p_new, p_cached, p_usage, p_running, p_queue = prefill
            rank.add(first, block, d_usage + p_usage, d_queue + p_queue, d_running + p_running,
                     (_sgl_when(block, start, stop, True), _sgl_when(block, start, stop, False)))
            rank.throughput(list(map(float, throughput)))
            rank.context[0] += sum(map(int, d_tokens))
            rank.context[1] += sum(map(int, d_running))
            new = list(map(int, p_new))
            rank.prompt[0] += sum(new) + sum(map(int, p_cached))
            rank.prompt[1] += sum(map(int, p_seqs))
            rank.prefill_max = max(rank.prefill_max, max(new, default=0))
        return True

    def _sglang_counted(self, first: int, block: bytes, rank: _Rank, cuts: list, counted: list) -> None:
        """The compiled scanner's sums of each stretch (capdiag.scanner.scan), added as the
        fast reading above adds its columns."""
        for (start, stop), got in zip(cuts, counted):
            if got is None:
                continue
            lines, top_queue, top_running, top_usage, low, high, tokens, running, prompt, seqs, most_new, _ = got
            self._keep(rank)
            rank.add_counted(first, block, lines, top_usage, top_running, top_queue,
                             lambda start=start, stop=stop: _sgl_when(block, start, stop, True),
                             _sgl_when(block, start, stop, False))
            if low is not None:
                rank.throughput_range(low, high)
            rank.context[0] += tokens
            rank.context[1] += running
            rank.prompt[0] += prompt
            rank.prompt[1] += seqs
            rank.prefill_max = max(rank.prefill_max, most_new)

    def _sglang_rows(self, first: int, block: bytes) -> None:
        """Line by line with the full pattern: several ranks, or a hybrid pool's two usages."""
        groups: dict[bytes, list] = {}
        for row in _SGLANG.findall(block):
            groups.setdefault(row[2], []).append(row)
        for tags, rows in groups.items():
            rank = self._rank("sglang", tags)
            step = max(1, -(-len(rows) // SERIES_PER_BLOCK))
            for at in range(0, len(rows), step):
                run = rows[at:at + step]
                usages = [max(r[5] or r[12], r[6] or r[13] or b"0") if (r[6] or r[13]) else r[5] or r[12] for r in run]
                rank.add(first, block, usages, [r[8] or r[15] for r in run], [r[3] or r[14] for r in run],
                         (_sgl_time(run[0]), _sgl_time(run[-1])))
            rank.throughput([float(r[7]) for r in rows if r[3]])
            rank.context[0] += sum(int(r[4]) for r in rows if r[3])
            rank.context[1] += sum(int(r[3]) for r in rows if r[3])
            rank.prompt[0] += sum(int(r[10]) + int(r[11]) for r in rows if r[9])
            rank.prompt[1] += sum(int(r[9]) for r in rows if r[9])
            rank.prefill_max = max(rank.prefill_max, max((int(r[10]) for r in rows if r[9]), default=0))

    def _retractions(self, first: int, block: bytes) -> None:
        for m in _RETRACT.finditer(block):
            rank = self._rank("sglang", m.group(3))
            count, gained = int(m.group(4)), m.group(5)
            rank.retracted += count
            rank.retract_events += 1
            if gained is not None:
                rank.retract_tokens = max(rank.retract_tokens or 0, int(gained))
            if "first_retraction" not in rank.marks:
                rank.cite("first_retraction", first, block, m.start(), count)
            rank.cite("last_retraction", first, block, m.start(), count)

    # ---- vLLM
    def _vllm(self, first: int, block: bytes) -> None:
        if scanner.built() and self._vllm_counted(first, block, scanner.first_engine(block)):
            return
        lines = block.count(b"Avg prompt throughput: ")
        engines = _V_ENGINES.findall(block)
        if len(set(engines)) > 1 or (engines and len(engines) != lines) or not self._vllm_fast(
                first, block, lines, engines[0] if engines else b""):
            self._vllm_rows(first, block)

    def _vllm_fast(self, first: int, block: bytes, lines: int, engine: bytes) -> bool:
        """One engine's metrics lines, a stretch of the block at a time, by one pass of the whole
        pattern; False unless every metrics line gave it."""
        cuts = _ranges(block, SERIES_PER_BLOCK)
        runs = []
        for start, stop in cuts:
            rows = _VLLM.findall(block, start, stop)  # (prompt, generation, running, waiting, preempted, usage)
            if rows:
                runs.append((start, stop, _columns(rows, 6)))
        if sum(len(r[2][0]) for r in runs) != lines:
            return False
        rank = self._rank("vllm", engine)
        for start, stop, (_prompt, generation, running, waiting, preempted, usage) in runs:
            rank.add(first, block, usage, waiting, running, (_vllm_when(block, start, stop, True),
                                                             _vllm_when(block, start, stop, False)))
            rank.throughput(list(map(float, generation)))
            if any(preempted):
                self._interval_preemptions(rank, first, block, start, stop, sum(int(c) for c in preempted if c))
        return True

    def _vllm_counted(self, first: int, block: bytes, engine: bytes) -> bool:
        """The compiled scanner's sums of each stretch (capdiag.scanner.scan), added as the fast
        reading below adds its columns; False where it hands the block back."""
        cuts = _ranges(block, SERIES_PER_BLOCK)
        rank = self._candidate("vllm", engine)
        counted = scanner.scan(True, block, cuts, rank.histogram(), engine)
        if counted is None:
            return False
        self._keep(rank)
        for (start, stop), got in zip(cuts, counted):
            if got is not None:
                lines, top_queue, top_running, top_usage, low, high, preempted, preemptions = got
                rank.add_counted(first, block, lines, top_usage, top_running, top_queue,
                                 lambda start=start, stop=stop: _vllm_when(block, start, stop, True),
                                 _vllm_when(block, start, stop, False))
                rank.throughput_range(low, high)
                if preempted:
                    self._interval_preemptions(rank, first, block, start, stop, preemptions)
        return True

    def _interval_preemptions(self, rank, first: int, block: bytes, start: int, stop: int, count: int) -> None:
        """vLLM V1's `Preemptions: N` — those since the line before — summed; cited at the last."""
        rank.preemptions = (rank.preemptions or 0) + count
        at = block.rfind(b"Preemptions: ", start, stop)
        rank.cite("last_preemption", first, block, at, rank.preemptions)

    def _vllm_rows(self, first: int, block: bytes) -> None:
        groups: dict[bytes, list] = {}
        for m in _VLLM.finditer(block):
            engine = _ENGINE.search(block, max(0, m.start() - 16), m.start())
            groups.setdefault(engine.group(1) if engine else b"", []).append(m)
        for engine, found in groups.items():
            rank = self._rank("vllm", engine)
            step = max(1, -(-len(found) // SERIES_PER_BLOCK))
            for at in range(0, len(found), step):
                run = found[at:at + step]
                rank.add(first, block, [m.group(6) or b"" for m in run], [m.group(4) for m in run],
                         [m.group(3) for m in run], (_vllm_time(block, run[0].start()), _vllm_time(block, run[-1].start())))
                if any(m.group(5) for m in run):
                    self._interval_preemptions(rank, first, block, run[0].start(), run[-1].end(),
                                               sum(int(m.group(5)) for m in run if m.group(5)))
            rank.throughput([float(m.group(2)) for m in found])

    def _preemptions(self, first: int, block: bytes) -> None:
        for m in _PREEMPT.finditer(block):
            rank = self._rank("vllm", b"")
            rank.preemptions = max(rank.preemptions or 0, int(m.group(1)))
            rank.cite("last_preemption", first, block, m.start(), rank.preemptions)

    def facts(self) -> list[F.Fact]:
        """The sums as facts, in line order: a TrafficSummary per rank and start-up, then its marks;
        a RequestLengths per start-up with request-logging lines, and its marks."""
        out: list[F.Fact] = []
        for ranks in self.segments:
            for rank in ranks.values():
                out.extend(_facts(rank))
        out += self.requests.facts()
        return sorted(out, key=lambda f: f.evidence.line)


_BATCHES = (b"Decode batch", b"Prefill batch")


def _batch_at(block: bytes, start: int, stop: int, first: bool) -> int:
    """Where the first (or last) batch line's `Decode batch`/`Prefill batch` is in
    block[start:stop], -1 if nowhere. Not ` batch`: the CUDA-graph capture's progress lines
    (`Capturing batches (bs=…`) hold that too, without a time or a rank's tags."""
    found = [at for at in ((block.find if first else block.rfind)(name, start, stop) for name in _BATCHES) if at >= 0]
    return (min if first else max)(found, default=-1)


def _sgl_when(block: bytes, start: int, stop: int, first: bool) -> str:
    """The time of the first (or last) batch line in block[start:stop]."""
    pos = _batch_at(block, start, stop, first)
    head = _S_HEAD.search(block, _line_at(block, pos)[0], pos + 1)
    return _sgl_time(head.groups()) if head else ""


def _vllm_when(block: bytes, start: int, stop: int, first: bool) -> str:
    needle = b"Avg prompt throughput: "
    pos = block.find(needle, start, stop) if first else block.rfind(needle, start, stop)
    return _vllm_time(block, pos)


def _sgl_time(row: tuple) -> str:
    return (row[0] + b" " + row[1]).decode() if row[0] else row[1].decode()


def _vllm_time(block: bytes, pos: int) -> str:
    start, end = _line_at(block, pos)
    # the last stamp before the metrics is vLLM's own; docker's `2026-05-12T08:01:39.331Z` or a
    # compose service name may stand in front of it
    m = None
    for m in _VLLM_TIME.finditer(block, start, pos):
        pass
    if m is None:
        return ""
    return " ".join(p.decode() for p in (m.group(2), m.group(3)) if p)


def _sample_order(sample: tuple) -> tuple:
    return (-1.0 if sample[0] is None else sample[0],) + sample[1:]


def _rank_of(rank: _Rank) -> F.Rank:
    if rank.framework == "vllm":
        return F.Rank(dp=int(rank.tags)) if rank.tags else F.NO_RANK
    tags = {name.lower(): int(index) for name, index in _TAG.findall(rank.tags.decode())}
    return F.Rank(**tags)


def _facts(rank: _Rank) -> list[F.Fact]:
    if rank.samples or rank.lines:
        rank.close()
    counted = rank.samples + Counter(rank.counted.items()) if rank.counted is not None else rank.samples
    anchor = rank.marks.get("first") or rank.marks.get("first_retraction") or rank.marks.get("last_preemption")
    if anchor is None:
        return []
    tags = _rank_of(rank)
    scale = 100.0 if rank.framework == "vllm" else 1.0
    samples = tuple(sorted(((float(u) / scale if u else None, queued, int(r), n)
                            for (u, queued, r), n in counted.items()), key=_sample_order))
    summary = F.TrafficSummary(
        evidence=F.Evidence(anchor[0], anchor[1]), rank=tags, role=F.RUNTIME_ROLE, framework=rank.framework,
        lines=rank.lines,
        first_time=rank.first_time, last_time=rank.last_time, samples=samples, peak_queue=rank.peak_queue,
        throughput=(rank.low, rank.high), context_tokens=rank.context[0], context_requests=rank.context[1],
        prompt_tokens=rank.prompt[0], prompt_requests=rank.prompt[1],
        prefill_max_new_tokens=rank.prefill_max if rank.prompt[1] else None, retractions=rank.retracted,
        retraction_events=rank.retract_events, retraction_tokens_max=rank.retract_tokens,
        preemptions=rank.preemptions, series=tuple(tuple(p) for p in rank.series))
    marks = [F.TrafficMark(evidence=F.Evidence(line, text), rank=tags, role=F.RUNTIME_ROLE, framework=rank.framework,
                           mark=name, value=value,
                           summary_line=anchor[0]) for name, (line, text, value) in rank.marks.items()]
    return [summary, *marks]
