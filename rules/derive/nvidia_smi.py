"""nvidia-smi beside the log: which GPU each rank ran on, and the memory no line accounts for."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import breakdown_rows, gib, target
from capdiag.rules.derive.breakdown import row
from capdiag.vocabulary import NAMED

SPREAD_GIB = 1.0  # a rank whose used memory differs from the median by more than this is named


def gpu_index(rank: F.Rank, tp_size: int | None, base: int, step: int) -> int | None:
    """The device a rank ran on: base_gpu_id + (PP stage × TP size + TP rank) × gpu_id_step; None
    for a later PP stage when the TP size is not stated (its offset is unknown, not 1 × stage)."""
    if rank.tp_index is None or rank.pp and not isinstance(tp_size, int):
        return None
    return base + ((rank.pp * tp_size if rank.pp else 0) + rank.tp_index) * step


@rule("nvidia-smi.ranks",
      reads=(F.Fact, F.SmiMigDevice, "config:tp_size"),
      concludes=("nvidia_smi",))
def ranks(kb):
    """What it concludes: `nvidia_smi.<rank>`: which GPU nvidia-smi lists for each rank, and its used
    memory.

    How: Pairs each rank with the GPU nvidia-smi lists at index base_gpu_id + (PP stage × TP size +
    TP rank) × gpu_id_step (SGLang's placement; base 0, step 1 unless server_args says otherwise),
    and names a GPU whose used memory differs from the median by more than 1 GiB. nvidia-smi was
    sampled at another time than the log's start-up lines: the server may have served traffic since,
    so the figures are compared, not assumed equal. With MIG instances (the table's `MIG devices:`)
    a process sees its instance, not the parent GPU: the one instance of a one-rank log is the
    rank's; otherwise which instance each rank used is not in the inputs, and is not guessed.

    Example: `0, 66120 MiB, 14960 MiB` (`--query-gpu=index,memory.used,memory.free
    --format=csv,noheader`) for TP 0."""
    gpus = {g.index: g for g in kb.of(F.SmiGpu, role=None)}
    migs = kb.of(F.SmiMigDevice, role=None)
    if migs:  # a process on a MIG instance sees the instance, not the parent GPU
        yield from _mig_ranks(kb, migs)
        return
    if not gpus:
        return
    args = kb.first(F.ServerArgs, role=None)
    base = args.fields.get("base_gpu_id", 0) if args is not None else 0
    step = args.fields.get("gpu_id_step", 1) if args is not None else 1
    tp = kb.value("config", "tp_size")
    keys = {f.rank.key(): f.rank for f in kb.facts if f.evidence.source == "log"}
    for key, rank in sorted(keys.items()):
        index = gpu_index(rank, tp, base if isinstance(base, int) else 0, step if isinstance(step, int) else 1)
        if index in gpus:
            g = gpus[index]
            yield Derived("nvidia_smi", key, {"index": index, "used_mib": g.used_mib, "free_mib": g.free_mib,
                                              "total_mib": g.total_mib, "name": g.name},
                          "nvidia-smi.ranks", (g,) + ((args,) if args is not None else ()),
                          f"{rank.label} → GPU {index} (nvidia-smi line {g.evidence.line})")
    used = [g.used_mib for g in gpus.values() if g.used_mib is not None]
    if len(used) > 1:
        from statistics import median  # with its decimal and fractions, only for nvidia-smi output

        mid = median(used)
        outliers = [g for g in gpus.values() if g.used_mib is not None and abs(g.used_mib - mid) > SPREAD_GIB * 1024]
        yield Derived("nvidia_smi", "spread", {"median_mib": mid, "outliers": [g.index for g in outliers]},
                      "nvidia-smi.ranks", tuple(gpus.values()),
                      (f"GPU {', '.join(str(g.index) for g in outliers)} differ from the median used "
                       f"{mid:.0f} MiB by more than {SPREAD_GIB} GiB" if outliers else
                       f"every GPU within {SPREAD_GIB} GiB of the median used {mid:.0f} MiB"))


def _mig_ranks(kb, migs):
    """With MIG instances the parent GPU's figures are no rank's: the one instance, when there is
    one and one rank, is the rank's; otherwise which instance each rank ran on is not in the inputs."""
    keys = {f.rank.key(): f.rank for f in kb.facts if f.evidence.source == "log"}
    if len(migs) == 1 and len(keys) <= 1:
        m = migs[0]
        key = next(iter(keys), F.NO_RANK.key())
        yield Derived("nvidia_smi", key, {"index": f"{m.gpu} MIG {m.gpu_instance}/{m.compute_instance}",
                                          "used_mib": m.used_mib, "free_mib": None, "total_mib": m.total_mib,
                                          "name": None},
                      "nvidia-smi.ranks", (m,),
                      f"the only MIG instance: GPU {m.gpu} GI {m.gpu_instance} CI {m.compute_instance} "
                      f"(nvidia-smi line {m.evidence.line})")
        return
    yield Derived("nvidia_smi", "mig", Unknown(
        f"nvidia-smi lists {len(migs)} MIG instances and the log {len(keys)} rank(s): which instance each rank ran "
        "on is not in the inputs (give nvidia-smi output of one instance, or --gpu-total-gib)"),
                  "nvidia-smi.ranks", tuple(migs))


@rule("nvidia-smi.processes", reads=(F.SmiProcess, F.Fact), concludes=("smi_processes",))
def processes(kb):
    """What it concludes: `smi_processes.all`: the processes nvidia-smi shows holding GPU memory,
    and which of them are this server.

    How: the default table's `Processes:` section, or `--query-compute-apps=pid,process_name,
    used_memory`; a pid that a line's process prefix names (`(EngineCore_0 pid=207574)`,
    `(RayWorkerWrapper pid=…)`) is the server's, another pid is another tenant of the GPU, whose
    memory is in `other`. A log that prints no pids (SGLang) leaves it unknown which is the server.

    Example: `3321, /opt/tenant/bin/encoder, 2048 MiB` beside a log of `(EngineCore_0 pid=207574)`
    lines: another tenant holds 2048 MiB."""
    procs = kb.of(F.SmiProcess, role=None)
    if not procs:
        return
    pids = {f.evidence.pid for f in kb.facts if f.evidence.source == "log" and f.evidence.pid is not None}
    rows = [{"pid": p.pid, "name": p.name, "used_mib": p.used_mib, "gpu": p.gpu,
             "server": (p.pid in pids) if pids else None} for p in procs]
    tenants = [r for r in rows if r["server"] is False]
    said = ("the log names no process ids, so which of them is this server is not known" if not pids else
            f"{sum(1 for r in rows if r['server'])} of them are this server (their pids are in the log's prefixes)"
            + (f"; other tenants: " + ", ".join(f"pid {r['pid']} {r['name']} {r['used_mib']} MiB" for r in tenants)
               if tenants else "; no other process holds GPU memory"))
    yield Derived("smi_processes", "all", rows, "nvidia-smi.processes", tuple(procs),
                  f"nvidia-smi shows {len(rows)} process(es) holding GPU memory; {said}")


@rule("breakdown.other",
      reads=("target_rank", "nvidia_smi", "nvidia_smi:mig?", *(f"breakdown:{c}?" for c in NAMED)),
      concludes=("breakdown:other",))
def other(kb):
    """What it concludes: `breakdown.other`: the GiB in use on the rank's GPU that no log line
    names, as nvidia-smi reads it.

    How: nvidia-smi's used memory on the target rank's GPU minus every row a log line names
    (framework, weights, KV cache, Mamba state, CUDA graphs, the draft model's, and vLLM's profiled
    activation peak, which the allocator keeps once traffic has run). It is the residual row's
    unnamed memory read again, later — SGLang's `unattributed`, vLLM's `unstated` less what
    nvidia-smi shows free — so the report nests it under that row: with traffic since start-up it
    also holds what requests took from the free memory. It holds DeepGEMM/JIT workspaces, NCCL
    growth, allocator fragmentation and other tenants. Without nvidia-smi, or with a row unknown,
    it stays unknown.

    Example: nvidia-smi's `0, 66120 MiB, 14960 MiB` for the rank's GPU: 64.57 GiB used, less every
    row the log names."""
    rank = target(kb)
    if rank is None:
        return
    smi = kb.get("nvidia_smi", rank)
    mig = kb.get("nvidia_smi", "mig")
    if smi is None and mig is not None:
        yield row("other", Unknown(mig.value.reason), "unknown", "breakdown.other", (mig,), "")
        return
    if smi is None or smi.value["used_mib"] is None:
        yield row("other", Unknown("needs the GPU's measured used memory: give --nvidia-smi-file"),
                  "unknown", "breakdown.other", (), "")
        return
    parts = breakdown_rows(kb, NAMED)
    missing = [p.key for p in parts if not p.known]
    if missing or kb.get("breakdown", "framework") is None:
        yield row("other", Unknown(f"needs every category; unknown: {', '.join(missing) or 'framework'}"),
                  "unknown", "breakdown.other", (smi, *parts), "")
        return
    used = smi.value["used_mib"] / 1024
    value = gib(used - sum(p.value for p in parts))
    yield row("other", value, "derived", "breakdown.other", (smi, *parts),
              f"nvidia-smi used {smi.value['used_mib']} MiB = {used:.2f} GiB − "
              + " − ".join(f"{p.key} {p.value}" for p in parts)
              + " GiB: the unnamed memory read by nvidia-smi, after start-up (traffic since counts too)")
