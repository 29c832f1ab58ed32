"""`--format html`: one self-contained page (inline CSS and SVG, no script, nothing fetched), a
stacked bar per rank drawn to scale, a concurrency chart, findings whose evidence links land on
their log lines; and a real-browser check with headless Chromium when it can be had."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Optional

import pytest

from capdiag.analysis import analyse
from capdiag.render import FORMATS, render
from capdiag.report import build
from helpers import SHARED, TESTS, fixture, write_log

CORPUS = SHARED / "corpus"
needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason="shared corpus (../shared) is absent")
EXAMPLE = TESTS.parent / "capdiag" / "examples" / "sglang-llama31-8b-h100.log"
ARTIFACTS = TESTS / "artifacts"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}


# ---- a small DOM from html.parser ------------------------------------------------------------

@dataclass
class Node:
    tag: str
    attrs: dict[str, Optional[str]]
    parent: Optional["Node"] = None
    children: list["Node"] = field(default_factory=list)
    text: str = ""

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    def iter(self):
        yield self
        for child in self.children:
            yield from child.iter()

    def find_all(self, tag: str, cls: Optional[str] = None) -> list["Node"]:
        return [n for n in self.iter() if n.tag == tag and (cls is None or cls in n.classes())]

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)

    def own_title(self) -> Optional[str]:
        titles = [c for c in self.children if c.tag == "title"]
        return titles[0].all_text() if titles else None


class DomParser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.current = self.root
        self.starts: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.current)
        self.current.children.append(node)
        self.starts.append((tag, dict(attrs)))
        if tag not in VOID:
            self.current = node

    def handle_startendtag(self, tag, attrs):
        self.current.children.append(Node(tag, dict(attrs), self.current))
        self.starts.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        node = self.current
        while node is not self.root and node.tag != tag:
            node = node.parent
        if node is not self.root:
            self.current = node.parent

    def handle_data(self, data):
        self.current.text += data


def parse(html: str) -> DomParser:
    p = DomParser()
    p.feed(html)
    p.close()
    return p


# ---- the cases -------------------------------------------------------------------------------

def _smi(tmp_path: Path, rows: list[tuple[int, int, int]]) -> str:
    return write_log(tmp_path, "".join(f"{i}, {u} MiB, {f} MiB\n" for i, u, f in rows), "smi.csv")


def _case(name: str, tmp_path: Path) -> dict:
    """A report for one named case; skips when the shared corpus is needed and absent."""
    sg = CORPUS / "sglang"
    vl = CORPUS / "vllm"
    cases = {
        "sglang-one-gpu-total-unknown": lambda: dict(path=fixture("single_gpu_ready.log")),
        "sglang-one-gpu-total": lambda: dict(path=fixture("single_gpu_ready.log"), gpu_total_gib=80.0),
        "sglang-tp2-smi": lambda: dict(path=fixture("mla_tp2.log"), gpu="h100_sxm",
                                       nvidia_smi=_smi(tmp_path, [(0, 70000, 11559), (1, 70500, 11059)])),
        "sglang-oom-capture": lambda: dict(path=fixture("oom_capture.log")),
        "sglang-restarts": lambda: dict(path=fixture("restart_then_ready.log")),
        "sglang-not-enough-memory": lambda: dict(path=fixture("not_enough_memory.log")),
        "sglang-eagle": lambda: dict(path=fixture("eagle_v0514.log"), gpu_total_gib=80.0),
        "sglang-example": lambda: dict(path=str(EXAMPLE), gpu="h100_sxm"),
        "corpus-sglang-dsv4-smi": lambda: dict(
            path=str(sg / "012-dsv4-flash-h20-tp8-fixture-memory-profiling.log"), gpu="h20",
            nvidia_smi=str(sg / "012-dsv4-flash-h20-tp8-fixture-memory-profiling.smi.csv")),
        "corpus-sglang-dsv4": lambda: dict(path=str(sg / "012-dsv4-flash-h20-tp8-fixture-memory-profiling.log")),
        "corpus-vllm-tp8": lambda: dict(path=str(vl / "018-qwen3-235b-a22b-fp8-tp8-ep-fp8kv-h100-v0.10.0.log")),
        "corpus-vllm-tp8-smi": lambda: dict(
            path=str(vl / "018-qwen3-235b-a22b-fp8-tp8-ep-fp8kv-h100-v0.10.0.log"),
            nvidia_smi=_smi(tmp_path, [(i, 76000 + 10 * i, 5559 - 10 * i) for i in range(8)])),
        "corpus-vllm-pp2": lambda: dict(path=str(vl / "403-qwen3-32b-pp2-worker-pp-blog-v0.27.1.log")),
        "corpus-vllm-dp": lambda: dict(path=str(vl / "405-mla-1m-ctx-dp4-tp4-dcp-ascend-decode-node-engcore-dp3-excerpt.log")),
    }
    if name.startswith("corpus-") and not CORPUS.is_dir():
        pytest.skip("shared corpus (../shared) is absent")
    kwargs = cases[name]()
    path = kwargs.pop("path")
    return build(analyse(path, **kwargs))


CASES = ["sglang-one-gpu-total-unknown", "sglang-one-gpu-total", "sglang-tp2-smi", "sglang-oom-capture",
         "sglang-restarts", "sglang-not-enough-memory", "sglang-eagle", "sglang-example", "corpus-sglang-dsv4-smi",
         "corpus-sglang-dsv4", "corpus-vllm-tp8", "corpus-vllm-tp8-smi", "corpus-vllm-pp2", "corpus-vllm-dp"]


def check_page(report: dict, html: str) -> DomParser:
    """Everything a page must satisfy, whatever the log."""
    p = parse(html)
    doc = p.root
    assert html.startswith("<!DOCTYPE html>")
    # self-contained: no script, nothing fetched
    assert not doc.find_all("script") and "<script" not in html.lower()
    assert not doc.find_all("link") and not doc.find_all("img") and not doc.find_all("iframe")
    for tag, attrs in p.starts:
        for key in ("src", "href", "xlink:href", "srcset", "action", "data"):
            value = (attrs.get(key) or "").strip().lower()
            assert not re.match(r"(https?:)?//", value), f"<{tag} {key}={value}>"
        assert not any(k.startswith("on") for k in attrs), f"<{tag}> has an event handler"
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", html) and "@import" not in html
    # ids unique; every in-page link lands on an id
    ids = [a["id"] for _, a in p.starts if a.get("id")]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    for _, attrs in p.starts:
        href = attrs.get("href")
        if href is not None:
            assert href.startswith("#") and href[1:] in ids, href

    # one bar group per rank, in order, marked target / binding
    groups = doc.find_all("g", "rank-bar")
    assert [g.attrs["data-rank"] for g in groups] == [rk["label"] for rk in report["ranks"]]
    for g, rk in zip(groups, report["ranks"]):
        assert ("is-target" in g.classes()) == rk["target"] and ("is-binding" in g.classes()) == rk["binding"]
        scale, width = float(g.attrs["data-scale-gib"]), float(g.attrs["data-bar-width"])
        segs = g.find_all("rect", "seg")
        drawn = {s.attrs["data-category"]: s for s in segs}
        for seg in rk["segments"]:
            if seg["gib"] > 0:
                rect = drawn[seg["category"]]
                assert float(rect.attrs["data-gib"]) == seg["gib"]
                title = rect.own_title()
                shown = f"{seg['gib']:.2f}" if isinstance(seg["gib"], float) else str(seg["gib"])
                assert title and rk["label"] in title and f": {shown} GiB" in title
        for rect in segs:  # width / bar width = GiB / scale
            assert float(rect.attrs["width"]) / width == pytest.approx(float(rect.attrs["data-gib"]) / scale, abs=1e-4)
        total = report["gpu"]["total_gib"]
        stated = sum(max(0, s["gib"]) for s in rk["segments"])
        covered = sum(float(r.attrs["width"]) for r in segs) / width
        if total:
            assert g.attrs["data-against"] == "gpu_total"
            assert covered == pytest.approx(max(total, stated) / scale, abs=1e-3)
            if stated < total - 0.01:
                assert "unstated" in drawn
        else:
            assert g.attrs["data-against"] == "rank_sum"
            assert covered == pytest.approx(1.0 if stated > 0 else 0.0, abs=1e-3)
            assert "unstated" not in drawn
    table = doc.find_all("table", "rank-memory")
    if report["ranks"] and any(rk["segments"] for rk in report["ranks"]):
        assert table and len(table[0].find_all("tbody")[0].find_all("tr")) == len(report["ranks"])
        # the caption explains only a column the table has (SGLang's breakdown has no `unstated`)
        headings = " ".join(th.all_text() for th in table[0].find_all("thead")[0].find_all("th"))
        caption = table[0].find_all("caption")[0].all_text()
        assert all(named in headings for named in re.findall("“([^”]+)”", caption)), (caption, headings)

    # findings: grouped by severity, each a <details> whose log evidence links to the excerpt line
    details = doc.find_all("details", "finding")
    assert len(details) == len(report["findings"])
    order = [d.attrs["class"].split()[1] for d in details]
    assert order == sorted(order, key=["sev-error", "sev-warning", "sev-info"].index)
    for d, f in zip(details, report["findings"]):
        hrefs = {a.attrs["href"] for a in d.find_all("a")}
        for e in f["evidence"]:
            if e["source"] == "log" and e["line"] > 0:
                assert f"#L{e['line']}" in hrefs
    for _, attrs in p.starts:
        if (attrs.get("href") or "").startswith("#L"):
            target = next(n for n in doc.iter() if n.attrs.get("id") == attrs["href"][1:])
            assert "ln" in target.classes() and target.find_all("span", "no")[0].text == attrs["href"][2:]

    # the concurrency chart when the report has numbers
    charts = doc.find_all("svg", "concurrency-chart")
    assert bool(charts) == any(c["max_concurrent"] is not None for c in report["concurrency"])
    if charts:
        assert len(charts[0].find_all("circle", "marker")) == sum(
            1 for c in report["concurrency"] if c["max_concurrent"] is not None)
    # light, dark and print
    assert "prefers-color-scheme: dark" in html and "@media print" in html
    return p


def test_html_is_a_format():
    assert "html" in FORMATS


@pytest.mark.parametrize("name", CASES)
def test_html_report(name, tmp_path):
    report = _case(name, tmp_path)
    html = render(report, "html")
    p = check_page(report, html)
    text = p.root.all_text()
    assert report["source"]["path"] in text
    assert ("SGLang" if report["framework"] == "sglang" else "vLLM") in text
    assert report["source"]["phase_reached"] in text
    if report["nvidia_smi"]:
        assert "smi used" in text
    if not report["gpu"]["total_gib"]:
        assert "own rank's stated sum" in text


def test_bar_segments_match_the_numbers(tmp_path):
    """A known case to the decimal: 15.1 GiB of weights on an 80 GiB GPU is 15.1/80 of the bar."""
    report = _case("sglang-one-gpu-total", tmp_path)
    g = parse(render(report, "html")).root.find_all("g", "rank-bar")[0]
    seg = {r.attrs["data-category"]: r for r in g.find_all("rect", "seg")}
    assert float(seg["weights"].attrs["width"]) == pytest.approx(660 * 15.1 / 80, abs=1e-3)
    assert float(seg["kv_cache"].attrs["width"]) == pytest.approx(660 * 48.82 / 80, abs=1e-3)
    assert seg["weights"].own_title() == "TP0 — weights: 15.10 GiB (18.9 % of the GPU total)"


def test_input_is_escaped(tmp_path):
    log = Path(fixture("single_gpu_ready.log")).read_text().replace(
        "model_path='meta-llama/Llama-3.1-8B-Instruct'", "model_path='<script>alert(1)</script>'")
    path = write_log(tmp_path, log, "<b>odd&amp;.log")
    report = build(analyse(path))
    assert report["config"]["model"] == "<script>alert(1)</script>"
    html = render(report, "html")
    check_page(report, html)
    assert "<script>" not in html and "<b>odd" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;b&gt;odd&amp;amp;.log" in html
    p = parse(html)
    cells = [td.all_text() for td in p.root.find_all("td")]
    assert "<script>alert(1)</script>" in cells  # shown as text, exactly


def test_other_formats_unchanged_by_the_html_environment():
    """Only html templates autoescape: the text report still prints input verbatim."""
    report = build(analyse(fixture("single_gpu_ready.log")))
    report["config"]["model"] = "<m&m>"
    assert "<m&m>" in render(report, "text")


@needs_corpus
@pytest.mark.parametrize("log", sorted(CORPUS.glob("*/*.log")) if CORPUS.is_dir() else [], ids=lambda p: p.name[:40])
def test_every_corpus_log_renders(log):
    report = build(analyse(str(log)))
    check_page(report, render(report, "html"))


# ---- a real browser ------------------------------------------------------------------------

_CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_install_attempted: dict[str, str] = {}


def _find_chromium() -> Optional[str]:
    return next((shutil.which(n) for n in _CHROMIUM_NAMES if shutil.which(n)), None)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Headless Chromium, when the machine has it; skipped with the reason otherwise.

    With CAPDIAG_BROWSER_INSTALL=1 (and root and apt-get) it is installed from Debian first, at
    most once per session. Never by default: the suite makes no network access and CI stays
    within its time.
    """
    exe = _find_chromium()
    if exe:
        return exe
    if "reason" not in _install_attempted:
        _install_attempted["reason"] = _install_chromium()
    exe = _find_chromium()
    if exe:
        return exe
    pytest.skip(_install_attempted["reason"])


