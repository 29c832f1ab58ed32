from __future__ import annotations

from capdiag.engine import Parts, cannot_judge, rule


@rule("unexplained-memory", code="CD106", worse=("gib", "higher"), severity="warning", thresholds={"max_gib": 2.0, "max_percent": 3.0},
      reads=("breakdown:other", "gpu:total_gib"))
def unexplained_memory(kb, t):
    """What it checks: the `other` row — nvidia-smi's used memory minus everything the log
    accounts for — is above `max_gib` GiB and above `max_percent` % of the GPU total (when the
    total is known).

    Why it matters: memory nobody can name is the usual cause of a "mysterious" OOM under load:
    JIT workspaces (DeepGEMM, Triton autotuning), NCCL growth, allocator fragmentation, or
    another process on the GPU.

    Example: nvidia-smi shows 63092 MiB used, while framework + weights + KV + graphs explain
    57.4 GiB: 4.2 GiB is unexplained.

    What to do: look at the processes nvidia-smi lists; check for DeepGEMM JIT warm-up lines;
    compare with a second sample taken right after start-up, before traffic.
    """
    other = kb.get("breakdown", "other")
    total = kb.get("gpu", "total_gib")
    if other is None or not other.known:
        yield cannot_judge(("the memory no log line explains (`other`)", other))
        return
    if other.value <= t["max_gib"]:
        return
    percent = 100 * other.value / total.value if total is not None and total.known and total.value else None
    if percent is not None and percent <= t["max_percent"]:
        return
    share = f" ({percent:.1f}% of {total.value} GiB)" if percent is not None else ""
    yield Parts((other, total),
                title=f"{other.value} GiB of GPU memory is unexplained",
                message=f"{other.value} GiB in use{share} is not accounted for by any log line ({other.formula}).",
                action="Check nvidia-smi's process list for other tenants; look for DeepGEMM/JIT warm-up; sample "
                       "nvidia-smi again right after start-up to separate start-up from traffic.",
                detail={"gib": other.value, "percent": percent})
