"""When the target rank printed none of a kind of memory line, which rank's line stands in."""
from __future__ import annotations

from typing import Any

import attrs

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import line_ref, target

# Per-rank memory lines of vLLM: worker-only excerpts and Ray clusters print them from worker
# processes whose rank the line does not give, or from every rank but the target.
# Each kind with the words that name its line.
STAND_IN_KINDS = {F.VllmModelLoading: "`Model loading took`", F.VllmMemoryProfile: "memory-profiling",
                  F.VllmAvailableKV: "`Available KV cache memory`", F.VllmGraphCapture: "`Graph capturing finished`",
                  F.VllmGraphPool: "`CUDA graph pool memory`", F.VllmGraphEstimate: "`Estimated CUDA graph memory`",
                  F.VllmStartupMemory: "`Free memory on device`", F.VllmInitialFree: "`Initial free memory`",
                  F.VllmGpuBlocks: "`# GPU blocks`", F.VllmCpuKVSpace: "CPU `… GiB for KV cache on node`"}
# what a line says about the process rather than its memory: not compared across ranks
_NOT_FIGURES = {"evidence", "rank", "role", "role_stated", "seconds", "unit", "wording", "form"}


def _figures(facts: list[F.Fact]) -> dict[str, Any]:
    """The figures a rank's lines of one kind state, the first statement of each."""
    out: dict[str, Any] = {}
    for fact in facts:
        values = fact.values if isinstance(fact, F.VllmMemoryProfile) else attrs.asdict(fact, recurse=False)
        for key, value in values.items():
            if key not in _NOT_FIGURES and value is not None:
                out.setdefault(key, value)
    return out


def label_of(kb, key: tuple) -> str:
    """How the log names the rank with this key: its tags, its process label, or TP0."""
    rank = next((f.rank for f in kb.facts if f.evidence.source == "log" and f.rank.key() == key), F.NO_RANK)
    if not rank.tagged:
        return "TP0"
    return rank.worker if rank.worker and rank.tp is None and rank.dp is None and rank.pp is None else rank.label


@rule("stand-in", reads=("target_rank",) + tuple(STAND_IN_KINDS), concludes=("stand_in",))
def stand_in(kb):
    """What it concludes: `stand_in`: for each kind of per-rank memory line the target rank did not
    print, the rank whose line stands in for it.

    How: Worker-only excerpts (`(VllmWorkerProcess pid=…)` lines, no driver lines) and Ray clusters
    (`(RayWorkerWrapper pid=…, ip=…)`, one worker's line shown for several with `[repeated 3x across
    cluster]`) leave the target silent while the other ranks of its tensor-parallel group print the
    same figures. The stand-in is taken from those ranks (same DP group and PP stage; a worker of
    unknown index counts) only when every one that printed the kind agrees on every figure they
    share; it is the one that printed the most figures, the first in rank order among equals. Ranks
    that disagree leave the kind unknown for the target, naming the spread: `--target-rank` picks
    one of them.

    Example: `(RayWorkerWrapper pid=1273, ip=10.42.9.225) INFO … Model loading took 14.99 GiB
    [repeated 3x across cluster]`."""
    wanted = target(kb)
    if wanted is None:
        return
    for kind, wording in STAND_IN_KINDS.items():
        by_rank: dict[tuple, list[F.Fact]] = {}
        for fact in kb.of(kind):
            by_rank.setdefault(fact.rank.key(), []).append(fact)
        if not by_rank or wanted in by_rank:
            continue
        peers = {key: facts for key, facts in by_rank.items() if key[:2] == wanted[:2]}
        if not peers:
            continue
        figures = {key: _figures(facts) for key, facts in peers.items()}
        premises = tuple(f for facts in peers.values() for f in facts)
        silent = f"{label_of(kb, wanted)} printed no {wording} line"
        differ = {name: sorted({str(f[name]) for f in figures.values() if name in f})
                  for name in {n for f in figures.values() for n in f}}
        differ = {name: values for name, values in differ.items() if len(values) > 1}
        if differ:
            spread = "; ".join(f"{name} {' vs '.join(values)}" for name, values in sorted(differ.items()))
            yield Derived("stand_in", kind.__name__, Unknown(
                f"{silent}, and the {len(peers)} ranks that printed one disagree ({spread}): give --target-rank "
                f"one of {', '.join(label_of(kb, key) for key in sorted(peers))}"), "stand-in", premises)
            continue
        chosen = min(peers, key=lambda key: (-len(figures[key]), key))
        first = peers[chosen][0]
        agree = (f"the {len(peers)} ranks that printed one agree" if len(peers) > 1
                 else "the only rank that printed one")
        yield Derived("stand_in", kind.__name__, chosen, "stand-in", premises,
                      f"{silent}; {label_of(kb, chosen)}'s ({line_ref(first)}) stands in: {agree}",
                      {"kind": kind.__name__, "rank": label_of(kb, chosen), "ranks": len(peers)})
