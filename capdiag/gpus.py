"""GPU reference data (references/gpu-specs.json, every figure with its source)."""
from __future__ import annotations

from typing import Any, Optional

from capdiag import facts as F
from capdiag.errors import InputError
from capdiag.resources import reference_json


def gpu_specs() -> list[dict[str, Any]]:
    return reference_json("gpu-specs.json")


def find_gpu(alias: str) -> dict[str, Any]:
    wanted = alias.strip().lower().replace("-", "_").replace(" ", "_")
    for entry in gpu_specs():
        names = [entry["alias"]] + [n.lower().replace("-", "_").replace(" ", "_") for n in entry["names"]]
        if wanted in names:
            return entry
    known = ", ".join(e["alias"] for e in gpu_specs())
    raise InputError(f"--gpu {alias}: not in references/gpu-specs.json (known: {known})")


def gpu_total_fact(alias: Optional[str], total_gib: Optional[float]) -> Optional[F.GpuTotal]:
    """The GPU total as an input fact: a stated --gpu-total-gib wins over the reference's
    observed total. Nominal marketing GB is never used as usable GiB."""
    if total_gib is not None:
        if total_gib <= 0:
            raise InputError(f"--gpu-total-gib {total_gib}: must be positive")
        return F.GpuTotal(evidence=F.Evidence(F.INPUT_LINE, f"--gpu-total-gib {total_gib}", 0),
                          gib=total_gib, source="--gpu-total-gib", alias=alias)
    if alias is None:
        return None
    entry = find_gpu(alias)
    observed = entry.get("observed_total_mib") or []
    if not observed:
        raise InputError(f"--gpu {alias}: the reference has no measured total for {entry['names'][0]} "
                         f"(only the nominal {entry.get('vendor_nominal_gb')} GB); give --gpu-total-gib")
    mib = min(observed)
    note = f" (smallest of the totals observed: {observed} MiB)" if len(observed) > 1 else ""
    text = (f"--gpu {alias}: {entry['names'][0]} total {mib} MiB as nvidia-smi reports it{note}; "
            f"source {entry.get('observed_source') or entry.get('source_url')}")
    return F.GpuTotal(evidence=F.Evidence(F.INPUT_LINE, text, 0), gib=round(mib / 1024, 2),
                      source="references/gpu-specs.json observed total", alias=entry["alias"],
                      name=entry["names"][0])
