"""Numeric extremes in every numeric field of every line kind, nesting depth, and each side
input's types (issue 14). Every mutant gives a report or an InputError — never another
exception — and no report holds a non-finite number. Deterministic and bounded: one line
per line kind from the fixtures, each of its numbers replaced in turn by each extreme."""
from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import pytest

from capdiag.analysis import analyse
from capdiag.errors import InputError
from capdiag.parsing import read_facts
from capdiag.rules import PLAN
from capdiag.rules.plan.driver import plan
from capdiag import facts as F
from capdiag.render import render
from capdiag.report import build
from capdiag.source import candidate_lines
from helpers import FIXTURES, run_entry

EXTREMES = ("0", "0.00", "-1", "1e308", "1e400", "inf", "nan", "1" + "0" * 20, "9" * 5000)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
EXAMPLE = Path(__file__).resolve().parents[1] / "capdiag" / "examples" / "sglang-llama31-8b-h100.log"
SOURCES = [EXAMPLE] + sorted(FIXTURES.glob("*.log"))
COUNTS: dict[str, int] = {}


def _kinds() -> dict[str, tuple[Path, int, str]]:
    """One (log, line number, line) per fact kind the fixtures hold, the first seen."""
    seen: dict[str, tuple[Path, int, str]] = {}
    for path in SOURCES:
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        for fact in read_facts(candidate_lines(enumerate(lines, 1))):
            line = fact.evidence.line
            if fact.kind not in seen and "\n" not in fact.evidence.text and line <= len(lines):
                seen[fact.kind] = (path, line, lines[line - 1])
    return seen


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _check(path: Path, problems: list, what: str, **options) -> None:
    try:
        report = build(analyse(str(path), **options))
        render(report, "text")
    except InputError:
        return
    except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
        problems.append(f"{what}: {type(exc).__name__}: {exc}"[:300])
        return
    if not _finite(report):
        problems.append(f"{what}: a non-finite number in the report")


def test_every_number_of_every_line_kind_at_every_extreme(tmp_path):
    kinds = _kinds()
    assert len(kinds) >= 40  # the fixtures cover the line kinds of both frameworks
    problems: list[str] = []
    start, cases = time.monotonic(), 0
    for kind, (path, number, line) in sorted(kinds.items()):
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        body_start = line.find("] ") + 2 if line.startswith("[") else 0
        spots = [m for m in _NUMBER.finditer(line) if m.start() >= body_start][:6]
        for spot in spots:
            for extreme in EXTREMES:
                mutated = lines[:number - 1] + [line[:spot.start()] + extreme + line[spot.end():]] + lines[number:]
                target = tmp_path / "mutant.log"
                target.write_text("\n".join(mutated), encoding="utf-8")
                _check(target, problems, f"{kind} ({path.name}:{number}) number {spot.group()} -> {extreme[:12]}")
                cases += 1
    COUNTS["numeric extremes"] = cases
    assert not problems, problems[:10]
    assert cases >= 500 and time.monotonic() - start < 120


TRAFFIC_CASES = Path(__file__).resolve().parent / "traffic_cases"
# the request-time lines are summed from raw blocks (capdiag.traffic), not read as line kinds
TRAFFIC_NEEDLES = ("Decode batch", "Prefill batch", "Retract requests", "out of memory happened",
                   "Avg prompt throughput", "total_num_cumulative_preemption")


def test_every_number_of_every_traffic_line_at_every_extreme(tmp_path):
    seen: dict[str, str] = {}
    for path in sorted(TRAFFIC_CASES.glob("*.log")):
        for line in path.read_text(encoding="utf-8").split("\n"):
            needle = next((n for n in TRAFFIC_NEEDLES if n in line), None)
            shape = needle and (needle, re.sub(r"\d", "0", _NUMBER.sub("N", line)))
            if shape and shape not in seen:
                seen[shape] = line
    assert {needle for needle, _ in seen} == set(TRAFFIC_NEEDLES)
    problems: list[str] = []
    cases = 0
    for (needle, _), line in sorted(seen.items()):
        body_start = line.find("] ") + 2 if line.startswith("[") else 0
        for spot in [m for m in _NUMBER.finditer(line) if m.start() >= body_start][:8]:
            for extreme in EXTREMES + ("0.4.5",):
                target = tmp_path / "traffic.log"
                target.write_text(line[:spot.start()] + extreme + line[spot.end():] + "\n" + line + "\n", encoding="utf-8")
                _check(target, problems, f"{needle}: {line[:60]}… number {spot.group()} -> {extreme[:12]}")
                cases += 1
    COUNTS["traffic-line extremes"] = cases
    assert not problems, problems[:10]
    assert cases >= 300