def _install_chromium() -> str:
    """Try the opt-in install; the reason there is still no browser."""
    if not os.environ.get("CAPDIAG_BROWSER_INSTALL"):
        return "chromium is not installed (CAPDIAG_BROWSER_INSTALL=1 installs it with apt-get)"
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("apt-get"):
        return "chromium is not installed, and installing it needs root and apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        for cmd, limit in ((["apt-get", "update", "-qq"], 300), (["apt-get", "install", "-y", "-qq", "chromium"], 900)):
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
            if done.returncode != 0:
                return f"`{' '.join(cmd)}` failed: {(done.stderr or done.stdout).strip()[-300:]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"installing chromium failed: {exc}"
    return "apt-get installed no chromium executable"


def _browser(exe: str, profile: Path, *args: str, timeout: int = 45) -> subprocess.CompletedProcess:
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
           f"--user-data-dir={profile}", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chromium did not finish within {timeout} s: {' '.join(cmd)}")


def _browser_case(tmp_path: Path) -> dict:
    if CORPUS.is_dir():
        return _case("corpus-sglang-dsv4-smi", tmp_path)
    return _case("sglang-tp2-smi", tmp_path)


def test_in_a_real_browser(chromium, tmp_path):
    report = _browser_case(tmp_path)
    page = tmp_path / "report.html"
    page.write_text(render(report, "html"), encoding="utf-8")
    cited = next(e["line"] for f in report["findings"] for e in f["evidence"] if e["source"] == "log" and e["line"] > 0)

    # the DOM as the browser built it, loaded at a finding's evidence link, with console output
    done = _browser(chromium, tmp_path / "profile-dom", "--enable-logging=stderr", "--v=0", "--dump-dom",
                    f"{page.as_uri()}#L{cited}")
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, "\n".join(console)
    dom = parse(done.stdout).root
    assert dom.find_all("main") and dom.find_all("h1")
    groups = dom.find_all("g", "rank-bar")
    assert [g.attrs["data-rank"] for g in groups] == [rk["label"] for rk in report["ranks"]]
    landed = [n for n in dom.iter() if n.attrs.get("id") == f"L{cited}"]
    assert len(landed) == 1 and landed[0].find_all("span", "no")[0].text == str(cited)
    assert not dom.find_all("script")
    # nvidia-smi's `other` is drawn within the row it belongs to, not beside it as one more share
    nested = dom.find_all("tr", "nested")
    assert [tr.attrs["data-parent"] for tr in nested] == [r["parent"] for r in report["breakdown"] if r["parent"]]
    assert nested and nested[0].find_all("span", "nest")

    # a screenshot, kept for people to look at
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    if shot.exists():
        shot.unlink()
    done = _browser(chromium, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1280,2000",
                    "--hide-scrollbars", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 2000)


