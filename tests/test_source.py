"""capdiag.source: opening, decoding, transport noise, wrapped lines, the keyword prefilter."""
from __future__ import annotations

import gzip
import io
import os

import pytest

from capdiag.analysis import read_log
from capdiag.errors import InputError
from capdiag.parsing import read_facts
from capdiag.parsing.sglang import parse_sglang_line
from capdiag.source import (KEYWORDS, candidate_lines, candidate_runs, clean, open_input, physical_lines,
                            physical_runs)
from helpers import rank_tags
from test_grammar import POSITIVE

KV = "[2025-09-11 10:25:47 TP3] KV Cache is allocated. #tokens: 442617, K size: 27.02 GB, V size: 27.02 GB"
BEGIN = "[2025-02-04 05:21:33 TP0] Load weight begin. avail mem=78.58 GB"
TQDM = "Capturing batches (bs=1 avail_mem=20.95 GB): 100%|##########| 35/35 [00:05<00:00,  6.54it/s]"


def candidates(*physical: str) -> list:
    return list(candidate_lines(enumerate(physical, 1)))


def facts_of(data: bytes) -> list:
    return list(read_facts(candidate_lines(physical_lines(io.BytesIO(data)))))


# ---- clean(): one physical line -> the log lines inside it ------------------------------------

def test_ansi_colour_is_removed():
    assert clean(f"\x1b[32m{KV}\x1b[0m") == [KV]
    assert clean(f"\x1b[1;31m[2025-09-11 10:25:47 TP3]\x1b[0m {KV[26:]}") == [KV]
    assert clean(f"\x1b]0;title\x07{BEGIN}") == [BEGIN]


def test_carriage_return_rewrites_split_the_line():
    raw = (TQDM.replace("100%", " 10%") + "\r" + TQDM + "\r"
           + "[2025-09-11 10:25:47 TP3] Capture cuda graph end. Time elapsed: 2.00 s. mem usage=0.50 GB. avail mem=1.00 GB.")
    parts = clean(raw)
    assert len(parts) == 3 and parts[-1].startswith("[2025-09-11 10:25:47 TP3] Capture cuda graph end.")
    lines = candidates(raw)
    assert [l.text for l in lines] == [parts[-1]]
    fact = parse_sglang_line(lines[0].text)
    assert fact.cls.__name__ == "GraphCaptureEnd" and fact.values["mem_usage_gib"] == 0.5


def test_log_line_glued_after_a_tqdm_bar():
    raw = TQDM + KV
    assert clean(raw) == [TQDM, KV]
    lines = candidates(raw)
    assert [l.text for l in lines] == [KV] and lines[0].number == 1
    parsed = parse_sglang_line(lines[0].text)
    assert rank_tags(parsed.rank) == {"tp": 3} and parsed.values["k_gib"] == 27.02


@pytest.mark.parametrize("raw", [
    "sglang-1  | " + BEGIN,
    "sglang_server.1  | " + BEGIN,
    "2025-02-04T05:21:33.123456789Z " + BEGIN,
    "2025-02-04T05:21:33Z " + BEGIN,
    "2025-02-04T05:21:33+08:00 " + BEGIN,
    "sglang-1  | 2025-02-04T05:21:33.5Z " + BEGIN,
    "2025-02-04 21:21:33 " + BEGIN,
    "- " + BEGIN,
    "* " + BEGIN,
    "   " + BEGIN + "   ",
    "\x1b[36msglang-1  |\x1b[0m " + BEGIN,
    "[sglang]                 | " + BEGIN,
    "[rank0]: " + BEGIN,
    "[default0]:" + BEGIN,
    "sglang-1  | [rank0]: " + BEGIN,
], ids=["compose", "compose-dotted", "kubectl-ns", "kubectl-z", "kubectl-offset", "compose+kubectl",
        "docker-host-time", "md-dash", "md-star", "blanks", "compose-ansi", "manager-bracketed", "torch-rank",
        "torchrun-default", "compose+torch-rank"])
