"""Many logs at once: `capdiag explain LOG LOG… | DIR` as a table, JSON lines or CSV, in input
order from worker processes, a bad log reported without stopping the others."""
from __future__ import annotations

import csv
import io
import json
import shutil

import pytest
from click.testing import CliRunner

from capdiag.batch import SUMMARY_COLUMNS
from capdiag.cli import main
from helpers import SHARED, fixture, run_entry

LOGS = [fixture("single_gpu_ready.log"), fixture("vllm_v092_tp2.log"), fixture("oom_capture.log"),
        fixture("mla_tp2.log")]


def invoke(*args):
    return CliRunner().invoke(main, list(args), standalone_mode=False, catch_exceptions=True)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_jsonl_is_one_report_per_log_in_input_order(jobs):
    result = invoke("explain", *LOGS, "--format", "jsonl", "--jobs", jobs)
    assert result.exception is None, result.output
    reports = [json.loads(line) for line in result.output.splitlines()]
    assert [r["source"]["path"] for r in reports] == LOGS
    assert [r["framework"] for r in reports] == ["sglang", "vllm", "sglang", "sglang"]
    single = json.loads(invoke("explain", LOGS[0], "--format", "json").output)
    assert reports[0] == single  # the same report explain gives for the log alone


def test_a_bad_log_is_reported_and_the_others_go_on(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty.log"
    empty.write_text("")
    code, out, err = run_entry(monkeypatch, capsys, "explain", LOGS[0], str(empty), str(tmp_path / "gone.log"),
                               LOGS[1], "--format", "jsonl", "--jobs", "2")
    assert code == 2
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line.get("schema") for line in lines] == ["capdiag.report/1", "capdiag.error/1", "capdiag.error/1",
                                                      "capdiag.report/1"]
    assert lines[1] == {"schema": "capdiag.error/1", "path": str(empty), "error": f"{empty}: the log is empty"}
    assert err.splitlines() == [f"capdiag: error: {empty}: the log is empty",
                                f"capdiag: error: {tmp_path / 'gone.log'}: no such file"]