# The test's own copy of a page measures where its parts land (the report itself runs no script
# and forbids them: its Content-Security-Policy is taken out of the copy only).
_MEASURE = ("<script>addEventListener('load', () => { const out = {}; for (const [k, sel] of [['answer', '.answer'], "
            "['summary', '#summary'], ['bars', 'svg.rank-bars']]) { const e = document.querySelector(sel); if (e) { "
            "const r = e.getBoundingClientRect(); out[k] = [Math.round(r.top), Math.round(r.bottom)]; } } "
            "document.body.setAttribute('data-rects', JSON.stringify(out)); });</script>")


@pytest.mark.parametrize("log, kw", [(str(EXAMPLE), {"gpu": "h100_sxm"}), (fixture("oom_capture.log"), {}),
                                     (fixture("weights_then_crash_tp2.log"), {}), (fixture("mla_tp2.log"), {}),
                                     (fixture("vllm_v092_tp2.log"), {"gpu": "h100_sxm"})],
                         ids=["healthy", "oom", "crash", "tp2", "vllm"])
def test_the_first_screen_holds_the_answer_and_the_memory_picture(chromium, tmp_path, log, kw):
    """At 1280×800 — a laptop's browser — the finding that matters (or the failure), its remedy,
    and every rank's bar (up to four ranks) are on screen before any scrolling."""
    import json
    report = build(analyse(log, **kw))
    page = tmp_path / "report.html"
    page.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", render(report, "html"))
                    .replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    done = _browser(chromium, tmp_path / "profile", "--window-size=1280,800", "--virtual-time-budget=3000",
                    "--dump-dom", page.as_uri())
    found = re.search(r'data-rects="([^"]*)"', done.stdout)
    assert found, done.stderr[-2000:]
    rects = json.loads(found.group(1).replace("&quot;", '"'))
    summary = report["summary"]
    if summary["answer"] or summary["outcome"] != "ready":
        assert rects["summary"][1] <= 800, rects
    assert rects["bars"][0] < 800 and (len(report["ranks"]) > 4 or rects["bars"][1] <= 800), rects
