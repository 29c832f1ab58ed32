"""nvidia-smi beside the log: which GPU each rank ran on, and the memory no line accounts for."""
from __future__ import annotations

from statistics import median

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import gib, line_ref, target
from capdiag.rules.derive.breakdown import row
from capdiag.vocabulary import HELD  # what holds memory at the end of start-up (activation peaks are released)

SPREAD_GIB = 1.0  # a rank whose used memory differs from the median by more than this is named


def gpu_index(rank: F.Rank, tp_size: int, base: int, step: int) -> int | None:
    """The device a rank ran on: base_gpu_id + (PP stage × TP size + TP rank) × gpu_id_step."""
    if rank.tp_index is None:
        return None
    return base + ((rank.pp or 0) * tp_size + rank.tp_index) * step


@rule("nvidia-smi.ranks",
      reads=(F.Fact, "config:tp_size"),
      concludes=("nvidia_smi",))
def ranks(kb):
    """What it concludes: `nvidia_smi.<rank>`: which GPU nvidia-smi lists for each rank, and its used
    memory.

    How: Pairs each rank with the GPU nvidia-smi lists at index base_gpu_id + (PP stage × TP size +
    TP rank) × gpu_id_step (SGLang's placement; base 0, step 1 unless server_args says otherwise),
    and names a GPU whose used memory differs from the median by more than 1 GiB. nvidia-smi was
    sampled at another time than the log's start-up lines: the server may have served traffic since,
    so the figures are compared, not assumed equal.

    Example: `0, 66120 MiB, 14960 MiB` (`--query-gpu=index,memory.used,memory.free
    --format=csv,noheader`) for TP 0."""
    gpus = {g.index: g for g in kb.of(F.SmiGpu, role=None)}
    if not gpus:
        return
    args = kb.first(F.ServerArgs, role=None)
    base = args.fields.get("base_gpu_id", 0) if args is not None else 0
    step = args.fields.get("gpu_id_step", 1) if args is not None else 1
    tp = kb.value("config", "tp_size") or 1
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
        mid = median(used)
        outliers = [g for g in gpus.values() if g.used_mib is not None and abs(g.used_mib - mid) > SPREAD_GIB * 1024]
        yield Derived("nvidia_smi", "spread", {"median_mib": mid, "outliers": [g.index for g in outliers]},
                      "nvidia-smi.ranks", tuple(gpus.values()),
                      (f"GPU {', '.join(str(g.index) for g in outliers)} differ from the median used "
                       f"{mid:.0f} MiB by more than {SPREAD_GIB} GiB" if outliers else
                       f"every GPU within {SPREAD_GIB} GiB of the median used {mid:.0f} MiB"))


@rule("breakdown.other",
      reads=("target_rank", "nvidia_smi", *(f"breakdown:{c}?" for c in HELD)),
      concludes=("breakdown:other",))
def other(kb):
    """What it concludes: `breakdown.other`: the GiB in use on the rank's GPU that no log line
    explains.

    How: Memory in use that no line accounts for — nvidia-smi's used memory on the target rank's GPU
    minus every category the log explains (framework, weights, KV cache, Mamba state, CUDA graphs,
    and the draft model's). It holds DeepGEMM/JIT workspaces, NCCL growth, allocator fragmentation
    and other tenants. Without nvidia-smi, or with a category unknown, it stays unknown. nvidia-smi
    was sampled after start-up, so traffic since then counts too.

    Example: nvidia-smi's `0, 66120 MiB, 14960 MiB` for the rank's GPU: 64.57 GiB used, less every
    category the log explains."""
    rank = target(kb)
    if rank is None:
        return
    smi = kb.get("nvidia_smi", rank)
    if smi is None or smi.value["used_mib"] is None:
        yield row("other", Unknown("needs the GPU's measured used memory: give --nvidia-smi-file"),
                  "unknown", "breakdown.other", (), "")
        return
    parts = [kb.get("breakdown", c) for c in HELD if kb.get("breakdown", c) is not None]
    missing = [p.key for p in parts if not p.known]
    if missing or kb.get("breakdown", "framework") is None:
        yield row("other", Unknown(f"needs every category; unknown: {', '.join(missing) or 'framework'}"),
                  "unknown", "breakdown.other", (smi, *parts), "")
        return
    used = smi.value["used_mib"] / 1024
    value = gib(used - sum(p.value for p in parts))
    yield row("other", value, "derived", "breakdown.other", (smi, *parts),
              f"nvidia-smi used {smi.value['used_mib']} MiB = {used:.2f} GiB − "
              + " − ".join(f"{p.key} {p.value}" for p in parts) + " GiB (sampled after start-up)")