@pytest.mark.parametrize("depth", [1, 50, 100, 101, 1000, 100_000])
def test_nesting_depth_in_records(depth, tmp_path):
    text = EXAMPLE.read_text().replace("tokenizer_mode='auto'", "tokenizer_mode=" + "[" * depth + "]" * depth)
    target = tmp_path / "deep.log"
    target.write_text(text)
    problems: list[str] = []
    _check(target, problems, f"depth {depth}")
    assert not problems


@pytest.mark.parametrize("depth", [50, 99, 100, 900, 100_000])
@pytest.mark.parametrize("flag", ["--config-json", "--baseline"])
def test_nesting_depth_in_json_side_inputs(depth, flag, tmp_path, monkeypatch, capsys):
    # json.loads takes ~900 levels; a walk of what it returned must not recurse through them
    side = tmp_path / "deep.json"
    side.write_text('{"text_config": ' * depth + "{}" + "}" * depth)
    command = ["gate", str(EXAMPLE)] if flag == "--baseline" else ["explain", str(EXAMPLE)]
    code, out, err = run_entry(monkeypatch, capsys, *command, flag, str(side))
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    if depth > 100:
        assert "nests deeper than 100 levels" in err or "not valid JSON" in err


CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
          "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16",
          "head_dim": 128, "kv_lora_rank": None, "num_local_experts": None, "quantization_config": None,
          "layer_types": None, "full_attention_interval": None, "tie_word_embeddings": False}
VALUES = (0, -1, 1e308, 10 ** 20, int("9" * 300), "8", "", None, [], {}, True, [1, "x"], {"a": [1]}, 0.5)


# a Llama's dense shape, and DeepSeek-V3's MLA and MoE fields (a value set to null is written as null)
BASES = {"llama": ({k: v for k, v in CONFIG.items() if v is not None}, tuple(CONFIG)),
         "deepseek_v3": (json.loads((Path(__file__).resolve().parent / "inputs" / "config_deepseek_v3.json").read_text()),
                         ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                          "n_routed_experts", "n_shared_experts", "first_k_dense_replace", "moe_intermediate_size",
                          "num_experts_per_tok", "quantization_config"))}


def test_every_config_field_of_every_type(tmp_path):
    problems: list[str] = []
    cases = 0
    path = tmp_path / "config.json"
    for base, keys in BASES.values():
        for key in keys:
            for value in VALUES:
                path.write_text(json.dumps({**base, key: value}))
                _check(EXAMPLE, problems, f"config {key}={value!r:.20}", config_json=str(path))
                request = F.PlanRequest(evidence=F.Evidence(0, "plan", 0, "input"), params=None, weight_dtype="bf16",
                                        kv_dtype="bf16", workloads=((8192, 16),), contexts=(8192,), gpus=8, tp=None,
                                        framework="sglang", fraction=None, headroom=0.15, training=None)
                try:
                    plan(PLAN, request, config_json=str(path), gpu="h100_sxm", gpu_total_gib=None)
                except InputError:
                    pass
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"plan config {key}={value!r:.20}: {type(exc).__name__}: {exc}"[:300])
                cases += 2
    COUNTS["config.json types"] = cases
    assert not problems, problems[:10]


SMI_CELLS = ("0", "-1", "1e308", "nan", "²³", "٣", "9" * 5000, "", "[N/A]", "lots")


def test_every_nvidia_smi_cell_of_every_kind(tmp_path):
    problems: list[str] = []
    path = tmp_path / "smi.csv"
    cases = 0
    for column in range(3):
        for cell in SMI_CELLS:
            cells = ["0", "1000 MiB", "80000 MiB"]
            cells[column] = cell + ("" if column == 0 else " MiB")
            path.write_text("index, memory.used [MiB], memory.free [MiB]\n" + ", ".join(cells) + "\n",
                            encoding="utf-8")
            _check(EXAMPLE, problems, f"nvidia-smi column {column} = {cell[:12]!r}", nvidia_smi=str(path))
            cases += 1
    COUNTS["nvidia-smi cells"] = cases
    assert not problems, problems[:10]


@pytest.mark.parametrize("total", [1e-300, 0.5, 1e6, 2 ** 20])
def test_gpu_totals_at_the_edges(total):
    problems: list[str] = []
    _check(EXAMPLE, problems, f"--gpu-total-gib {total}", gpu_total_gib=total)
    assert not problems
