"""Paste damage: a column cut that lost the middle or end of a line (read the fields before the
damage, leave the rest unknown, say so in the evidence), a markdown paste that ate `# `."""
from __future__ import annotations

from capdiag.parsing.sglang import parse_sglang_line
from capdiag.parsing.vllm import parse_vllm_line
from helpers import corpus_report, write_log

BUDGET = ("[2025-06-02 11:20:45 DP0 TP0 EP0] max_total_num_tokens=65536, chunked_prefill_size=4096, "
          "max_prefill_tokens=16384, max_running_requests=48, context_len=131072, available_gpu_mem=7.41 GB")


def test_a_column_cut_keeps_the_fields_before_it():
    cut = BUDGET[:BUDGET.index("available")] + "1 GB"  # the screen copy lost `available_gpu_mem=7.4`
    parsed = parse_sglang_line(cut)
    assert parsed.values["max_running_requests"] == 48 and parsed.values["context_len"] == 131072
    assert parsed.values["available_gpu_mem_gib"] is None
    assert parsed.read_to == cut.index(", 1 GB")


def test_a_cut_inside_a_field_drops_that_field_whole():
    cut = BUDGET[:BUDGET.index("context_len") + 7] + ".41 GB"  # `context` then the tail of another field
    parsed = parse_sglang_line(cut)
    assert parsed.values["max_running_requests"] == 48 and parsed.values["context_len"] is None


def test_an_undamaged_line_is_read_whole():
    parsed = parse_sglang_line(BUDGET)
    assert parsed.read_to is None and parsed.values["available_gpu_mem_gib"] == 7.41


def test_a_line_of_no_known_kind_stays_unread():
    assert parse_sglang_line("[2025-06-02 11:20:45 TP0] something, else = 3 GB, .5") is None


def test_the_report_reads_the_damaged_line_and_says_so(tmp_path):
    log = write_log(tmp_path, "\n".join([
        "[2025-06-02 11:20:30 DP0 TP0 EP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=21.02 GB, mem usage=40.11 GB.",
        BUDGET[:BUDGET.index("available")] + "1 GB",
    ]) + "\n")
    report = corpus_report(log)
    assert report["observed"]["max_running_requests"] == 48 and report["observed"]["context_len"] == 131072
    assert report["observed"]["available_gpu_mem_gib"] is None
    cited = [e for f in report["findings"] for e in f["evidence"] if e["line"] == 2]
    assert cited and all(e["where"] == "line 2 (damaged: read up to column 158)" for e in cited)
    assert report["config_sources"]["max_running_requests"].startswith("effective max_running_requests=48")
    assert report["config"]["context_len"] == 131072


def test_markdown_ate_the_hash_of_gpu_blocks():
    (parsed,) = parse_vllm_line("GPU blocks: 2310, CPU blocks: 2048")
    assert parsed.values["blocks"] == 2310 and parsed.values["cpu_blocks"] == 2048
    (parsed,) = parse_vllm_line("INFO 09-11 12:01:55 [executor_base.py:113] CUDA blocks: 21845, # CPU blocks: 4096")
    assert parsed.values["blocks"] == 21845
