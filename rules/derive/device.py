"""The device an SGLang server ran on, and what its `avail mem` readings measure there."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, rule
from capdiag.rules._common import command_option

# What `avail mem=` means on each device, from `get_available_gpu_memory` (sglang/srt/utils):
# None where it is the device's free memory (`mem_get_info`: CUDA, ROCm/HIP and Hygon DCU,
# MUSA, Ascend NPU, Gaudi HPU); otherwise what it is instead.
AVAIL_MEANING = {
    "xpu": "total − PyTorch-allocated memory (torch.xpu.memory_allocated), not the device's free memory: "
           "PyTorch's cached blocks, the runtime's own memory and other processes are not subtracted",
    "cpu": "the host's available memory divided by the NUMA nodes, not a device's free memory",
}


@rule("device", frameworks=("sglang",),
      reads=(F.ServerArgs, F.LaunchCommand, F.GraphCaptureBegin, F.GraphCaptureEnd),
      concludes=("device:name",))
def device(kb):
    """What it concludes: `device.name`: the device an SGLang server ran on (`cuda`, `npu`,
    `xpu`, `musa`, `hpu`, `cpu`), and whether its `avail mem` readings are the device's free memory.

    How: `server_args` `device`, else the launch command's `--device`, else the device a graph
    capture line names (`Capture npu graph end`, `Capture XPU graph begin`; `cuda graph` is printed
    on MUSA too, so it names nothing). On XPU SGLang reports total − PyTorch-allocated memory as
    `avail mem`, and on CPU the host's available memory per NUMA node: the breakdown then leaves
    `framework` unknown and no advice rests on the free memory.

    Example: `server_args=ServerArgs(…, device='xpu', …)`: avail mem is total − allocated."""
    stated = None
    args = kb.first(F.ServerArgs, role=None)
    if args is not None and isinstance(args.fields.get("device"), str):
        stated = (args.fields["device"], args, f"server_args device={args.fields['device']!r}")
    command = kb.first(F.LaunchCommand, role=None)
    if stated is None and command is not None and command_option(command, "device", {}) is not None:
        stated = (command.args["device"], command, f"launch command --device {command.args['device']}")
    if stated is None:
        named = next((g for g in kb.of(F.GraphCaptureBegin, F.GraphCaptureEnd, role=None)
                      if g.device.lower() != "cuda"), None)
        if named is not None:
            stated = (named.device, named, f"the graph capture line names the {named.device} device")
    if stated is None:
        return
    name, premise, formula = stated[0].lower(), stated[1], stated[2]
    meaning = AVAIL_MEANING.get(name)
    yield Derived("device", "name", name, "device", (premise,),
                  formula + (f"; its `avail mem` is {meaning}" if meaning else ""),
                  {"avail_is_free": meaning is None, "avail_meaning": meaning})


def avail_caveat(kb):
    """What `avail mem` is instead of the device's free memory (AVAIL_MEANING), or None."""
    found = kb.get("device", "name")
    return found.detail["avail_meaning"] if found is not None and not found.detail["avail_is_free"] else None
