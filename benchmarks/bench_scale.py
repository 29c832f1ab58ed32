#!/usr/bin/env python3
"""Benchmark capdiag on inputs that are large in one dimension (issue 14): many ranks, many
launches, a soft-wrapped paste, a comma-continued line, a million keyword lines, 100,000
tracebacks after the server is ready.

Each input is generated in the servers' real format by tests/scale_logs.py (the same
generators the test suite runs at small sizes), then `capdiag explain --format json -o FILE`
runs on it under /usr/bin/time; the table gives wall and CPU seconds and peak RSS, and a check
that the report describes the input (launch count, ranks, lines). Standard library only.

    python benchmarks/bench_scale.py                      # every input at full size
    python benchmarks/bench_scale.py --only ranks launches
    python benchmarks/bench_scale.py --scale 0.1          # a tenth of each size
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import scale_logs  # noqa: E402  (tests/ holds the generators the suite shares)

# name: (generator, full size, what the report must say)
INPUTS = {
    "ranks": (scale_logs.many_ranks, 10_000, lambda r, n: len(r["ranks"]) == n and r["source"]["launches"] == 1),
    "launches": (scale_logs.many_launches, 20_000,
                 lambda r, n: r["source"]["launches"] == n and r["source"]["analyzed_launch"] == n),
    "paste": (scale_logs.soft_wrapped_paste, 10_000_000, lambda r, n: r["observed"]["kv_tokens"] == 415615),
    "comma": (scale_logs.comma_continued, 100_000, lambda r, n: r["source"]["launches"] == 1),
    "keywords": (scale_logs.keyword_lines, 1_000_000, lambda r, n: r["source"]["lines"] == n + 27),
    "tracebacks": (scale_logs.tracebacks_after_ready, 100_000,
                   lambda r, n: r["source"]["last_line"] == 27 + 7 * n and r["source"]["ready"]),
}
UNITS = {"ranks": "ranks", "launches": "launches", "paste": "bytes", "comma": "comma-ended lines",
         "keywords": "keyword lines", "tracebacks": "tracebacks after ready"}


def run(capdiag: str, log: Path, out: Path) -> dict:
    """Wall and CPU seconds and peak RSS (MiB) of one explain run, from GNU time's -v report."""
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", capdiag, "explain", "--format", "json", "-o", str(out), str(log)],
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"capdiag failed on {log}: {done.stderr[-2000:]}")
    field = lambda name: float(re.search(rf"{name}: ([\d.]+)", done.stderr).group(1))  # noqa: E731
    return {"wall_s": wall, "cpu_s": field("User time \\(seconds\\)") + field("System time \\(seconds\\)"),
            "rss_mib": field("Maximum resident set size \\(kbytes\\)") / 1024}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=sorted(INPUTS), default=sorted(INPUTS))
    p.add_argument("--scale", type=float, default=1.0, help="multiply every size by this (default 1)")
    p.add_argument("--capdiag", default=str(ROOT / ".venv" / "bin" / "capdiag"))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "capdiag-scale"))
    args = p.parse_args()
    if not os.path.exists("/usr/bin/time"):
        p.error("needs GNU time at /usr/bin/time")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.only:
        generate, size, check = INPUTS[name]
        n = max(1, int(size * args.scale))
        if name == "ranks":
            n -= n % scale_logs.TP
        log = out / f"{name}-{n}.log"
        lines = scale_logs.write(log, generate(n))
        result = run(args.capdiag, log, out / f"{name}.json")
        report = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
        row = {"input": name, "size": n, "unit": UNITS[name], "lines": lines, "mib": log.stat().st_size / 2**20,
               **result, "report_ok": bool(check(report, n))}
        print(f"{name}: {n:,} {UNITS[name]}, {lines:,} lines, {row['mib']:.1f} MiB: {row['wall_s']:.1f} s wall, "
              f"{row['cpu_s']:.1f} s CPU, peak RSS {row['rss_mib']:.0f} MiB, report {'ok' if row['report_ok'] else 'WRONG'}",
              flush=True)
        rows.append(row)
        log.unlink()
    print("\n| input | size | lines | MiB | wall s | CPU s | peak RSS MiB | report |\n|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['input']} | {r['size']:,} {r['unit']} | {r['lines']:,} | {r['mib']:.1f} | {r['wall_s']:.1f} "
              f"| {r['cpu_s']:.1f} | {r['rss_mib']:.0f} | {'ok' if r['report_ok'] else 'WRONG'} |")
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    return 0 if all(r["report_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
