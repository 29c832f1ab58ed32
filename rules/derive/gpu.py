"""Which GPU this is, and its total memory, from the best source the inputs give."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import gib, line_ref


@rule("gpu.identity", reads=(F.GpuSpec, F.SmiGpu, F.DeviceName), concludes=("gpu:identity",))
def identity(kb):
    """What it concludes: `gpu.identity`: the GPU model, from its name.

    How: `--gpu`, the names nvidia-smi prints, the `device_name=` of MoE kernel-config lines — never
    by memory size (several GPUs share 81559 or 143771 MiB). Several matching entries (a truncated
    name, different names in different inputs) are reported as ambiguous.

    Example: `--gpu h100_sxm`, or nvidia-smi's `NVIDIA H100 80GB HBM3`."""
    specs = kb.of(F.GpuSpec, role=None)
    if not specs:
        names = [f.name for f in kb.of(F.SmiGpu, F.DeviceName, role=None) if f.name]
        smi = kb.of(F.SmiGpu, role=None)
        reason = (f"no reference entry for {sorted(set(names))}" if names
                  else "no GPU name in the inputs (the nvidia-smi output has no name column: give --gpu, or add "
                       "`name` to the --query-gpu columns)" if smi
                  else "no GPU name in the inputs (give --gpu, or nvidia-smi output)")
        yield Derived("gpu", "identity", Unknown(reason), "gpu.identity",
                      tuple(kb.of(F.SmiGpu, F.DeviceName, role=None)))
        return
    stated = [s for s in specs if s.matched_by.startswith("--gpu")]
    chosen = stated[0] if stated else specs[0]
    aliases = sorted({s.alias for s in specs})
    spelled = sorted({s.alias for s in stated})
    totals = {min(s.observed_total_mib or (0,)) for s in (stated or specs)}
    detail = {"alias": chosen.alias, "name": chosen.names[0],
              "ambiguous": len(spelled) > 1 or (len(aliases) > 1 and not stated),
              "totals_agree": len(totals) == 1 and 0 not in totals,
              "candidates": spelled if len(spelled) > 1 else aliases, "shared_system_memory": chosen.shared_system_memory}
    formula = f"{chosen.names[0]} ({chosen.alias}), named by {chosen.matched_by}"
    if len(spelled) > 1:
        formula = (f"{chosen.matched_by} could be {' or '.join(spelled)}; they all report {totals.pop()} MiB in "
                   f"nvidia-smi, so the total is known (the breakdown takes {chosen.alias})")
    elif len(aliases) > 1:
        formula += (f"; the inputs also name {', '.join(a for a in aliases if a != chosen.alias)}"
                    + (" (--gpu wins)" if stated else ": ambiguous"))
    named_by = [f for f in kb.of(F.DeviceName, F.SmiGpu, role=None) if f.name]
    yield Derived("gpu", "identity", detail, "gpu.identity", tuple(specs) + tuple(named_by[:4]), formula, detail)


@rule("gpu.total", reads=(F.GpuTotal, F.SmiGpu, F.SmiMigDevice, F.VllmMemoryProfile, F.VllmStartupMemory, F.OutOfMemory,
                        F.DeviceCapacity, F.GpuSpec,
                        F.LoadWeightBegin, F.VllmInitialFree, "gpu:identity"), concludes=("gpu:total_gib",))
