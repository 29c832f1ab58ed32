"""vLLM's request-logging lines, summed as the source streams past them: no fact per line.

With request logging on (the API server's default before v0.10.2, `--enable-log-requests`
after; `--disable-log-requests` turned it off before), vLLM prints one line per request:

- v0.2–v0.3 `Received request ID: prompt: 'P', sampling params: SamplingParams(…), prompt token ids: [..].`
- v0.4 `Received request ID: prompt: 'P', sampling_params: SamplingParams(…), prompt_token_ids: [..], lora_request: None.`
- v0.4.1–v0.10.1 `Received request ID: prompt: 'P', params: SamplingParams(…), prompt_token_ids: [..]`, then
  `, lora_request: …` and, by version, `prompt_adapter_request: …` and `prompt_embeds shape: …`;
- v0.10.2+ `Received request ID: params: SamplingParams(…), lora_request: None.` (no prompt), with
  the prompt in a DEBUG line beside it (`VLLM_LOGGING_LEVEL=DEBUG`): `Request ID details: prompt:
  'P', prompt_token_ids: [..], prompt_embeds shape: None.`

The prompt's length is the number of its token ids; `max_tokens=` in the sampling parameters is
the most it may generate. `--max-log-len N` cuts both the prompt text and the id list to N
(silently), so a list of N ids may be longer: the lengths are kept exactly, as counted, and the
rule that reads them (rules/derive/runtime.py) applies the start-up's max_log_len. A line the
source cut (longer than its MAX_LINE) leaves its list unclosed: its length is only a lower bound.
The prompt is a Python repr, so a quote in it is escaped: fields are looked for outside quotes,
and no prompt text can pose as a field. The work per line is a few `bytes.find` calls and one
`bytes.count` over the id list (C loops): no regular expression over the prompt, no copy of it.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

from capdiag import facts as F
from capdiag import scanner
from capdiag.source import line_text

RECEIVED = b"Received request "
DETAILS = b" details: prompt: "
_PARAMS = (b"params: ", b"sampling_params: ", b"sampling params: ")
_IDS = (b", prompt_token_ids: ", b", prompt token ids: ")
_MAX_TOKENS = b"max_tokens="
CITED = 240  # characters of a request line its evidence keeps: the line may hold a whole prompt
_QUOTES = b"'\""
_BACKSLASH = 0x5C


def _closing(block: bytes, at: int, end: int) -> int:
    """The offset after the Python string repr opening at `at` (a quote), or -1 when it does not
    close before `end`. Inside a repr its own quote is always escaped (an odd run of backslashes)."""
    quote = block[at:at + 1]
    pos = at + 1
    while True:
        hit = block.find(quote, pos, end)
        if hit < 0:
            return -1
        before = hit
        while block[before - 1] == _BACKSLASH:
            before -= 1
        if (hit - before) % 2 == 0:
            return hit + 1
        pos = hit + 1


def _unquoted(block: bytes, needle: bytes, start: int, end: int) -> int:
    """The first `needle` in block[start:end] outside string reprs, or -1."""
    while True:
        hit = block.find(needle, start, end)
        if hit < 0:
            return -1
        quotes = [q for q in (block.find(b"'", start, hit), block.find(b'"', start, hit)) if q >= 0]
        if not quotes:
            return hit
        start = _closing(block, min(quotes), end)
        if start < 0:
            return -1


def _after_prompt(block: bytes, at: int, end: int) -> int:
    """The offset after the prompt printed at `at` (a repr, or None); -1 when it cannot be read."""
    if block.startswith(b"None", at):
        return at + 4
    if block[at:at + 1] and block[at:at + 1] in _QUOTES:
        return _closing(block, at, end)
    return -1


class RequestSums:
    """One start-up's request lines, summed."""

    def __init__(self) -> None:
        self.lines = 0  # request lines read (Received and details lines)
        self.requests = 0  # Received request lines
        self.unread = 0  # request lines whose fields could not be told apart
        self.prompt_lengths: Counter = Counter()  # ids counted in a closed list -> requests
        self.prompt_cut: Counter = Counter()  # ids counted before the line was cut -> requests
        self.prompt_not_printed = 0  # the line prints no id list (None, or no prompt in it)
        self.max_tokens: Counter = Counter()
        self.max_tokens_not_set = 0  # max_tokens=None, or parameters without it (pooling)
        self.marks: dict[str, tuple[int, str, object]] = {}  # mark -> (line, text, value)
        self.longest = -1
        self.last: tuple[int, bytes, int] = (0, b"", 0)  # the last Received line: its block, an offset in it

    def cite(self, mark: str, first: int, block: bytes, pos: int, end: int, value: object) -> None:
        """Cite the line that holds block[pos], by its head."""
        start = block.rfind(b"\n", 0, pos) + 1
        text = line_text(block[start:min(end, start + 4 * CITED)])
        if len(text) > CITED or end > start + 4 * CITED:
            text = text[:CITED] + " …"
        self.marks[mark] = (first + block.count(b"\n", 0, start), text, value)

    def close(self) -> None:
        first, block, pos = self.last
        if block:
            end = block.find(b"\n", pos)
            self.cite("last_request", first, block, pos, len(block) if end < 0 else end, None)
            self.last = (0, b"", 0)