def test_transport_prefixes_are_removed(raw):
    assert clean(raw) == [BEGIN]
    parsed = parse_sglang_line(candidates(raw)[0].text)
    assert parsed.values == {"avail_gib": 78.58} and rank_tags(parsed.rank) == {"tp": 0}


def test_ray_repeat_note_is_removed():
    raw = "(SchedulerActor pid=1, ip=10.0.0.1) " + BEGIN + " [repeated 7x across cluster]"
    assert clean(raw) == ["(SchedulerActor pid=1, ip=10.0.0.1) " + BEGIN]
    assert parse_sglang_line(candidates(raw)[0].text).values == {"avail_gib": 78.58}


def test_docker_host_time_is_not_taken_for_the_log_time():
    # the host clock differs from the container's; only the log's own bracket survives
    text = clean("2025-02-04 21:21:33 [2025-02-04 05:21:33 TP0] Memory pool end. avail mem=9.31 GB")[0]
    assert text == "[2025-02-04 05:21:33 TP0] Memory pool end. avail mem=9.31 GB"
    # in front of vLLM's headers too: a process tag or a level name
    vllm = "INFO 09-15 11:20:30 [gpu_worker.py:298] Available KV cache memory: 54.78 GiB"
    assert clean("2025-09-15 11:20:30 " + vllm) == [vllm]
    tagged = "(EngineCore_DP0 pid=91877) " + vllm
    assert clean("2025-09-15 11:20:30.123 " + tagged) == [tagged]
    # a line of the server's own that merely starts with a date keeps it
    assert clean("2025-09-15 11:20:30 the model was cached") == ["2025-09-15 11:20:30 the model was cached"]


def test_bare_untagged_line_keeps_its_text():
    assert clean("max_total_num_tokens=473854") == ["max_total_num_tokens=473854"]
    assert clean("2025-02-04T05:21:33Z max_total_num_tokens=473854") == ["max_total_num_tokens=473854"]


# ---- candidate_lines(): keyword filter, wrapped lines, numbering ---------------------------------