def total(kb):
    """What it concludes: `gpu.total_gib`: the GPU's total memory in GiB, and where the figure comes
    from.

    How: `--gpu-total-gib`, a MIG instance's memory (nvidia-smi's `MIG devices:` table: a process
    on an instance sees its slice, not the parent GPU; instances of different sizes leave it
    unknown), nvidia-smi's memory.total, a total the log prints (vLLM's profiling
    record or `Free memory on device (F/T GiB)`, PyTorch's out-of-memory message, SGLang's
    `Reported total GPU memory per device (MiB): […], using min: M MiB`), then the
    reference's observed nvidia-smi total for the identified GPU, then nvidia-smi's memory.used +
    memory.free (the documented query has no total column; the driver's reserved memory is in
    neither figure, so this is a little under memory.total — said so), and only then the reference's
    nominal GB — converted (GB × 10^9 / 2^30) and marked nominal, because marketing GB are not
    usable GiB; a nominal figure the vendor states in GiB (AMD's ROCm table) is taken as it is,
    still marked nominal. A nominal total below the free memory the log reports (`Load weight
    begin`, `Initial free memory`) is contradicted by it and left unknown: the vendor's "GB" was
    binary there, or the entry is not the GPU.

    Example: `Free memory on device (78.1/79.25 GiB) on startup`: 79.25 GiB."""
    given = kb.first(F.GpuTotal, role=None)
    if given is not None:
        yield Derived("gpu", "total_gib", given.gib, "gpu.total", (given,), "--gpu-total-gib", {"source": "stated"})
        return
    migs = kb.of(F.SmiMigDevice, role=None)
    if migs:
        sizes = sorted({m.total_mib for m in migs if m.total_mib})
        if len(sizes) == 1:
            parent = next((g.total_mib for g in kb.of(F.SmiGpu, role=None) if g.index == migs[0].gpu), None)
            yield Derived("gpu", "total_gib", gib(sizes[0] / 1024), "gpu.total", tuple(migs),
                          f"MIG instance memory {sizes[0]} MiB / 1024 (nvidia-smi `MIG devices:`"
                          + (f"; {len(migs)} instances of that size" if len(migs) > 1 else "")
                          + (f"; the parent GPU's {parent} MiB is not what a process on an instance sees)"
                             if parent else ")"), {"source": "nvidia-smi"})
        else:
            yield Derived("gpu", "total_gib", Unknown(
                f"nvidia-smi lists MIG instances of {', '.join(map(str, sizes))} MiB: which one the server ran on is "
                "not in the inputs (give --gpu-total-gib)"), "gpu.total", tuple(migs))
        return
    smi = [g for g in kb.of(F.SmiGpu, role=None) if g.total_mib]
    if smi:
        least = min(smi, key=lambda g: g.total_mib)
        yield Derived("gpu", "total_gib", gib(least.total_mib / 1024), "gpu.total", tuple(smi),
                      f"nvidia-smi memory.total {least.total_mib} MiB (GPU {least.index}) / 1024", {"source": "nvidia-smi"})
        return
    printed = [(p, p.values["total_gpu_memory_gib"]) for p in kb.of(F.VllmMemoryProfile, role=None)
               if "total_gpu_memory_gib" in p.values]
    printed += [(s, s.total_gib) for s in kb.of(F.VllmStartupMemory, role=None) if s.total_gib is not None]
    printed += [(o, o.total_capacity_gib) for o in kb.of(F.OutOfMemory, role=None) if o.total_capacity_gib is not None]
    printed += [(c, gib(c.total_mib / 1024)) for c in kb.of(F.DeviceCapacity, role=None)]
    printed = [(fact, value) for fact, value in printed if value > 0]  # a total of 0 is no GPU's
    if printed:
        fact, value = printed[0]
        yield Derived("gpu", "total_gib", value, "gpu.total", (fact,), f"total printed by the log ({line_ref(fact)})",
                      {"source": "log"})
        return
    ident = kb.get("gpu", "identity")
    spec = next((s for s in kb.of(F.GpuSpec, role=None) if ident is not None and ident.known
                 and s.alias == ident.value["alias"]), None)
    if spec is not None and spec.observed_total_mib:
        mib = min(spec.observed_total_mib)
        note = f" (smallest of those observed: {list(spec.observed_total_mib)})" if len(spec.observed_total_mib) > 1 else ""
        yield Derived("gpu", "total_gib", gib(mib / 1024), "gpu.total", (spec, ident),
                      f"reference: {spec.names[0]} reports {mib} MiB in nvidia-smi{note}", {"source": "reference"})
    elif (pairs := [g for g in kb.of(F.SmiGpu, role=None) if g.used_mib is not None and g.free_mib is not None]):
        least = min(pairs, key=lambda g: g.used_mib + g.free_mib)
        mib = least.used_mib + least.free_mib
        yield Derived("gpu", "total_gib", gib(mib / 1024), "gpu.total", tuple(pairs),
                      f"nvidia-smi memory.used {least.used_mib} + memory.free {least.free_mib} = {mib} MiB "
                      f"(GPU {least.index}{', the smallest' if len(pairs) > 1 else ''}) / 1024; the driver's "
                      "reserved memory is in neither, so memory.total would be a little more",
                      {"source": "nvidia-smi"})
    elif spec is not None and spec.nominal_gb:
        binary = spec.nominal_unit == "GiB"
        nominal = gib(spec.nominal_gb if binary else spec.nominal_gb * 1e9 / (1 << 30))
        readings = [(f, f.avail_gib) for f in kb.of(F.LoadWeightBegin, role=None) if f.avail_gib is not None]
        readings += [(f, f.free_gib) for f in kb.of(F.VllmInitialFree, role=None) if f.free_gib is not None]
        most = max(readings, key=lambda r: r[1], default=None)
        if most is not None and most[1] > nominal:
            yield Derived("gpu", "total_gib", Unknown(
                f"{spec.names[0]}'s nominal {spec.nominal_gb} {'GiB' if binary else 'GB'} ({nominal} GiB) is less than "
                f"the {most[1]} GiB the log reports free ({line_ref(most[0])}): the vendor's figure is not the usable "
                "total; give --gpu-total-gib"), "gpu.total", (spec, ident, most[0]))
            return
        yield Derived("gpu", "total_gib", nominal,
                      "gpu.total", (spec, ident),
                      (f"NOMINAL only: {spec.nominal_gb} GiB as the vendor states it" if binary else
                       f"NOMINAL only: {spec.nominal_gb} GB × 10^9 / 2^30")
                      + f"; no measured total is known for {spec.names[0]}"
                      + (" (memory shared with the CPU)" if spec.shared_system_memory else ""),
                      {"source": "nominal"})
    else:
        yield Derived("gpu", "total_gib", Unknown("no total in the inputs: give --gpu, --gpu-total-gib or nvidia-smi "
                                                  "output"), "gpu.total", (ident,) if ident is not None else ())