def test_a_directory_stands_for_its_logs_in_name_order(tmp_path):
    for name in ("b.log", "a.log.gz", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    shutil.copy(LOGS[0], tmp_path / "b.log")
    import gzip
    (tmp_path / "a.log.gz").write_bytes(gzip.compress(open(LOGS[1], "rb").read()))
    result = invoke("explain", str(tmp_path), "--format", "jsonl")
    paths = [json.loads(line)["source"]["path"] for line in result.output.splitlines()]
    assert paths == [str(tmp_path / "a.log.gz"), str(tmp_path / "b.log")]


def test_a_directory_without_logs_is_one_line(tmp_path, monkeypatch, capsys):
    code, _, err = run_entry(monkeypatch, capsys, "explain", str(tmp_path))
    assert code == 2 and err == f"capdiag: error: {tmp_path}: a directory with no *.log or *.log.gz file\n"


def test_the_summary_table_has_a_row_per_log():
    result = invoke("explain", *LOGS)
    lines = result.output.splitlines()
    assert lines[0].split() == ["log", "model", "framework", "GPU", "TP", "weights", "GiB", "KV", "GiB", "KV",
                                "tokens", "concurrent", "worst", "finding", "phase"]
    row = lines[1].split()
    assert row[0] == LOGS[0] and row[1] == "meta-llama/Llama-3.1-8B-Instruct" and row[2] == "sglang"
    assert row[4:9] == ["1", "15.10", "48.82", "400000", "48"] and row[-1] == "ready"
    assert "error CD102 out-of-memory" in lines[3] or "error CD101" in lines[3]
    assert lines[3].split()[-1] != "ready"


def test_csv_for_spreadsheets():
    result = invoke("explain", *LOGS, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert list(rows[0]) == list(SUMMARY_COLUMNS) and len(rows) == len(LOGS)
    assert (rows[0]["weights_gib"], rows[0]["kv_gib"], rows[0]["kv_tokens"], rows[0]["concurrency"]) == \
        ("15.1", "48.82", "400000", "48")
    assert rows[0]["worst_code"] and rows[0]["phase"] == "ready" and rows[0]["error"] == ""


@pytest.mark.parametrize("fmt", ["json", "html", "markdown"])
def test_one_report_formats_refuse_many_logs(fmt, monkeypatch, capsys):
    code, _, err = run_entry(monkeypatch, capsys, "explain", *LOGS[:2], "--format", fmt)
    assert code == 2 and "for many logs use table, jsonl, csv" in err


@pytest.mark.skipif(not (SHARED / "corpus").is_dir(), reason="shared corpus (../shared) is absent")
def test_the_whole_corpus_as_jsonl_and_table():
    dirs = sorted(str(p) for p in (SHARED / "corpus").iterdir() if p.is_dir())
    result = invoke("explain", *dirs, "--format", "jsonl", "--jobs", "2")
    reports = [json.loads(line) for line in result.output.splitlines()]
    logs = sorted(str(p) for d in dirs for p in __import__("pathlib").Path(d).iterdir() if p.name.endswith(".log"))
    assert [r["source"]["path"] for r in reports] == logs
    assert all(r["schema"] == "capdiag.report/1" for r in reports)
    table = invoke("explain", *dirs).output.splitlines()
    assert len(table) == 1 + len(logs) + ("* an upper bound" in table[-1])


def test_csv_cells_from_the_log_never_run_as_formulas(tmp_path):
    """A model name a log states (`=HYPERLINK(…)`, `@SUM(…)`, `+…`, `-…`) reaches the CSV as text
    a spreadsheet shows, not a formula it runs: a leading `'`."""
    text = open(fixture("single_gpu_ready.log"), encoding="utf-8").read()
    logs = []
    for n, name in enumerate(('=HYPERLINK("http://x.invalid","m")', "@SUM(A1:A9)", "+cmd|/C calc!A0", "-2+3")):
        path = tmp_path / f"m{n}.log"
        path.write_text(text.replace("meta-llama/Llama-3.1-8B-Instruct", name), encoding="utf-8")
        logs.append(str(path))
    rows = list(csv.DictReader(io.StringIO(invoke("explain", *logs, "--format", "csv").output)))
    assert [r["model"] for r in rows] == ["'" + n for n in ('=HYPERLINK("http://x.invalid","m")', "@SUM(A1:A9)",
                                                            "+cmd|/C calc!A0", "-2+3")]
    assert all(r["weights_gib"] == "15.1" for r in rows)  # figures stay numbers


# ---- many logs in bounded memory, on any executor -------------------------------------------

class _Counting:
    """An executor that runs each task when submitted and counts the results not yet taken."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.most_held = self.held = 0

    def submit(self, fn, *args):
        future = self.pool.submit(fn, *args)
        self.held += 1
        self.most_held = max(self.most_held, self.held)
        future.add_done_callback(lambda _: None)
        return future

    def taken(self):
        self.held -= 1


def test_the_reports_in_flight_do_not_grow_with_the_logs():
    from capdiag import batch
    from capdiag.api import report_of
    pool = _Counting()
    logs = LOGS * 15  # 60 logs
    seen = []
    for item in batch.explain_many(logs, report_of, jobs=2, executor=pool):
        pool.taken()
        seen.append(item.path)
    assert seen == logs and pool.most_held <= 2 * 4 + 1  # the window, not the 60 logs


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_any_executor_runs_them_in_input_order(kind):
    import capdiag
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
    with (ThreadPoolExecutor if kind == "thread" else ProcessPoolExecutor)(max_workers=2) as pool:
        outcomes = list(capdiag.explain_many(LOGS, executor=pool, gpu="h100_sxm"))
    assert [o.path for o in outcomes] == LOGS and all(o.error is None for o in outcomes)
    assert outcomes[0].report.to_dict() == capdiag.explain(LOGS[0], gpu="h100_sxm").to_dict()


def test_a_local_dask_cluster_runs_them():
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed")
    import capdiag
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        outcomes = list(capdiag.explain_many(LOGS, executor=client.get_executor()))
    assert [o.path for o in outcomes] == LOGS
    assert [o.report.framework for o in outcomes] == ["sglang", "vllm", "sglang", "sglang"]


def test_jsonl_is_written_as_each_log_is_done(monkeypatch, capsys):
    """The CLI writes each report as it comes: the first line is out before the last log is read."""
    from capdiag import batch
    written = []
    real = batch.explain_many

    def watched(*args, **kwargs):
        for item in real(*args, **kwargs):
            written.append(("done", item.path))
            yield item
    monkeypatch.setattr(batch, "explain_many", watched)
    import capdiag.cli as cli
    real_write = cli._write

    def write(pieces, output, *rest):
        def each():
            for piece in pieces:
                written.append(("written", json.loads(piece)["source"]["path"]))
                yield piece
        return real_write(each(), output, *rest)
    monkeypatch.setattr(cli, "_write", write)
    code, _, _ = run_entry(monkeypatch, capsys, "explain", *LOGS, "--format", "jsonl", "--jobs", "1")
    assert code == 0
    assert written[:2] == [("done", LOGS[0]), ("written", LOGS[0])]