def test_request_traffic_is_filtered_before_parsing():
    lines = candidates(
        "[2026-08-20 10:05:01] Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: 0.00, "
        "#running-req: 0, #queue-req: 0,",
        "[2026-08-20 10:05:03] Decode batch, #running-req: 1, #token: 552, token usage: 0.00, cuda graph: True, "
        "gen throughput (token/s): 41.02, #queue-req: 0",
        'INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        BEGIN)
    assert [(l.number, l.text) for l in lines] == [(4, BEGIN)]


def test_keyword_test_by_batch_keeps_numbers_across_batch_boundaries(monkeypatch):
    from capdiag import source
    monkeypatch.setattr(source, "BATCH", 3)
    traffic = 'INFO:     127.0.0.1:51234 - "POST /generate HTTP/1.1" 200 OK'
    physical = [traffic] * 10
    physical[2], physical[3], physical[9] = BEGIN, f"\x1b[32mKV Cac\x1b[0mhe is allocated. #tokens: 1", KV.lower()
    lines = candidates(*physical)
    # the ANSI code inside the keyword is no obstacle, nor is the case of a keyword
    assert [l.number for l in lines] == [3, 4, 10]
    assert lines[1].text == "KV Cache is allocated. #tokens: 1"


def test_a_caller_line_holding_a_newline_is_still_tested_alone():
    lines = list(candidate_lines([(1, "noise\nmore noise"), (2, BEGIN), (3, "x\n" + KV)]))
    assert [l.number for l in lines] == [2, 3]


def test_wrapped_continuation_lines_are_joined():
    lines = candidates("Load weight end. elapsed=2415.46 s, type=Gemma4ForConditionalGeneration,",
                       "avail mem=97.30 GB, mem usage=15.56 GB.",
                       "SWAKVPool mem usage: 79.94 GB, swa size: 798276, full size: 997846",
                       "Capture target decode CUDA graph end. elapsed=22.18 s, mem usage=1.91 GB,",
                       "avail mem=14.18 GB.")
    assert [l.number for l in lines] == [1, 3, 4]
    assert lines[0].text == ("Load weight end. elapsed=2415.46 s, type=Gemma4ForConditionalGeneration, "
                             "avail mem=97.30 GB, mem usage=15.56 GB.")
    assert lines[0].raw.count("\n") == 1
    end = parse_sglang_line(lines[0].text)
    assert end.values["avail_gib"] == 97.3 and end.values["mem_usage_gib"] == 15.56
    graph = parse_sglang_line(lines[2].text)
    assert graph.values["mem_usage_gib"] == 1.91 and graph.values["avail_gib"] == 14.18


def test_a_long_line_wrapped_at_a_space_is_joined_and_an_indented_block_is_not():
    head = "(EngineCore_0 pid=1257) (RayWorkerWrapper pid=1384) INFO 09-03 04:42:58 [gpu_model_runner.py:2708] "
    lines = candidates(head + "Graph capturing finished in 11", " secs, took 1.00 GiB",
                       "(APIServer pid=121) INFO 09-03 04:42:59 [loggers.py:142] Engine 000: vllm cache_config_info "
                       "with initialization after num_gpu_blocks is:", " 25809",
                       head + "Graph capturing finished in 9 secs, took 0.95 GiB",
                       '  File "/usr/lib/python3/site-packages/vllm/worker.py", line 3, in run',
                       head + "Graph capturing finished in 8 secs, took 0.90 GiB", " Loading safetensors: 50%")
    assert [l.text for l in lines] == [
        head + "Graph capturing finished in 11 secs, took 1.00 GiB",
        "(APIServer pid=121) INFO 09-03 04:42:59 [loggers.py:142] Engine 000: vllm cache_config_info with "
        "initialization after num_gpu_blocks is: 25809",
        head + "Graph capturing finished in 9 secs, took 0.95 GiB",
        'File "/usr/lib/python3/site-packages/vllm/worker.py", line 3, in run',  # a line of its own
        head + "Graph capturing finished in 8 secs, took 0.90 GiB"]
    # a short line does not take the next: a wrap happens past a width
    assert [l.text for l in candidates("Graph capturing finished in 11", " secs, took 1.00 GiB")] == [
        "Graph capturing finished in 11"]


def test_wrapped_over_three_lines_and_a_prefixed_next_line_is_not_swallowed():
    lines = candidates("[2025-01-01 00:00:00 TP0] Load weight end. type=X,", "avail mem=97.30 GB,",
                       "mem usage=15.56 GB.", "[2025-01-01 00:00:01 TP0] Memory pool end. avail mem=1.00 GB",
                       "[2025-01-01 00:00:02 TP0] Load weight end. type=X,",
                       "[2025-01-01 00:00:03 TP0] Memory pool end. avail mem=2.00 GB")
    assert [l.number for l in lines] == [1, 4, 5, 6]
    assert parse_sglang_line(lines[0].text).values["mem_usage_gib"] == 15.56
    assert parse_sglang_line(lines[3].text).values == {"avail_gib": 2.0}


def test_complete_server_args_does_not_swallow_an_unprefixed_line():
    lines = candidates("server_args=ServerArgs(model_path='m', tp_size=1)",
                       "Load weight begin. avail mem=10.00 GB",
                       "Memory pool end. avail mem=1.00 GB")
    assert [l.number for l in lines] == [1, 2, 3]
    assert parse_sglang_line(lines[0].text).values["fields"] == {"model_path": "m", "tp_size": 1}


def test_complete_server_args_is_not_spoiled_by_noise_after_it():
    lines = candidates("[2025-01-01 00:00:00] server_args=ServerArgs(model_path='m', tp_size=2, mem_fraction_static=0.8)",
                       "Some unprefixed noise printed by a library",
                       BEGIN)
    args = parse_sglang_line(lines[0].text)
    assert args.values["fields"] == {"model_path": "m", "tp_size": 2, "mem_fraction_static": 0.8}
    assert args.values["truncated_at"] is None


def test_hard_wrapped_server_args_is_joined():
    lines = candidates("[2025-01-01 00:00:00] server_args=ServerArgs(model_path='m', tp_size=2, mem_fra",
                       "ction_static=0.8, chunked_prefill_size=8192)",
                       BEGIN)
    assert [l.number for l in lines] == [1, 3]
    fields = parse_sglang_line(lines[0].text).values["fields"]
    assert fields == {"model_path": "m", "tp_size": 2, "mem_fraction_static": 0.8, "chunked_prefill_size": 8192}


@pytest.mark.parametrize("opening, closing", [
    ("(APIServer pid=12) INFO 03-02 09:14:02 [utils.py:328] non-default args: {", "}"),
    ("[2026-03-02 09:14:02] server_args=ServerArgs(", ")"),
    ("INFO 03-02 09:14:02 api_server.py:712] args: Namespace(", ")")])
def test_a_long_record_that_closed_its_bracket_does_not_swallow_a_long_line_after_it(opening, closing):
    """A whole argument record over WRAPPED characters, then a download bar a paste kept (long,
    no header of its own): the record closed its bracket, so it is whole — joining the bar to it
    made its literal unreadable past the junk, and the last field (the utilization) was lost."""
    fields = ", ".join(f"'f{i}': {i}" if closing == "}" else f"f{i}={i}" for i in range(30))
    last = "'gpu_memory_utilization': 0.85" if closing == "}" else "gpu_memory_utilization=0.85"
    record = f"{opening}{fields}, {last}{closing}"
    bar = "config.json: 100%|" + "\u2588" * 120 + "| 855/855 [00:00<00:00, 6.19MB/s]"
    lines = candidates(record, bar, "(APIServer pid=12) INFO 03-02 09:14:08 [__init__.py:1778] Using max model len 131072")
    assert lines[0].text == record and [l.number for l in lines] == [1, 3]


def test_every_grammar_case_line_passes_the_prefilter():
    """A line kind the grammar knows but no KEYWORD names would be silently dropped."""
    assert POSITIVE, "no grammar cases loaded"
    for case_id, line, expect, xfail in POSITIVE:
        found = candidates(line)
        assert len(found) == 1, f"{case_id}: the prefilter dropped {line!r} (KEYWORDS={len(KEYWORDS)})"
        if not xfail:
            parsed = parse_sglang_line(found[0].text)
            assert parsed is not None and parsed.cls.__name__ == expect["cls"], case_id


# ---- physical_lines() / open_input() ---------------------------------------------------------------

def test_line_numbers_count_newlines(tmp_path):
    data = "\n".join(["noise", BEGIN, "noise", "[2025-02-04 05:21:40 TP0] Memory pool end. avail mem=9.31 GB", ""])
    assert [(f.evidence.line, f.kind) for f in facts_of(data.encode())] == [(2, "LoadWeightBegin"), (4, "MemoryPoolEnd")]
    crlf = data.replace("\n", "\r\n").encode()
    assert [f.evidence.line for f in facts_of(crlf)] == [2, 4]


def test_carriage_return_does_not_shift_line_numbers():
    data = ("noise\n" + TQDM.replace("100%", " 10%") + "\r" + TQDM + "\r" + BEGIN + "\n"
            + "[2025-02-04 05:21:40 TP0] Memory pool end. avail mem=9.31 GB\n").encode()
    assert [f.evidence.line for f in facts_of(data)] == [2, 3]


def test_evidence_keeps_the_raw_text_without_its_colour():
    # the container prefix stays (it is the line as the user has it); ANSI colour does not
    raw = "sglang-1  | \x1b[32m" + BEGIN + "\x1b[0m"
    fact = facts_of((raw + "\n").encode())[0]
    assert fact.evidence.text == "sglang-1  | " + BEGIN and fact.evidence.line == 1


def test_invalid_utf8_is_replaced_not_fatal():
    data = b"\xff\xfe noise \xc3\x28\n" + BEGIN.encode() + b"\n"
    assert [f.kind for f in facts_of(data)] == ["LoadWeightBegin"]


def test_gzip_input(tmp_path):
    text = "\n".join(["noise", BEGIN, "[2025-02-04 05:21:40 TP0] Memory pool end. avail mem=9.31 GB"]) + "\n"
    plain = tmp_path / "a.log"
    plain.write_text(text)
    gz = tmp_path / "a.log.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    named_oddly = tmp_path / "a.txt"  # detected by its magic bytes, not its name
    named_oddly.write_bytes(gzip.compress(text.encode()))
    want, n = read_log(str(plain))[0], read_log(str(plain))[-1]
    for path in (gz, named_oddly):
        got, m = read_log(str(path))[0], read_log(str(path))[-1]
        assert m == n == 3
        assert [(f.kind, f.evidence.line, f.evidence.text) for f in got] == \
               [(f.kind, f.evidence.line, f.evidence.text) for f in want]


def test_binary_input_is_an_input_error(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"\x00\x01\x02\x00" * 4096)
    with pytest.raises(InputError, match="binary"):
        read_log(str(path))
    with pytest.raises(InputError):
        list(physical_lines(io.BytesIO(b"\x00" * 100 + b"\n" + BEGIN.encode())))


def test_truncated_gzip_is_an_input_error(tmp_path):
    path = tmp_path / "cut.log.gz"
    path.write_bytes(gzip.compress(((BEGIN + "\n") * 1000).encode())[:200])
    with pytest.raises(InputError):
        read_log(str(path))


def test_corrupt_gzip_is_an_input_error(tmp_path):
    path = tmp_path / "bad.log.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage-not-gzip" * 10)
    with pytest.raises(InputError):
        read_log(str(path))