class RequestLog:
    """The request lines of each start-up: `feed(first_line_number, block)`, `restart()`."""

    def __init__(self) -> None:
        self.segments: list[RequestSums] = [RequestSums()]
        # DEBUG detail lines are looked for once a request line was seen (one search less a block
        # for every other log); until then the block before is kept: a request's details line
        # comes just before its Received line, and may end the block before it
        self.details = False
        self.before: tuple[int, bytes] = (0, b"")

    def restart(self) -> None:
        self.segments[-1].close()
        self.segments.append(RequestSums())

    def feed(self, first: int, block: bytes) -> None:
        sums = self.segments[-1]
        received = scanner.contains(block, RECEIVED)
        if not self.details:
            if not received:
                self.before = (first, block)
                return
            self.details, (line, before), self.before = True, self.before, (0, b"")
            if DETAILS in before:
                self._lines(line, before, sums, DETAILS, self._details)
        # a details line comes before its request's Received line: read first, cited first
        if scanner.contains(block, DETAILS):
            self._lines(first, block, sums, DETAILS, self._details)
        if received:
            self._lines(first, block, sums, RECEIVED, self._received)

    def _lines(self, first: int, block: bytes, sums: RequestSums, needle: bytes, read) -> None:
        pos = block.find(needle)
        while pos >= 0:
            end = block.find(b"\n", pos)
            end = len(block) if end < 0 else end
            sums.lines += 1
            length = read(block, pos + len(needle), end, sums)
            if length is False:
                sums.unread += 1
            else:
                if not sums.marks:
                    sums.cite("first_request", first, block, pos, end, None)
                if length is not None and length > sums.longest:
                    sums.longest = length
                    sums.cite("longest_prompt", first, block, pos, end, length)
                if needle is RECEIVED:
                    sums.last = (first, block, pos)
            pos = block.find(needle, end)

    def _received(self, block: bytes, at: int, end: int, sums: RequestSums):
        """`Received request ID: …` from `at` (after the phrase): its prompt's length (None when
        not printed), or False when the line cannot be read."""
        colon = block.find(b": ", at, end)
        if colon < 0:
            return False
        at = colon + 2
        length = None
        if block.startswith(b"prompt: ", at):
            at = _after_prompt(block, at + 8, end)
            if at < 0 or not block.startswith(b", ", at):
                return False
            at += 2
        else:
            at = -1 if not block.startswith(b"params: ", at) else at
        key = next((k for k in _PARAMS if block.startswith(k, at)), None) if at >= 0 else None
        if key is None:
            return False
        params = at + len(key)
        sums.requests += 1
        found = _unquoted(block, _MAX_TOKENS, params, end)
        value = block[found + len(_MAX_TOKENS):found + len(_MAX_TOKENS) + 12] if found >= 0 else b""
        digits = len(value) - len(value.lstrip(b"0123456789"))
        if digits:
            sums.max_tokens[int(value[:digits])] += 1
        else:
            sums.max_tokens_not_set += 1
        if block.startswith(b"prompt: ", colon + 2):  # the wordings before v0.10.2 print the ids here
            length = self._none(sums)
            for key in _IDS:
                ids = _unquoted(block, key, found if found >= 0 else params, end)
                if ids >= 0:
                    sums.prompt_not_printed -= 1
                    length = self._ids(block, ids + len(key), end, sums)
                    break
        return length

    def _details(self, block: bytes, at: int, end: int, sums: RequestSums):
        """`Request ID details: prompt: 'P', prompt_token_ids: [..], …` from after `prompt: `."""
        at = _after_prompt(block, at, end)
        if at < 0 or not block.startswith(_IDS[0], at):
            return False
        return self._ids(block, at + len(_IDS[0]), end, sums)

    @staticmethod
    def _none(sums: RequestSums) -> None:
        sums.prompt_not_printed += 1
        return None

    def _ids(self, block: bytes, at: int, end: int, sums: RequestSums) -> Optional[int]:
        """The ids printed at `at`: their count when the list closes on the line (a cut line's
        count so far goes to `prompt_cut`)."""
        if not block.startswith(b"[", at):
            return self._none(sums)
        close = block.find(b"]", at, end)
        stop = end if close < 0 else close
        count = block.count(b",", at, stop) + (stop > at + 1)
        if close < 0:
            sums.prompt_cut[count] += 1
            return None
        sums.prompt_lengths[count] += 1
        return count

    def forget(self, keep: int) -> None:
        del self.segments[:keep]

    def facts(self) -> list[F.Fact]:
        """A RequestLengths per start-up that printed request lines, and the lines it cites
        (TrafficMarks: first_request, longest_prompt, last_request)."""
        out: list[F.Fact] = []
        for sums in self.segments:
            sums.close()
            anchor = sums.marks.get("first_request")
            if anchor is None:
                continue
            out.append(F.RequestLengths(
                evidence=F.Evidence(anchor[0], anchor[1]), role=F.RUNTIME_ROLE, framework="vllm", lines=sums.lines,
                requests=sums.requests, unread=sums.unread,
                prompt_lengths=tuple(sorted(sums.prompt_lengths.items())),
                prompt_cut=tuple(sorted(sums.prompt_cut.items())), prompt_not_printed=sums.prompt_not_printed,
                max_tokens=tuple(sorted(sums.max_tokens.items())), max_tokens_not_set=sums.max_tokens_not_set))
            out += [F.TrafficMark(evidence=F.Evidence(line, text), role=F.RUNTIME_ROLE, framework="vllm", mark=name,
                                  value=value, summary_line=anchor[0]) for name, (line, text, value) in sums.marks.items()]
        return out
