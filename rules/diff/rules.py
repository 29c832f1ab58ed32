"""`capdiag diff`: what changed between two start-ups, and which configuration change most
plausibly explains each memory change.

Each memory category is explained by the first configuration key, in the order below, that
changed between the two logs; with none changed, the change is attributed to what the
configuration does not show (software version, driver, other processes on the GPU). A value
stated in only one of the logs is listed as a difference but explains nothing.
"""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, rule

# memory category -> configuration keys that size it, most direct first
EXPLAINERS = {
    "weights": ("model", "quantization", "tp_size", "pp_size", "ep_size", "framework_version"),
    "kv_cache": ("mem_fraction_static", "gpu_memory_utilization", "gpu_total_gib", "free_before_weights_gib",
                 "kv_cache_dtype", "tp_size", "pp_size", "dp_size", "page_size", "block_size", "framework_version"),
    "cuda_graph": ("cuda_graph_max_bs", "disable_cuda_graph", "enforce_eager", "max_running_requests", "tp_size",
                   "framework_version"),
    "framework": ("gpu_total_gib", "free_before_weights_gib", "tp_size", "pp_size", "dp_size", "framework_version"),
    "activation": ("max_running_requests", "max_num_batched_tokens", "max_model_len", "framework_version"),
    "free": ("mem_fraction_static", "gpu_memory_utilization", "gpu_total_gib", "free_before_weights_gib",
             "cuda_graph_max_bs", "framework_version"),
    "mamba_state": ("mem_fraction_static", "max_running_requests", "framework_version"),
}
MIN_CHANGE_GIB = 0.05  # smaller differences are the printed rounding


def _sides(kb, topic):
    out: dict = {}
    for f in kb.of(F.Compared, role=None):
        if f.topic == topic:
            out.setdefault(f.key, {})[f.side] = f
    return out


@rule("diff.config",
      reads=(F.Compared,),
      concludes=("diff_config",))
def config_changes(kb):
    """What it concludes: `diff_config`: each configuration value that differs between two start-ups.

    How: each configuration key either log states, compared; a key stated in only one of them is a
    difference too (it explains no memory change: unstated is not changed).

    Example: `mem_fraction_static` 0.6 → 0.88 between two start-ups of one deployment."""
    for key, sides in sorted(_sides(kb, "config").items()):
        before, after = sides.get("before"), sides.get("after")
        values = (before.value if before else None, after.value if after else None)
        if values[0] != values[1]:
            yield Derived("diff_config", key, {"before": values[0], "after": values[1]}, "diff.config",
                          tuple(x for x in (before, after) if x), f"{key}: {values[0]} → {values[1]}")


@rule("diff.memory",
      reads=(F.Compared, "diff_config"),
      concludes=("diff_memory",))
def memory_changes(kb):
    """What it concludes: `diff_memory`: each memory category's change, and the configuration change
    that explains it.

    How: after − before of each breakdown category on the target rank, in GiB; a change under 0.05
    GiB is the printed rounding and not reported. It is explained by the first key of the
    category's list (EXPLAINERS, most direct first) whose value both logs state and differ in;
    none → a different GPU, software version, driver or another process.

    Example: `kv_cache` grew with `mem_fraction_static` 0.6 → 0.88, the first key that sizes it to
    have changed."""
    for category, sides in sorted(_sides(kb, "breakdown").items()):
        before, after = sides.get("before"), sides.get("after")
        if before is None or after is None or None in (before.value, after.value):
            continue
        delta = round(after.value - before.value, 2)
        if abs(delta) < MIN_CHANGE_GIB:
            continue
        cause = _first_change(kb, category)
        why = (f"most plausibly {cause.formula}" if cause else
               "no configuration change stated in both logs explains it: a different GPU, software version, driver "
               "or another process")
        yield Derived("diff_memory", category, {"before": before.value, "after": after.value, "delta": delta,
                                                "explained_by": cause.key if cause else None, "why": why},
                      "diff.memory", tuple(x for x in (before, after, cause) if x),
                      f"{category} {before.value} → {after.value} GiB ({delta:+.2f}): {why}")


def _first_change(kb, category):
    """The first key of the category's explainers whose value both logs state and differ in
    (unstated is not changed); the keys after it are not looked at, so none is a premise."""
    for key in EXPLAINERS.get(category, ()):
        d = kb.get("diff_config", key)
        if d is not None and None not in (d.value["before"], d.value["after"]):
            return d
    return None


@rule("diff.capacity",
      reads=(F.Compared,),
      concludes=("diff_kv_pool", "diff_concurrency"))
def capacity_changes(kb):
    """What it concludes: `diff_kv_pool` and `diff_concurrency`: token capacity and concurrency per
    request length, before and after.

    How: each `kv_pool` value and each `concurrency` row of the two start-ups, compared; those that
    differ are listed with both values.

    Example: `kv_pool.tokens` and the requests of 4096 tokens that fit, in each start-up."""
    for topic in ("kv_pool", "concurrency"):
        for key, sides in sorted(_sides(kb, topic).items(), key=lambda kv: str(kv[0])):
            before, after = sides.get("before"), sides.get("after")
            values = (before.value if before else None, after.value if after else None)
            if values[0] != values[1]:
                yield Derived(f"diff_{topic}", key, {"before": values[0], "after": values[1]}, "diff.capacity",
                              tuple(x for x in (before, after) if x), f"{topic} {key}: {values[0]} → {values[1]}")


@rule("diff.findings",
      reads=(F.Compared,),
      concludes=("diff_finding",))
def finding_changes(kb):
    """What it concludes: `diff_finding`: the findings that appeared or went away between two
    start-ups.

    How: the finding names of the two start-ups, compared: one only after appeared, one only
    before went away (with its title).

    Example: `excess-headroom` goes away once the fraction is raised."""
    for name, sides in sorted(_sides(kb, "finding").items()):
        if len(sides) == 1:
            side, fact = next(iter(sides.items()))
            status = "appeared" if side == "after" else "went away"
            yield Derived("diff_finding", name, {"status": status, "title": fact.value}, "diff.findings", (fact,),
                          f"{name} {status}: {fact.value}")

