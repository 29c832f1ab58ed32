"""Typed, immutable observations read from the inputs.

Every fact carries its Evidence (line number, raw text, launch) and the rank tags of the
process that printed it: the end of every evidence chain an auditor walks. Memory figures
are in GiB exactly as printed (SGLang's "GB" is bytes / 2**30); the `_gib` suffix says so.
"""
from __future__ import annotations

import functools
from typing import Any, ClassVar, Optional

import attrs

from capdiag.frozen import frozen


@frozen
class Evidence:
    """Where a fact was read: the line (1-based) and its text, the launch of the log it belongs
    to, and the input — `log`, `nvidia-smi`, `config.json`, or `input` for the command line
    and the references (line 0)."""

    line: int
    text: str
    launch: int = 1
    source: str = "log"
    read_to: Optional[int] = None  # a damaged line: only its text before this column was read
    # Ray folded this many more lines of other processes into this one ([repeated Nx across
    # cluster]); it compares lines without their numbers, so theirs may differ and are not shown
    repeated: int = 0
    pid: Optional[int] = None  # the process that printed the line, where its prefix names it
    # the outermost process its prefix names (Ray nests an actor's tag around the server's own):
    # the server a line came from, where one file holds several
    host: Optional[str] = None


@attrs.frozen(order=True)
class Rank:
    """Rank tags from the line prefix; None where the prefix does not carry that tag.

    `worker` names a process whose rank index the line does not give (vLLM's V0
    `VllmWorkerProcess pid=7`, Ray's `RayWorkerWrapper pid=…`): such a process is not TP 0.
    """

    tp: Optional[int] = None
    dp: Optional[int] = None
    pp: Optional[int] = None
    ep: Optional[int] = None
    attn_cp: Optional[int] = None
    moe_dp: Optional[int] = None
    worker: Optional[str] = None

    @property
    def tagged(self) -> bool:
        return any(v is not None for v in attrs.astuple(self))

    @property
    def tp_index(self) -> Optional[int]:
        """Lines with no TP tag belong to TP 0 (single GPU, or a main-process line), except a
        worker process of unknown index."""
        if self.tp is not None:
            return self.tp
        return None if self.worker else 0

    @property
    def label(self) -> str:
        parts = [f"{name.upper()}{value}" for name, value in
                 (("dp", self.dp), ("pp", self.pp), ("attn_cp", self.attn_cp),
                  ("moe_dp", self.moe_dp), ("tp", self.tp), ("ep", self.ep)) if value is not None]
        if self.worker:
            parts.append(f"({self.worker})")
        return " ".join(parts) or "untagged (TP0)"

    def key(self) -> tuple:
        """Sort/identity key that treats an untagged line as TP0; a process whose rank the log
        states (capdiag.parsing.worker_ranks) is that rank, whatever its label."""
        index = self.tp_index
        return (self.dp or 0, self.pp or 0, index if index is not None else 1 << 20,
                self.worker or "" if self.tp is None else "")


NO_RANK = Rank()

INPUT_LINE = 0  # Evidence.line of a fact from the command line or the references

# Start-up phases, in order.
PHASES = ("init", "weights", "kv_pool", "graph_capture", "ready")


# Every fact class is declared with this (capdiag.frozen: attrs writes only its __init__).
frozen_fact = functools.partial(frozen, kw_only=True)


@frozen_fact
class Fact:
    """Base of every observation. `role` is `target` or `draft` (speculative decoding)."""

    evidence: Evidence
    rank: Rank = NO_RANK
    role: str = "target"
    role_stated: bool = False  # the line itself says target/draft (v0.5.14+ graph lines)

    # What a line kind declares about itself, once, beside its fields; capdiag.facts.kinds
    # gathers these into the tables the other layers use (the prefilter's keyword list, the
    # launch splitting, the report's per-rank `observed` keys) and a test checks them.
    # the start-up phase a line of this kind shows was reached (None: says nothing about it)
    PHASE: ClassVar[Optional[str]] = None
    # the framework whose own kind it is (None: both print it, or it is no log line)
    FRAMEWORK: ClassVar[Optional[str]] = None
    # every line of the kind holds one of these (any case): the source's prefilter lets it through
    KEYWORDS: ClassVar[tuple[str, ...]] = ()
    # printed by the launching process, or naming no process: says nothing about which rank runs
    RANK_NEUTRAL: ClassVar[bool] = False
    # opens a start-up: once per-rank lines have been seen, it opens the next one
    OPENS_LAUNCH: ClassVar[bool] = False
    # a rank begins its start-up: again after the start-up ended, or a third time, is a restart
    BEGINS_RANK: ClassVar[bool] = False
    # says the start-up failed
    FAILS_STARTUP: ClassVar[bool] = False
    # under speculative decoding, how the draft worker's line of the kind is told from the
    # target's: "order" (a rank's second line of the kind is the draft's), "pool" (the line
    # belongs to the worker whose `Memory pool end` closes it); None: the target's
    DRAFT_BY: ClassVar[Optional[str]] = None
    # (attribute, observed key): the printed figures the report files under a rank's `observed`
    # (an attribute `values.k` reads key k of the fact's `values`). The kinds' declaration order
    # (module by module: base, failures, sglang, vllm) is the order a rank's keys are listed in,
    # and where two kinds fill one key, the kind declared first is the preferred statement.
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = ()

    @property
    def kind(self) -> str:
        return type(self).__name__


