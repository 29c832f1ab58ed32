"""The memory terms a plan takes from observation, not from a formula (references/
measured-memory.toml: every point names the log line it was read off). A term is the median of
its points, so one unusual start-up does not move it; the value comes back with its derivation
and the number of points behind it.
"""
from __future__ import annotations

import statistics
from typing import Any, Optional

from capdiag.resources import reference_toml

_FILE = "measured-memory.toml"
MIB = 1 << 20
GIB = 1 << 30


def _points(framework: str, term: str, **match: Any) -> list[dict[str, Any]]:
    return [p for p in reference_toml(_FILE).get(framework, {}).get(term, [])
            if all(p.get(k) == v for k, v in match.items())]


def median_term(framework: str, term: str, what: str, **match: Any) -> tuple[Optional[float], str]:
    """(the median of the term's points that match, its derivation); None when none matches."""
    points = _points(framework, term, **match)
    if not points:
        return None, f"no measured {what}" + (f" for {', '.join(f'{k} {v}' for k, v in match.items())}" if match else "")
    value = statistics.median(p["gib"] for p in points)
    return value, (f"{what} {value:.2f} GiB, measured (the median of {len(points)} start-up"
                   f"{'s' if len(points) > 1 else ''}: {', '.join(p['source'].split(' ')[0] for p in points)})")


def by_tp(framework: str, term: str, what: str, vendor: Optional[str], tp: int) -> tuple[Optional[float], str]:
    """A term measured per TP size: the points of this TP, else of the nearest TP measured
    below it (a larger group's buffers are at least as large), else above it; of this vendor's
    GPUs, or of every GPU when the vendor is not known (or has none measured)."""
    which = {"vendor": vendor} if vendor and _points(framework, term, vendor=vendor) else {}
    sizes = sorted({p["tp"] for p in _points(framework, term, **which)})
    if not sizes:
        return None, f"no measured {what}"
    below = [s for s in sizes if s <= tp]
    nearest = below[-1] if below else sizes[0]
    value, how = median_term(framework, term, what, tp=nearest, **which)
    return value, how + ("" if nearest == tp else f"; TP {nearest}'s figure, the nearest measured to TP {tp}")


def vendor_of(names: tuple[str, ...] | list[str], alias: str) -> str:
    text = " ".join(names).lower() + " " + alias.lower()
    if "amd" in text or "radeon" in text or "instinct" in text or alias.startswith("mi"):
        return "amd"
    if "ascend" in text:
        return "ascend"
    return "nvidia" if "nvidia" in text or "tesla" in text or "geforce" in text else "other"


def device_total(entry: dict[str, Any]) -> tuple[Optional[float], str, bool]:
    """(GiB the process sees on this GPU, where that comes from, whether it is measured): torch's
    total_memory where one was observed; on AMD, nvidia-smi's figure (rocm-smi and torch agree);
    on NVIDIA, memory.total less the driver's reservation the observed pairs show (median)."""
    if entry.get("observed_torch_total_bytes"):
        value = statistics.median(entry["observed_torch_total_bytes"]) / GIB
        return value, f"{entry['names'][0]}: torch total_memory {value:.2f} GiB (observed)", True
    if entry.get("observed_torch_total_mib"):
        value = statistics.median(entry["observed_torch_total_mib"]) / 1024
        return value, f"{entry['names'][0]}: torch total_memory {value:.2f} GiB (observed)", True
    smi = min(entry.get("observed_total_mib") or [0])
    vendor = vendor_of(entry["names"], entry["alias"])
    if not smi and entry.get("vendor_nominal_unit") == "GiB" and entry.get("vendor_nominal_gb"):
        value = float(entry["vendor_nominal_gb"])
        return value, f"{entry['names'][0]}: {value:g} GiB as the vendor states it (binary; no observed total)", False
    if not smi:
        return None, f"{entry['names'][0]}: no observed total (give --gpu-total-gib)", False
    if vendor == "amd":
        return smi / 1024, f"{entry['names'][0]}: {smi} MiB (rocm-smi and torch report the same total)", True
    reserved = statistics.median(_driver_reservations()) if vendor == "nvidia" else 0
    value = (smi - reserved) / 1024
    return value, (f"{entry['names'][0]}: nvidia-smi {smi} MiB less the driver's reservation of ~{reserved:.0f} MiB "
                   f"(the median of the GPUs where both were observed) = {value:.2f} GiB, an estimate"), False


def _driver_reservations() -> list[float]:
    from capdiag.gpus import gpu_specs

    out = []
    for entry in gpu_specs():
        smi = min(entry.get("observed_total_mib") or [0])
        torch_mib = ([b / MIB for b in entry.get("observed_torch_total_bytes") or []]
                     or list(entry.get("observed_torch_total_mib") or []))
        if smi and torch_mib and vendor_of(entry["names"], entry["alias"]) == "nvidia":
            out.append(smi - statistics.median(torch_mib))
    return out or [0.0]
