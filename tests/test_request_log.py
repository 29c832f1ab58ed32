"""vLLM's request-logging lines: each request's prompt ids counted and its max_tokens read, in
every wording, whatever the prompt holds, in bounded memory, without inventing a length.

The lines are built here in vLLM's formats (vllm/entrypoints/logger.py RequestLogger.log_inputs
and AsyncLLMEngine.add_request of each version); the prompt is printed as Python's repr, as
vLLM's `%r` prints it.
"""
from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

from hypothesis import given, settings, strategies as st

from capdiag import facts as F
from capdiag.analysis import analyse
from capdiag.report import build
from capdiag.request_log import RequestLog
from capdiag.source import MAX_LINE

CASES = Path(__file__).resolve().parent / "traffic_cases"
PARAMS = ("SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=0.7, "
          "top_p=1.0, top_k=-1, min_p=0.0, seed=None, stop={stop!r}, stop_token_ids=[], bad_words=[], "
          "include_stop_str_in_output=False, ignore_eos=False, max_tokens={max_tokens}, min_tokens=0, logprobs=None, "
          "prompt_logprobs=None, skip_special_tokens=True, spaces_between_special_tokens=True, "
          "truncate_prompt_tokens=None, structured_outputs=None, extra_args=None)")
# (wording, the head of a line up to the request id) — by vLLM version
HEAD = "INFO 10-21 09:01:00 logger.py:37] "


def _ids(n: int) -> str:
    return "[" + ", ".join(str(100 + i) for i in range(n)) + "]"


def request_lines(wording: str, rid: str, prompt, ids, max_tokens, stop) -> list[str]:
    params = PARAMS.format(stop=stop, max_tokens=max_tokens)
    listed = "None" if ids is None else _ids(ids)
    if wording == "v0.2":
        return [f"{HEAD}Received request {rid}: prompt: {prompt!r}, sampling params: {params}, prompt token ids: {listed}."]
    if wording == "v0.4":
        return [f"{HEAD}Received request {rid}: prompt: {prompt!r}, sampling_params: {params}, "
                f"prompt_token_ids: {listed}, lora_request: None."]
    if wording == "v0.6":
        return [f"{HEAD}Received request {rid}: prompt: {prompt!r}, params: {params}, prompt_token_ids: {listed}, "
                "lora_request: None, prompt_adapter_request: None."]
    if wording == "v0.9":
        return [f"{HEAD}Received request {rid}: prompt: {prompt!r}, params: {params}, prompt_token_ids: {listed}, "
                "prompt_embeds shape: None, lora_request: None, prompt_adapter_request: None."]
    # v0.10.2+: the prompt in a DEBUG line, the parameters in the INFO line after it
    return [f"(APIServer pid=7) DEBUG 10-14 19:30:00 [logger.py:49] Request {rid} details: prompt: {prompt!r}, "
            f"prompt_token_ids: {listed}, prompt_embeds shape: None.",
            f"(APIServer pid=7) INFO 10-14 19:30:00 [logger.py:55] Received request {rid}: params: {params}, "
            "lora_request: None."]


WORDINGS = ("v0.2", "v0.4", "v0.6", "v0.9", "v0.10.2")
# prompts that hold the fields' own words, quotes of both kinds, backslashes, a newline escape
TRICKY = st.lists(st.sampled_from(list("ab '\"\\\n,:[]()=") + ["max_tokens=7", ", params: ",
                                                                  ", prompt_token_ids: [1, 2]", "None"]),
                  max_size=20).map("".join)


@settings(max_examples=120, deadline=None)
@given(requests=st.lists(st.tuples(st.sampled_from(WORDINGS), TRICKY, st.none() | st.integers(0, 300),
                                   st.none() | st.integers(1, 9000), st.lists(TRICKY, max_size=2)),
                         min_size=1, max_size=12),
       cut=st.integers(1, 6), seed=st.integers(0, 1000))
def test_counts_whatever_the_prompts_hold(requests, cut, seed):
    lines, want_ids, want_max, not_printed = [], {}, {}, 0
    for n, (wording, prompt, ids, max_tokens, stop) in enumerate(requests):
        lines += request_lines(wording, f"cmpl-{n:032x}", prompt, ids, max_tokens, stop)
        if ids is None:
            not_printed += 1
        else:
            want_ids[ids] = want_ids.get(ids, 0) + 1
        if max_tokens is not None:
            want_max[max_tokens] = want_max.get(max_tokens, 0) + 1
    log, rng = RequestLog(), random.Random(seed)
    at, number = 0, 1
    while at < len(lines):  # blocks of whole lines, as the source hands them
        take = rng.randint(1, cut)
        block = "".join(line + "\n" for line in lines[at:at + take]).encode()
        log.feed(number, block)
        at, number = at + take, number + take
    sums = log.segments[-1]
    assert sums.requests == len(requests) and sums.unread == 0
    assert dict(sums.prompt_lengths) == want_ids
    assert sums.prompt_not_printed == not_printed
    assert dict(sums.max_tokens) == want_max
    assert sums.max_tokens_not_set == sum(1 for r in requests if r[3] is None)


