"""Every example in references/log-patterns.md is still read as the document says.

The catalogue promises (its "Verified" convention) that each example, written to a file after one
anchor line of its framework and read with `capdiag facts --format json`, gives what its `→` line
shows: the fact kinds, the values shown, the rank tags (none when none are shown), and for
`→ no fact` (or no `→` line, as in section 4) nothing at all. A grammar or transformer change that
breaks a promise fails the case named after the example's line, so code and document move
together. Examples are read in process through the functions the `facts` command calls; spawning
the CLI once per example took minutes.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import NamedTuple, Optional

import pytest
from lark.exceptions import LarkError

from capdiag.analysis import read_log
from capdiag.cli import _values
from capdiag.parsing import sglang, vllm
from capdiag.source import candidate_lines
from helpers import dump, rank_tags, same, write_log

DOC = Path(__file__).resolve().parents[1] / "references" / "log-patterns.md"

# A lone line of a shared kind cannot win the framework vote, so each example follows a line only
# its framework prints, as the document's own check did. The anchor's facts (line 1) are not the
# example's.
ANCHOR = {"sglang": "[2026-08-20 10:00:12 TP0] Load weight begin. avail mem=139.10 GB",
          # a second earlier than the document's own example of the line, which would repeat it word for word
          "vllm": "INFO 10-17 09:12:20 model_runner.py:1071] Loading model weights took 12.5523 GB"}

# Sections 1 (transport noise) and 4 (lines not read) hold lines of either framework.
SECTION_FRAMEWORKS = {"2": ("sglang",), "3": ("vllm",)}
BOTH = ("sglang", "vllm")

# `parse_*_line` answer "no fact" both for a line the grammar rejects and for one it accepts but
# turns into nothing; only the parser itself tells the two apart.
GRAMMARS = {"sglang": sglang._parser, "vllm": vllm._parser}

NO_FACT = (None, "no fact", "recognised; no fact")
CITED = re.compile(r" \(one fact, cited at physical line (\d+) of the excerpt\)$")
FACT = re.compile(r"`(\w+)`\s*(.*)")
VALUE = re.compile(r"`([\w.]+)`=(.*?)(?=, `[\w.]+`=|$)")
ABSENT = "<absent>"


class Example(NamedTuple):
    line: int
    section: str
    label: str
    text: str
    arrow: Optional[str]


def examples(path: Path) -> list[Example]:
    """Each `- **label**` bullet followed by a fenced block, with the `→` line before the next one."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found, section = [], ""
    for i, line in enumerate(lines):
        heading = re.match(r"## (\d+)\.", line)
        if heading:
            section = heading.group(1)
        if not (line.startswith("- **") and i + 2 < len(lines) and lines[i + 2].strip() == "```"):
            continue
        end = next(j for j in range(i + 3, len(lines)) if lines[j].strip() == "```")
        code = [row[2:] if row.startswith("  ") else row for row in lines[i + 3:end]]
        arrow = None
        for row in lines[end + 1:]:
            if row.startswith(("- **", "#")):
                break
            if row.strip().startswith("→"):
                arrow = row.strip()[1:].strip()
                break
        label = line[len("- **"):].split("**")[0]
        found.append(Example(i + 1, section, label, "\n".join(code), arrow))
    return found


def case_id(example: Example) -> str:
    return f"L{example.line}-" + re.sub(r"\W+", "-", example.label)[:40].strip("-")


EXAMPLES = examples(DOC)


def read_as_cli(framework: str, text: str, tmp_path: Path) -> list[dict]:
    """The example's facts as `capdiag facts --format json` prints them (the JSON round trip keeps
    the value types the document was checked against)."""
    path = write_log(tmp_path, ANCHOR[framework] + "\n" + text + "\n", f"{framework}.log")
    found, _, _ = read_log(path, runtime=False)  # the grammars' catalogue; traffic lines are summed (section 5)
    rows = [{"kind": f.kind, "line": f.evidence.line, "rank": rank_tags(f.rank), "values": _values(f)}
            for f in found if f.evidence.line > 1]
    return json.loads(json.dumps(rows, default=str))