# ---- lines both frameworks print ---------------------------------------------------------

@frozen_fact
class ServerReady(Fact):
    KEYWORDS: ClassVar[tuple[str, ...]] = ("ready to roll", "Application startup complete")
    PHASE: ClassVar[str] = "ready"


@frozen_fact
class LaunchCommand(Fact):
    """The command that started the server (`python -m sglang.launch_server …`, `vllm serve MODEL …`),
    as pasted into the log."""

    # a shell command, or an argument vector printed as a Python list (a Ray actor's argv): its
    # opening and its options
    KEYWORDS: ClassVar[tuple[str, ...]] = ("-m sglang", "sglang serve", "vllm serve", "-m vllm.", "vllm-openai", "docker run",
                                           "['", '["', "'--", '"--')
    RANK_NEUTRAL: ClassVar[bool] = True
    program: str
    args: dict[str, Optional[str]]  # option name with dashes as underscores -> value


@frozen_fact
class OutOfMemory(Fact):
    """PyTorch's CUDA out-of-memory message; `gpu` is the device index it names."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("out of memory",)
    FAILS_STARTUP: ClassVar[bool] = True
    OBSERVED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("tried_to_allocate_mib", "oom_tried_to_allocate_mib"),
        ("total_capacity_gib", "oom_total_capacity_gib"),
        ("free_mib", "oom_free_mib"),
        ("process_in_use_gib", "oom_process_in_use_gib"),
        ("allocated_by_pytorch_gib", "oom_allocated_by_pytorch_gib"),
        ("reserved_unallocated_mib", "oom_reserved_unallocated_mib"))
    gpu: Optional[int] = None
    tried_to_allocate_mib: Optional[float] = None
    total_capacity_gib: Optional[float] = None
    free_mib: Optional[float] = None
    process_in_use_gib: Optional[float] = None
    allocated_by_pytorch_gib: Optional[float] = None
    reserved_unallocated_mib: Optional[float] = None


@frozen_fact
class DeviceName(Fact):
    """The GPU name torch reports, as embedded in a MoE kernel-config file name."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("device_name=",)
    name: str


@frozen_fact
class KVScaleDefault(Fact):
    """An fp8 KV cache stored with its scales at 1.0, because the checkpoint gave none: values
    are cast to fp8 as they are (e4m3 holds ±448 at 3 mantissa bits). `dtype` is the fp8 format
    the line names (vLLM's does, SGLang's does not)."""

    KEYWORDS: ClassVar[tuple[str, ...]] = ("KV cache scaling factor 1.0", "FP8 KV cache but no scaling factors")
    dtype: Optional[str] = None


@frozen_fact
class ComputeCapability(Fact):
    """The GPU's compute capability as a line states it: vLLM's `SymmMemCommunicator: Device
    capability 8.0 not supported`, SGLang's FlashInfer autotune cache path `…/autotune/0.6.18/sm121/…`."""

    # the autotune path holds "sglang", already an anchor of the prefilter (at most 64: source.py)
    KEYWORDS: ClassVar[tuple[str, ...]] = ("Device capability", "sglang/flashinfer/autotune")
    major: int
    minor: int

    @property
    def text(self) -> str:
        return f"{self.major}.{self.minor}"


@frozen_fact
class UnreadLine(Fact):
    """A line of a known kind that could not become a fact (a number out of range, a value
    nested too deep, …): skipped, and named in the report with the reason."""

    RANK_NEUTRAL: ClassVar[bool] = True
    reason: str
