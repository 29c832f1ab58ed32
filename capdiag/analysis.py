"""The pipeline: source → facts → launches → engine. The CLI calls this and renders the result."""
from __future__ import annotations

from typing import Any, Optional

import attrs

from capdiag import facts as F
from capdiag.engine import Firing, Knowledge, run
from capdiag.errors import InputError
from capdiag.failures import root_cause
from capdiag.frozen import frozen
from capdiag.launches import Launch, LaunchSplitter, Outline, ends_startup
from capdiag.parsing import FRAMEWORKS, FrameworkVotes, framework_of, read_facts, worker_ranks
from capdiag.gpus import gpu_input_facts
from capdiag.parsing.model_config import read_model_config
from capdiag.parsing.nvidia_smi import read_nvidia_smi
from capdiag.rules import rules_for
from capdiag.rules.what_if import counterfactual, remedies
from capdiag import scanner
from capdiag.source import (LiveStream, LogInput, candidate_runs, log_name, open_log, physical_runs, reads_ahead,
                            scanned_runs)
from capdiag.traffic import TrafficAggregator
from capdiag.vocabulary import DEFAULT_TOKEN_LENGTHS


@frozen
class Analysis:
    path: str
    framework: str
    launches: tuple[Outline, ...]  # every launch of the log, outlined
    launch: Launch  # the one analysed, whole
    knowledge: Knowledge
    firings: tuple[Firing, ...]
    lines_read: int
    # each finding's proven changes, by rule (rules/what_if/remedies.py); kept beside the
    # knowledge, whose conclusions are exactly the rules' firings
    remedies: Any = None
    # a probe's endpoints, each (path, HTTP status) as asked; empty for a log
    endpoints: tuple = ()


@frozen
class Reading:
    """A log read: its framework, its line count, every launch outlined and the launches kept
    whole (the one to analyse, or all of them)."""

    framework: str
    lines: int
    outlines: tuple[Outline, ...]
    launches: tuple[Launch, ...]


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
        first, block = self.last[:2]
        return first - 1 + block.count(b"\n") + (bool(block) and not block.endswith(b"\n"))


def read_launches(log: LogInput, framework: Optional[str] = None, until_ready: Optional[bool] = None,
                  runtime: bool = True, *, wanted: Optional[int] = None, keep_all: bool = False) -> Reading:
    """A log's launches, read in one pass in memory that does not grow with the number of
    launches: only the launch to analyse (`wanted`, else the last of those that got furthest)
    is kept whole, or every one with `keep_all`.

    Without `framework`, both grammars read every candidate line, the launches are split for
    each framework's view of the log (its own line kinds and the kinds both print), and the
    framework whose own line kinds the log holds most of is chosen. `until_ready` (default:
    when the log is a pipe) stops reading once a start-up has reached ready or failed and the
    stream pauses, instead of waiting for the writer to close it. With `runtime`, the
    request-time traffic lines are summed on the way (capdiag.traffic) and join their launch.
    """
    if framework is not None and framework not in FRAMEWORKS:
        raise InputError(f"--framework {framework}: one of {', '.join(FRAMEWORKS)}")
    stream, path, owned = open_log(log)
    if until_ready or (until_ready is None and LiveStream.wanted(stream)):
        stream = LiveStream(stream)
    views = {name: LaunchSplitter(wanted, keep_all) for name in ((framework,) if framework else FRAMEWORKS)}
    votes = FrameworkVotes()
    try:
        traffic = TrafficAggregator() if runtime else None
        # (the Python path's traffic patterns hold the GIL most of the pass: workers waiting for
        # it to hand back a block slowed the pass by a tenth; the compiled scanner lets go of it)
        ahead = reads_ahead(stream) and (traffic is None or scanner.built())
        counter = _Counter(scanned_runs(stream) if ahead else physical_runs(stream))
        closed = 0
        for fact in read_facts(candidate_runs(counter, traffic), framework):
            votes.add(fact)
            own = framework_of(fact)
            for name, view in views.items():
                if own is None or own == name:
                    view.add(fact)
            # a launch ended: its traffic is kept only while the launch is (the sums are of the
            # framework whose traffic lines the log holds, and only its view can use them)
            summing = views.get(traffic.framework) if traffic is not None else None
            if summing is not None and len(summing.outlines) != closed:
                closed = len(summing.outlines)
                traffic.forget_before(summing.kept_from)
            if isinstance(stream, LiveStream) and ends_startup(fact):
                stream.finish()
    finally:
        if owned:
            stream.close()
    if counter.count == 0:
        raise InputError(f"{path}: the log is empty")
    # no start-up line but request traffic: the framework whose traffic lines these are
    chosen = framework or votes.winner() or (traffic.framework if traffic is not None else None)
    failure = None
    if chosen is None:
        _, seen = views[FRAMEWORKS[0]].finish()
        failure = root_cause(seen[0].facts) if seen else None
        # a failure in a framework's own wording (SGLang's `Capture cuda graph failed: …`) says whose log it is
        said_by = failure.cause.wording.get("who") if failure is not None and failure.cause is not None else None
        chosen = said_by if said_by in FRAMEWORKS else None
    if chosen is None:
        said = (f"; it ends in a failure at line {failure.line.evidence.line} ({failure.raised.text.splitlines()[0][:120]}): "
                "pass --framework sglang or vllm to analyse it") if failure is not None else ""
        raise InputError(f"{path}: neither an SGLang nor a vLLM start-up log "
                         f"(no start-up line of either recognised in {counter.count} lines){said}")
    summed = [f for f in traffic.facts() if f.framework == chosen] if traffic is not None else []
    outlines, kept = views[chosen].finish(summed)
    if not outlines and summed:
        # request traffic and no start-up line (an excerpt pasted from a running server's log):
        # one launch of the traffic alone, its start-up unknown
        alone = LaunchSplitter(None, log=False)
        for fact in summed:
            alone.add(fact)
        outlines, kept = alone.finish()
    # a worker is placed at its rank by its own line, which may come after its other lines
    kept = [attrs.evolve(l, facts=tuple(worker_ranks(list(l.facts)))) for l in kept]
    if not outlines:
        raise InputError(f"{path}: no {framework} start-up line recognised in {counter.count} lines (--framework {framework})")
    return Reading(chosen, counter.count, tuple(outlines), tuple(kept))


