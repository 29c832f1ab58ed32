"""The pipeline: source → facts → launches → engine. The CLI calls this and renders the result."""
from __future__ import annotations

from typing import Optional

import attrs

from capdiag import facts as F
from capdiag.engine import Firing, Knowledge, run
from capdiag.errors import InputError
from capdiag.failures import root_cause
from capdiag.launches import Launch, ends_startup, pick_launch, split_launches
from capdiag.parsing import FRAMEWORKS, detect_framework, framework_of, read_facts
from capdiag.gpus import gpu_input_facts
from capdiag.parsing.model_config import read_model_config
from capdiag.parsing.nvidia_smi import read_nvidia_smi
from capdiag.rules import rules_for
from capdiag.rules.what_if import counterfactual
from capdiag.source import LiveStream, LogInput, candidate_runs, log_name, open_log, physical_runs
from capdiag.traffic import TrafficAggregator
from capdiag.vocabulary import DEFAULT_TOKEN_LENGTHS


@attrs.frozen
class Analysis:
    path: str
    framework: str
    launches: tuple[Launch, ...]
    launch: Launch
    knowledge: Knowledge
    firings: tuple[Firing, ...]
    lines_read: int


class _Counter:
    """Counts physical lines as their runs stream past, so the file is read once: the lines
    before the last run are known from its first number, so only that run is counted."""

    def __init__(self, runs):
        self.runs, self.last = runs, (1, b"")

    def __iter__(self):
        for run in self.runs:
            self.last = run
            yield run

    @property
    def count(self) -> int:
        first, block = self.last
        return first - 1 + block.count(b"\n") + (bool(block) and not block.endswith(b"\n"))


def read_log(log: LogInput, framework: Optional[str] = None, until_ready: Optional[bool] = None,
             runtime: bool = True) -> tuple[list[F.Fact], str, int]:
    """Every fact in a log, in line order; the framework that printed it; lines read.

    Without `framework`, both grammars read every candidate line and the framework whose own
    line kinds the log holds most of is chosen; the other's facts are then dropped.
    `until_ready` (default: when the log is a pipe) stops reading once a start-up has reached
    ready or failed and the stream pauses, instead of waiting for the writer to close it. With
    `runtime`, the request-time traffic lines are summed on the way (capdiag.traffic).
    """
    if framework is not None and framework not in FRAMEWORKS:
        raise InputError(f"--framework {framework}: one of {', '.join(FRAMEWORKS)}")
    stream, path, owned = open_log(log)
    if until_ready or (until_ready is None and LiveStream.wanted(stream)):
        stream = LiveStream(stream)
    try:
        counter = _Counter(physical_runs(stream))
        traffic = TrafficAggregator() if runtime else None
        facts = []
        for fact in read_facts(candidate_runs(counter, traffic), framework):
            facts.append(fact)
            if isinstance(stream, LiveStream) and ends_startup(fact):
                stream.finish()
    finally:
        if owned:
            stream.close()
    if counter.count == 0:
        raise InputError(f"{path}: the log is empty")
    chosen = framework or detect_framework(facts)
    if chosen is None:
        failure = root_cause(facts)
        seen = (f"; it ends in a failure at line {failure.line.evidence.line} ({failure.raised.text.splitlines()[0][:120]}): "
                "pass --framework sglang or vllm to analyse it") if failure is not None else ""
        raise InputError(f"{path}: neither an SGLang nor a vLLM start-up log "
                         f"(no start-up line of either recognised in {counter.count} lines){seen}")
    facts = [f for f in facts if framework_of(f) in (None, chosen)]
    if not facts:
        raise InputError(f"{path}: no {framework} start-up line recognised in {counter.count} lines (--framework {framework})")
    if traffic is not None:
        summed = [f for f in traffic.facts() if f.framework == chosen]
        facts = sorted(facts + summed, key=lambda f: f.evidence.line)
    return facts, chosen, counter.count


def analyse(path: LogInput, *, launch: Optional[int] = None, target_rank: Optional[str] = None,
            token_lengths: tuple[int, ...] = DEFAULT_TOKEN_LENGTHS, gpu: Optional[str] = None,
            gpu_total_gib: Optional[float] = None, framework: Optional[str] = None,
            nvidia_smi: Optional[str] = None, config_json: Optional[str] = None,
            policy: Optional[F.Policy] = None, what_if: Optional[F.WhatIf] = None,
            until_ready: Optional[bool] = None, runtime: bool = True) -> Analysis:
    """The analysis of one log (any form open_log() takes) with the user's side inputs."""
    facts, framework, lines = read_log(path, framework, until_ready, runtime)
    return analyse_facts(log_name(path), facts, framework, lines, launch=launch, target_rank=target_rank,
                         token_lengths=token_lengths, gpu=gpu, gpu_total_gib=gpu_total_gib, nvidia_smi=nvidia_smi,
                         config_json=config_json, policy=policy, what_if=what_if)


def analyse_facts(name: str, facts: list[F.Fact], framework: str, lines: int, *, launch: Optional[int] = None,
                  target_rank: Optional[str] = None, token_lengths: tuple[int, ...] = DEFAULT_TOKEN_LENGTHS,
                  gpu: Optional[str] = None, gpu_total_gib: Optional[float] = None, nvidia_smi: Optional[str] = None,
                  config_json: Optional[str] = None, policy: Optional[F.Policy] = None,
                  what_if: Optional[F.WhatIf] = None) -> Analysis:
    """The engine over facts already read (from a log, or from a running server's endpoints)."""
    launches = split_launches(facts)
    if launch is not None and not 1 <= launch <= len(launches):
        raise InputError(f"--launch {launch}: the log holds {len(launches)} launch(es)")
    chosen = pick_launch(launches, launch)
    inputs: list[F.Fact] = [F.Options(evidence=F.Evidence(F.INPUT_LINE, _options_text(target_rank, token_lengths), 0,
                                                          "input"),
                                      target_rank=None if target_rank is None else str(target_rank),
                                      token_lengths=tuple(token_lengths), framework=framework)]
    if nvidia_smi is not None:
        inputs.extend(read_nvidia_smi(nvidia_smi))
    if config_json is not None:
        inputs.append(read_model_config(config_json))
    names = [(f.name, "nvidia-smi name") for f in inputs if isinstance(f, F.SmiGpu) and f.name]
    names += [(f.name.replace("_", " "), "MoE kernel-config device_name") for f in chosen.facts
              if isinstance(f, F.DeviceName)]
    inputs.extend(gpu_input_facts(gpu, gpu_total_gib, names))
    inputs.extend(x for x in (policy, what_if) if x is not None)
    kb = Knowledge(chosen.facts + tuple(inputs))
    rules = rules_for(framework)
    firings = run(rules, kb)
    if what_if is not None:
        counterfactual.compare(kb, rules)
    if target_rank is not None and not kb.get("target_rank").known:
        raise InputError(f"--target-rank {target_rank}: {kb.get('target_rank').value.reason}")
    return Analysis(name, framework, tuple(launches), chosen, kb, tuple(firings), lines)


def _options_text(target_rank, token_lengths) -> str:
    return (f"--target-rank {target_rank if target_rank is not None else 'tp0'} "
            f"--token-lengths {','.join(str(n) for n in token_lengths)}")
