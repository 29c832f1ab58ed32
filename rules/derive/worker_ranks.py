"""Which rank each worker process holds, as far as the log states it."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import line_ref


@rule("worker-ranks", reads=(F.Fact,), concludes=("worker_ranks",))
def worker_ranks(kb):
    """What it concludes: `worker_ranks.<process>`: the rank each worker process holds, for the
    processes the log names only by their label (Ray's `(RayWorkerWrapper pid=714, ip=10.0.3.17)`,
    V0's `(VllmWorkerProcess pid=7)`).

    How: the rank its own `rank R in world size W is assigned as DP rank a, PP rank b, TP rank c`
    line states, cited (capdiag.parsing.worker_ranks has placed the process's facts there). A
    worker whose line is not in the log keeps no rank, with the reason — Ray's de-duplication
    folds all but one worker's assignment line into `[repeated Nx across cluster]`, and it
    compares lines without their numbers, so the folded ranks are not in the log. Ranks are never
    guessed from the order of pids or addresses.

    Example: `(RayWorkerWrapper pid=714, ip=10.0.3.17) … rank 1 in world size 4 is assigned as DP
    rank 0, PP rank 0, TP rank 1`: that process is DP0 PP0 TP1."""
    assignments = [a for a in kb.of(F.VllmRankAssignment, role=None) if a.rank.worker]
    folded = [a for a in kb.of(F.VllmRankAssignment, role=None) if a.evidence.repeated]
    workers: dict[str, F.Rank] = {}
    for fact in kb.facts:
        if fact.evidence.source == "log" and fact.rank.worker:
            workers.setdefault(fact.rank.worker, fact.rank)
    for label, rank in sorted(workers.items()):
        own = next((a for a in assignments if a.rank.worker == label), None)
        if rank.tp is not None and own is not None:
            placed = rank.label.rsplit(" (", 1)[0]
            yield Derived("worker_ranks", label, placed, "worker-ranks", (own,),
                          f"{label} is {placed}, as its own line states (rank {own.global_rank} in world size "
                          f"{own.world_size}, {line_ref(own)})")
            continue
        why = f"{label}: the log holds no line of this process that states its rank"
        if folded:
            count = sum(a.evidence.repeated for a in folded)
            why += (f"; Ray folded {count} assignment line(s) of other workers into line(s) "
                    f"{', '.join(str(a.evidence.line) for a in folded)} ([repeated Nx across cluster]), "
                    "comparing them without their numbers, so their ranks are not in the log")
        yield Derived("worker_ranks", label, Unknown(why), "worker-ranks", tuple(folded))