def read_log(log: LogInput, framework: Optional[str] = None, until_ready: Optional[bool] = None,
             runtime: bool = True) -> tuple[list[F.Fact], str, int]:
    """Every fact in a log, in line order; the framework that printed it; lines read."""
    reading = read_launches(log, framework, until_ready, runtime, keep_all=True)
    return [f for launch in reading.launches for f in launch.facts], reading.framework, reading.lines


def analyse(path: LogInput, *, launch: Optional[int] = None, target_rank: Optional[str] = None,
            token_lengths: tuple[int, ...] = DEFAULT_TOKEN_LENGTHS, gpu: Optional[str] = None,
            gpu_total_gib: Optional[float] = None, framework: Optional[str] = None,
            nvidia_smi: Optional[str] = None, config_json: Optional[str] = None,
            policy: Optional[F.Policy] = None, what_if: Optional[F.WhatIf] = None,
            until_ready: Optional[bool] = None, runtime: bool = True) -> Analysis:
    """The analysis of one log (any form open_log() takes) with the user's side inputs."""
    reading = read_launches(path, framework, until_ready, runtime, wanted=launch)
    return _analyse_reading(log_name(path), reading, launch=launch, target_rank=target_rank,
                            token_lengths=token_lengths, gpu=gpu, gpu_total_gib=gpu_total_gib, nvidia_smi=nvidia_smi,
                            config_json=config_json, policy=policy, what_if=what_if)


def analyse_facts(name: str, facts: list[F.Fact], framework: str, lines: int, *, launch: Optional[int] = None,
                  **inputs) -> Analysis:
    """The engine over facts already read (from a running server's endpoints)."""
    splitter = LaunchSplitter(launch, log=False)
    for fact in facts:
        splitter.add(fact)
    outlines, kept = splitter.finish()
    return _analyse_reading(name, Reading(framework, lines, tuple(outlines), tuple(kept)), launch=launch, **inputs)


def _analyse_reading(name: str, reading: Reading, *, launch: Optional[int] = None, target_rank: Optional[str] = None,
                     token_lengths: tuple[int, ...] = DEFAULT_TOKEN_LENGTHS, gpu: Optional[str] = None,
                     gpu_total_gib: Optional[float] = None, nvidia_smi: Optional[str] = None,
                     config_json: Optional[str] = None, policy: Optional[F.Policy] = None,
                     what_if: Optional[F.WhatIf] = None) -> Analysis:
    framework = reading.framework
    if launch is not None and not 1 <= launch <= len(reading.outlines):
        raise InputError(f"--launch {launch}: the log holds {len(reading.outlines)} launch(es)")
    chosen = reading.launches[-1]
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
    capabilities = [(f.text, f"line {f.evidence.line}") for f in chosen.facts if isinstance(f, F.ComputeCapability)]
    inputs.extend(gpu_input_facts(gpu, gpu_total_gib, names, capabilities))
    inputs.extend(x for x in (policy, what_if) if x is not None)
    kb = Knowledge(chosen.facts + tuple(inputs))
    rules = rules_for(framework)
    firings = run(rules, kb)
    if what_if is not None:
        counterfactual.compare(kb, rules)
    proven = remedies.propose(kb, rules) if what_if is None else {}  # advice is proven on the start-up itself
    if target_rank is not None and not kb.get("target_rank").known:
        raise InputError(f"--target-rank {target_rank}: {kb.get('target_rank').value.reason}")
    return Analysis(name, framework, reading.outlines, chosen, kb, tuple(firings), reading.lines, proven)


def _options_text(target_rank, token_lengths) -> str:
    """The options as their evidence line shows them: what was given, and the request lengths
    (the concurrency table's input) marked when they are the default."""
    lengths = f"--token-lengths {','.join(str(n) for n in token_lengths)}" + (
        " (the default)" if tuple(token_lengths) == DEFAULT_TOKEN_LENGTHS else "")
    return (f"--target-rank {target_rank} " if target_rank is not None else "") + lengths