def test_open_input_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        open_input(str(tmp_path / "missing.log"))
    with pytest.raises(InputError, match="directory"):
        open_input(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a chmod 000 file")
def test_unreadable_file_is_an_input_error(tmp_path):
    path = tmp_path / "secret.log"
    path.write_text(BEGIN)
    path.chmod(0)
    with pytest.raises(InputError):
        open_input(str(path))


def test_very_long_line_is_cut_not_fatal(monkeypatch):
    import capdiag.source as source
    monkeypatch.setattr(source, "MAX_LINE", 1000)
    data = ("x" * 5000 + "\n" + BEGIN + "\n").encode()
    got = list(physical_lines(io.BytesIO(data)))
    assert got[-1] == (2, BEGIN) and len(got[0][1]) <= 1000


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_reading_in_chunks_keeps_every_line_and_its_number(monkeypatch, chunk):
    """Lines cut across read chunks, CRLF ends, NULs and over-long lines come out the same
    whatever the chunk size."""
    import capdiag.source as source
    monkeypatch.setattr(source, "CHUNK", chunk)
    monkeypatch.setattr(source, "MAX_LINE", 80)
    data = ("first\r\n" + "y" * 200 + "\n\n" + BEGIN + "\r\nnul\x00led\n" + "z" * 81 + "\nlast").encode()
    got = list(physical_lines(io.BytesIO(data)))
    assert got == [(1, "first"), (2, "y" * 80), (3, ""), (4, BEGIN), (5, "nulled"), (6, "z" * 80), (7, "last")]


def test_binary_data_is_refused_whatever_the_chunk_size(monkeypatch):
    import capdiag.source as source
    monkeypatch.setattr(source, "CHUNK", 3)
    with pytest.raises(InputError, match="binary"):
        list(physical_lines(io.BytesIO(b"ok\n" + b"\x00" * 40 + b"\n")))
    # NULs after the first five lines are stripped, not taken for binary data
    got = list(physical_lines(io.BytesIO(b"a\n" * 5 + b"\x00" * 40 + b"\n")))
    assert got[-1] == (6, "")


def test_hits_after_removed_ansi_codes_and_nuls_keep_their_lines():
    """ANSI codes and NULs are taken out before the keyword scan, which moves the offsets;
    the hits must still land on their own lines, with the right numbers."""
    traffic = "\x1b[32mINFO\x1b[0m:     127.0.0.1:51234 - \"POST /generate HTTP/1.1\" 200 OK"
    physical = [traffic, "Load\x00 weight begin. avail mem=78.58 GB", traffic, traffic,
                "\x1b[1mKV Cache is allocated.\x1b[0m #tokens: 7", traffic]
    data = "\n".join(physical).encode()
    lines = list(candidate_runs(physical_runs(io.BytesIO(data))))
    assert [(l.number, l.text) for l in lines] == [
        (2, "Load weight begin. avail mem=78.58 GB"), (5, "KV Cache is allocated. #tokens: 7")]


# ---- encodings: byte-order marks, UTF-16 (PowerShell's `>`), CRLF; real binaries refused -----------

VLLM_KV = "INFO 04-19 17:30:52 [gpu_worker.py:298] Available KV cache memory: 54.78 GiB"
VLLM_LOAD = "INFO 04-19 17:30:40 [gpu_model_runner.py:1770] Model loading took 14.9889 GiB and 6.02 seconds"


@pytest.mark.parametrize("encoding, bom", [
    ("utf-8", b"\xef\xbb\xbf"), ("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff"),
    ("utf-16-le", b""), ("utf-16-be", b""),
], ids=["utf8-bom", "utf16le-bom", "utf16be-bom", "utf16le-no-bom", "utf16be-no-bom"])
def test_byte_order_marks_and_utf16_are_decoded(tmp_path, encoding, bom):
    text = "\r\n".join(["noise", VLLM_LOAD, VLLM_KV, ""])  # CRLF line ends, as Windows writes them
    path = tmp_path / "powershell.log"
    path.write_bytes(bom + text.encode(encoding))
    lines = list(physical_lines(open_input(str(path))))
    assert [n for n, _ in lines] == [1, 2, 3] and lines[2][1] == VLLM_KV  # no BOM, no \r left
    facts, framework, count = read_log(str(path))
    assert framework == "vllm" and count == 3
    assert [f.kind for f in facts] == ["VllmModelLoading", "VllmAvailableKV"]
    assert [f.evidence.line for f in facts] == [2, 3] and facts[1].evidence.text == VLLM_KV


def test_utf16_inside_gzip_and_from_bytes(tmp_path):
    data = "\r\n".join([VLLM_LOAD, VLLM_KV]).encode("utf-16")  # Python's utf-16 writes the BOM
    path = tmp_path / "log.gz"
    path.write_bytes(gzip.compress(data))
    assert [f.kind for f in read_log(str(path))[0]] == ["VllmModelLoading", "VllmAvailableKV"]
    assert [f.kind for f in facts_of(data)] == ["VllmModelLoading", "VllmAvailableKV"]


@pytest.mark.parametrize("data", [
    bytes(range(256)) * 8,  # every byte value: NULs with no UTF-16 order
    b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 56 + b"\x02\x00>\x00\x01\x00\x00\x00" * 40,
    b"\xff\xfe" + bytes(range(256)) * 4,  # a BOM, then no text: decoded, but nothing to read
], ids=["all-bytes", "elf", "bom-then-binary"])
def test_real_binaries_are_still_refused(tmp_path, data):
    path = tmp_path / "blob.log"
    path.write_bytes(data)
    with pytest.raises(InputError):
        read_log(str(path))


# ---- JSON log records and ANSI colour, removed once where the line is read ---------------------------

def test_a_json_log_record_is_read_as_the_line_it_carries():
    record = ('{"log":"\\u001b[0;36m(VllmWorker rank=1 pid=4102)\\u001b[0;0m ' + VLLM_KV + '\\n",'
              '"stream":"stderr","time":"2026-04-19T17:30:52.611Z"}')
    (fact,) = facts_of((record + "\n").encode())
    assert fact.kind == "VllmAvailableKV" and fact.rank.tp == 1
    assert fact.evidence.text == "(VllmWorker rank=1 pid=4102) " + VLLM_KV  # decoded, colour gone


def test_text_that_only_looks_like_json_is_left_alone():
    assert clean('{"log": not json') == ['{"log": not json']
    assert facts_of(b'{"message": 3, "x": "Model loading took 1.0 GiB"}\n') == []


def test_ansi_colour_never_reaches_any_output_format(tmp_path):
    from capdiag.analysis import analyse
    from capdiag.render import render
    from capdiag.report import build
    coloured = [f"\x1b[1;36m(VllmWorker rank=0 pid=77)\x1b[0;0m {VLLM_LOAD}",
                f"\x1b[1;36m(VllmWorker rank=0 pid=77)\x1b[0;0m {VLLM_KV}"]
    path = tmp_path / "colour.log"
    path.write_text("\n".join(coloured) + "\n")
    report = build(analyse(str(path)))
    for fmt in ("json", "markdown", "html", "text"):
        out = render(report, fmt)
        assert "\x1b" not in out and "\\u001b" not in out, fmt
    kv = next(r for r in report["breakdown"] if r["category"] == "kv_cache")
    assert kv["evidence"][0]["text"] == "(VllmWorker rank=0 pid=77) " + VLLM_KV


@pytest.mark.parametrize("raw", [
    "2026-04-19 17:30:52.611 | " + VLLM_KV,
    "Apr 19 17:30:52 gpu-node-4 vllm[20817]: " + VLLM_KV,
    "Apr  9 07:03:11 gpu-node-4 docker[991]: " + VLLM_KV,
    "2026-04-19T17:30:52+0000 gpu-node-4 vllm[20817]: " + VLLM_KV,
    "2026-04-19T17:30:52.611123456Z stderr F " + VLLM_KV,
    "[pod/vllm-7c9d5b-x2k4q/vllm] " + VLLM_KV,
    "2026-04-19T17:30:52.6113452Z " + VLLM_KV,
    "vllm-1  | 2026-04-19T17:30:52.611Z " + VLLM_KV,
    "[INFO ] PyProcess - W-210-model-stdout: " + VLLM_KV,
    "INFO ] PyProcess - W-1822-deepseek-coder.v2-stderr: " + VLLM_KV,
    "[WARN ] PyProcess - W-210-model-stdout: " + VLLM_KV,
], ids=["docker-desktop-bar", "journald", "journald-one-digit-day", "journald-iso", "cri", "kubectl-prefix",
        "github-actions", "compose+timestamps", "djl-worker", "djl-worker-bracket-lost", "djl-warn"])
def test_host_and_container_prefixes_before_vllm_lines(raw):
    assert clean(raw) == [VLLM_KV]


def test_colours_a_syslog_relay_escaped_as_text_are_removed(tmp_path):
    # rsyslog (then CloudWatch) writes ESC as `#033`: `#033[1;36m(VllmWorkerProcess pid=240)#033[0;0m`
    line = ("[INFO ] PyProcess - W-210-model-stdout: #033[1;36m(VllmWorkerProcess pid=240)#033[0;0m INFO 02-14 "
            "08:23:25 model_runner.py:1563] Graph capturing finished in 5 secs, took 0.47 GiB")
    path = tmp_path / "djl.log"
    path.write_text(line + "\n")
    (found,) = [l.text for l in candidate_lines(physical_lines(open_input(str(path))))]
    assert found == ("(VllmWorkerProcess pid=240) INFO 02-14 08:23:25 model_runner.py:1563] Graph capturing "
                     "finished in 5 secs, took 0.47 GiB")