def test_a_huge_id_list_is_counted_in_place():
    """150,000 ids (a line of ~1 MB) are counted without copying the line: the memory the
    scanner takes while reading stays far below the line's size."""
    line = request_lines("v0.6", "cmpl-big", "long document " * 1000, 150_000, 256, [])[0] + "\n"
    block = (line * 3).encode()
    log = RequestLog()
    tracemalloc.start()
    log.feed(1, block)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert dict(log.segments[-1].prompt_lengths) == {150_000: 3}
    assert peak < 64 * 1024, peak  # the cited heads, not the lines
    assert len(log.segments[-1].marks["first_request"][1]) < 300


def _startup() -> str:
    return "".join(line for line in (CASES / "vllm-v063-request-log.log").read_text().splitlines(keepends=True)[:8])


def test_a_line_cut_by_the_reader_gives_only_a_lower_bound(tmp_path):
    """A request line longer than the reader keeps (MAX_LINE; a line of up to about two chunks may
    come whole) loses the end of its id list: its prompt is at least the ids counted, so the mean
    is unknown and said so."""
    long_ids = 3 * MAX_LINE // 7
    lines = request_lines("v0.6", "cmpl-cut", "x", long_ids, 64, []) + request_lines("v0.6", "cmpl-ok", "y", 10, 32, [])
    log = tmp_path / "cut.log"
    log.write_text(_startup() + "\n".join(lines) + "\n")
    rl = build(analyse(str(log)))["runtime"]["observed_lengths"]["request_log"]
    prompt = rl["prompt_tokens"]
    assert prompt["requests"] == 2 and prompt["exact"] == 1 and prompt["mean"] is None
    assert MAX_LINE // 9 < prompt["at_least"] < long_ids
    assert "1 request line(s) were cut before their id list ended" in prompt["unknown_reason"]
    assert prompt["p50"] == 10 and prompt["p99"] is None  # the short one is below the cut one
    assert rl["mean_budget_tokens"] is None


def test_without_the_setting_no_list_is_taken_whole(tmp_path):
    """A log whose start-up lines (and so max_log_len) are missing: a printed list may have been
    cut to max_log_len, so no prompt length is given."""
    lines = request_lines("v0.6", "cmpl-a", "x", 12, 64, []) + request_lines("v0.6", "cmpl-b", "y", 30, 32, [])
    log = tmp_path / "requests-only.log"
    log.write_text("INFO:     Application startup complete.\n" + "\n".join(lines) + "\n")
    report = build(analyse(str(log), framework="vllm"))
    prompt = report["runtime"]["observed_lengths"]["request_log"]["prompt_tokens"]
    assert prompt["mean"] is None and prompt["p50"] is None and prompt["at_least"] == 12
    assert "does not state max_log_len" in prompt["unknown_reason"]
    assert report["runtime"]["observed_lengths"]["request_log"]["max_tokens"]["mean"] == 48


def test_request_lines_are_cited_and_join_the_evidence():
    report = build(analyse(str(CASES / "vllm-v063-request-log.log")))
    finding = next(f for f in report["findings"] if f["name"] == "observed-lengths")
    kinds = {e["kind"] for e in finding["evidence"]}
    assert "RequestLengths" in kinds
    assert "At the requests' own budget of 1,362 tokens" in finding["message"]
    assert "--token-lengths 1362" in finding["action"]
    longest = report["runtime"]["evidence"]["longest_prompt"]
    assert longest["value"] == 2048 and longest["text"].endswith(" …")
    # the prompt that spells fields inside its quotes did not pose as them
    facts = analyse(str(CASES / "vllm-v063-request-log.log")).knowledge.of(F.RequestLengths, role=None)
    assert dict(facts[0].max_tokens) == {16: 1, 256: 1, 512: 2, 1024: 1}


def test_info_level_lines_of_newer_versions_give_max_tokens_only(tmp_path):
    """vLLM 0.10.2+ at INFO prints the parameters but not the prompt: max_tokens is known, the
    prompt is not, and the reason names the DEBUG level that would print it."""
    lines = [line for n in range(3) for line in request_lines("v0.10.2", f"cmpl-{n}", "x", 5, 100 * (n + 1), [])
             if " INFO " in line]
    log = tmp_path / "info.log"
    log.write_text(_startup() + "\n".join(lines) + "\n")
    rl = build(analyse(str(log)))["runtime"]["observed_lengths"]["request_log"]
    assert rl["requests"] == 3 and rl["prompt_tokens"]["requests"] == 0 and rl["prompt_tokens"]["mean"] is None
    assert "VLLM_LOGGING_LEVEL=DEBUG" in rl["prompt_tokens"]["unknown_reason"]
    assert (rl["max_tokens"]["mean"], rl["max_tokens"]["max"]) == (200, 300)
    assert rl["mean_budget_tokens"] is None