def recognised(framework: str, text: str) -> bool:
    lines = list(candidate_lines(enumerate(text.split("\n"), 1)))
    if not lines:
        return False
    try:
        GRAMMARS[framework]().parse(lines[0].text)
    except LarkError:
        return False
    return True


def expected_rank(text: str) -> dict:
    if text.startswith(("untagged", "none")):
        return {}
    text, _, worker = text.partition("worker=")  # a process label, last: it may hold blanks and commas
    tags = {key: int(n) for key, n in (part.split("=", 1) for part in text.replace(",", " ").split())}
    return {**tags, "worker": worker} if worker else tags


def expected_fact(segment: str) -> tuple[str, dict]:
    match = FACT.fullmatch(segment.strip())
    assert match, f"the document's `→` segment {segment!r} does not name a fact kind"
    kind, rest = match.groups()
    shown = VALUE.findall(rest)
    # Guards the reading of the document itself: every value written must have been picked up.
    assert ", ".join(f"`{k}`={v}" for k, v in shown) == rest, f"unreadable values in {segment!r}"
    return kind, {key: json.loads(value) for key, value in shown}


def lookup(values: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(values, dict) or part not in values:
            return ABSENT
        values = values[part]
    return values


def mismatch(arrow: str, facts: list[dict]) -> Optional[str]:
    """Why `facts` differ from the `→` line, or None when they are what it says."""
    if arrow.startswith("rank "):
        want = expected_rank(arrow[len("rank "):])
        if not facts or any(f["rank"] != want for f in facts):
            return f"want rank {want}"
        return None
    cited = CITED.search(arrow)
    arrow = CITED.sub("", arrow)
    arrow, _, rank = arrow.partition(" · rank ")
    want_rank = expected_rank(rank) if rank else {}
    wanted = [expected_fact(("" if i == 0 else "`") + s) for i, s in enumerate(arrow.split(" + `"))]
    if [f["kind"] for f in facts] != [kind for kind, _ in wanted]:
        return "other fact kinds"
    bad = [f"{f['kind']}.{key}={dump(lookup(f['values'], key))} (doc {dump(value)})"
           for f, (_, values) in zip(facts, wanted) for key, value in values.items()
           if not same(lookup(f["values"], key), value)]
    bad += [f"{f['kind']} rank {f['rank']} (doc {want_rank})" for f in facts if f["rank"] != want_rank]
    if cited and facts[0]["line"] != int(cited.group(1)) + 1:
        bad.append(f"cited at line {facts[0]['line'] - 1} of the excerpt (doc {cited.group(1)})")
    return "; ".join(bad) or None


def unescape(text: str) -> str:
    """Section 1 spells ESC and carriage returns as `\\x1b` and `\\r`."""
    return text.replace("\\x1b", "\x1b").replace("\\r", "\r")


@pytest.mark.parametrize("example", EXAMPLES, ids=case_id)
def test_example_reads_as_documented(example: Example, tmp_path: Path):
    text = unescape(example.text) if example.section == "1" else example.text
    frameworks = SECTION_FRAMEWORKS.get(example.section, BOTH)
    read = {fw: read_as_cli(fw, text, tmp_path) for fw in frameworks}
    got = "; ".join(f"{fw}: {dump([(f['kind'], f['rank'], f['values']) for f in facts])}"
                    for fw, facts in read.items())
    where = f"doc line {example.line}: `→ {example.arrow}`\n  read {got}"
    if example.arrow in NO_FACT:
        assert not any(read.values()), where
        if example.arrow == "recognised; no fact":
            assert any(recognised(fw, text) for fw in frameworks), f"{where}\n  no grammar accepts the line"
    else:
        why = {fw: mismatch(example.arrow, facts) for fw, facts in read.items()}
        assert None in why.values(), f"{where}\n  {why}"


def test_document_has_its_examples():
    """A slip in reading the document that found few examples would pass vacuously."""
    assert len(examples(DOC)) >= 200
