"""GPU reference lookups (references/gpu-specs.json, every figure with its source).

Names are matched exactly, as nvidia-smi, torch and MoE kernel-config file names print them
(`NVIDIA_H100_80GB_HBM3` is `NVIDIA H100 80GB HBM3`); a name the table truncated (`Tesla
V100-SXM2...`) matches every entry it is a prefix of. Memory size never identifies a GPU:
several share 81559 or 143771 MiB.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Optional

from capdiag import facts as F
from capdiag.errors import InputError
from capdiag.parsing.bounds import MAX_GIB
from capdiag.resources import reference_json


def gpu_specs() -> list[dict[str, Any]]:
    return reference_json("gpu-specs.json")


def _norm(name: str) -> str:
    return " ".join(name.replace("_", " ").replace("-", " ").lower().split())


def _key(name: str) -> str:
    """A spelling with case, blanks, dashes and underscores ignored (`H100-SXM5` → `h100sxm5`)."""
    return re.sub(r"[\s_\-]+", "", name.lower())


def _least_total(entry: dict[str, Any]) -> Optional[int]:
    return min(entry.get("observed_total_mib") or [0]) or None


def find_gpus(alias: str) -> list[dict[str, Any]]:
    """The entries a `--gpu` spelling names: the alias, a device name, or a spelling people type
    (`h100-sxm5`, `rtx3090`, `3090`, `b200-180gb`); a short alias (`gb10`) names the one entry
    whose alias begins with it. A spelling that names several entries (`h100`: SXM or PCIe)
    gives them all when they report the same total, so the total is still known; otherwise an
    InputError says what it could be and asks."""
    wanted = _key(alias)
    found = [e for e in gpu_specs() if wanted == _key(e["alias"])
             or wanted in [_key(n) for n in e["names"]]]
    found = found or [e for e in gpu_specs() if wanted in [_key(s) for s in e.get("spellings", ())]]
    found = found or [e for e in gpu_specs() if _norm(e["alias"]).startswith(_norm(alias) + " ")]
    if not found:
        known = ", ".join(e["alias"] for e in gpu_specs())
        raise InputError(f"--gpu {alias}: not in references/gpu-specs.json (known: {known})")
    totals = {_least_total(e) for e in found}
    if len(found) > 1 and (len(totals) > 1 or None in totals):
        could = ", ".join(f"{e['alias']} ({_least_total(e) or 'no measured'} MiB)" for e in found)
        raise InputError(f"--gpu {alias}: could be {could}, whose totals differ: name one of them")
    return found


def match_name(name: str) -> list[dict[str, Any]]:
    """Entries whose device name is `name`; for a truncated name, every entry it begins."""
    truncated = name.rstrip().endswith("...")
    wanted = _norm(name.rstrip(". "))
    found = []
    for entry in gpu_specs():
        names = [_norm(n.rstrip(". ")) for n in entry["names"]]
        if wanted in names or (truncated and any(n.startswith(wanted) for n in names)):
            found.append(entry)
    return found


def spec_fact(entry: dict[str, Any], matched_by: str) -> F.GpuSpec:
    text = (f"references/gpu-specs.json {entry['alias']}: {entry['names'][0]}, nominal "
            f"{entry.get('vendor_nominal_gb')} GB, observed totals {entry.get('observed_total_mib')} MiB "
            f"(matched by {matched_by})")
    return F.GpuSpec(evidence=F.Evidence(F.INPUT_LINE, text, 0, "references"), alias=entry["alias"],
                     names=tuple(entry["names"]), matched_by=matched_by,
                     nominal_gb=entry.get("vendor_nominal_gb"), nominal_unit=entry.get("vendor_nominal_unit", "GB"),
                     observed_total_mib=tuple(entry.get("observed_total_mib") or ()),
                     memory_type=entry.get("memory_type"), shared_system_memory=bool(entry.get("shared_system_memory")),
                     source_url=entry.get("source_url"), observed_source=entry.get("observed_source"),
                     notes=entry.get("notes"))


def match_capability(capability: str) -> list[dict[str, Any]]:
    """Entries of this compute capability (`12.1`); a capability names a GPU only when one
    entry has it (9.0 is a dozen Hopper SKUs; 12.1 is GB10 alone)."""
    return [e for e in gpu_specs() if e.get("compute_capability") == capability]


def gpu_input_facts(alias: Optional[str], total_gib: Optional[float], names: Iterable[tuple[str, str]],
                    capabilities: Iterable[tuple[str, str]] = ()) -> list[F.Fact]:
    """Input facts for the GPU: the stated total, the entry `--gpu` names, the entries each
    name seen in the inputs matches (`names` holds (name, where it was seen)), and — where no
    name does — the one entry a stated compute capability belongs to."""
    out: list[F.Fact] = []
    if total_gib is not None:
        if not 0 < total_gib <= MAX_GIB:  # also refuses nan
            raise InputError(f"--gpu-total-gib {total_gib}: must be positive and finite: a GPU's memory in GiB, at most {MAX_GIB:.0f}")
        out.append(F.GpuTotal(evidence=F.Evidence(F.INPUT_LINE, f"--gpu-total-gib {total_gib}", 0, "input"),
                              gib=total_gib))
    if alias is not None:
        out.extend(spec_fact(entry, f"--gpu {alias}") for entry in find_gpus(alias))
    seen: set[tuple[str, str]] = set()
    for name, where in names:
        for entry in match_name(name):
            if (entry["alias"], name) not in seen:
                seen.add((entry["alias"], name))
                out.append(spec_fact(entry, f"{where} {name!r}"))
    if not any(isinstance(f, F.GpuSpec) for f in out):
        for capability, where in dict(capabilities).items():
            found = match_capability(capability)
            if len(found) == 1:
                out.append(spec_fact(found[0], f"compute capability {capability} ({where})"))
                break
    return out
