"""Facts from inputs other than the log: the command line, nvidia-smi output, config.json,
the GPU reference table. Their Evidence names the input they came from."""
from __future__ import annotations

from typing import Any, Optional

from capdiag.facts.base import Fact, frozen_fact
from capdiag.vocabulary import DEFAULT_TOKEN_LENGTHS


@frozen_fact
class GpuTotal(Fact):
    """The GPU's total memory in GiB as the user states it (`--gpu-total-gib`)."""

    gib: float


@frozen_fact
class GpuSpec(Fact):
    """A references/gpu-specs.json entry that a name in the inputs matched (or `--gpu` named)."""

    alias: str
    names: tuple[str, ...]
    matched_by: str  # what named it: "--gpu h200", "nvidia-smi name 'NVIDIA H200'", …
    nominal_gb: Optional[float] = None
    nominal_unit: str = "GB"  # AMD's ROCm table gives binary GiB
    observed_total_mib: tuple[int, ...] = ()
    memory_type: Optional[str] = None
    shared_system_memory: bool = False
    source_url: Optional[str] = None
    observed_source: Optional[str] = None
    notes: Optional[str] = None


@frozen_fact
class Options(Fact):
    """What the user asked for (the target rank, the request lengths to size for) and the log's
    framework."""

    target_rank: Optional[str] = None  # "3", "tp3", "pp1", "dp2,tp0" …
    token_lengths: tuple[int, ...] = DEFAULT_TOKEN_LENGTHS
    framework: Optional[str] = None  # the framework whose log this is (detected or --framework)


@frozen_fact
class SmiGpu(Fact):
    """One GPU as nvidia-smi reported it (MiB as printed; None where the output lacks it)."""

    index: int
    used_mib: Optional[int] = None
    free_mib: Optional[int] = None
    total_mib: Optional[int] = None
    name: Optional[str] = None


@frozen_fact
class SmiMigDevice(Fact):
    """A MIG instance in nvidia-smi's `MIG devices:` table: a process on it sees this slice of
    the parent GPU, not the parent's memory."""

    gpu: int
    gpu_instance: int
    compute_instance: int
    mig_device: int
    used_mib: Optional[int] = None
    total_mib: Optional[int] = None


@frozen_fact
class SmiProcess(Fact):
    """A process holding GPU memory: a row of the default table's `Processes:` section or of
    `--query-compute-apps=pid,process_name,used_memory` (which names no GPU)."""

    pid: int
    name: str
    used_mib: Optional[int] = None
    gpu: Optional[int] = None
    gpu_instance: Optional[int] = None


@frozen_fact
class ModelConfig(Fact):
    """A model's config.json: the fields that size its weights and KV cache."""

    fields: dict[str, Any]


@frozen_fact
class Policy(Fact):
    """A gate policy (capdiag.toml): per rule `enabled`, `severity` and `thresholds`, the
    default fail-on level, whether a rule that could not judge fails, and the name of the
    deployment its logs come from."""

    rules: dict[str, dict[str, Any]]
    fail_on: Optional[str] = None
    fail_on_unknown: Optional[bool] = None
    deployment: Optional[str] = None


@frozen_fact
class WhatIf(Fact):
    """`--what-if KEY=VALUE …`: settings to project the start-up under."""

    changes: dict[str, Any]


@frozen_fact
class ModelWeights(Fact):
    """The bytes of a checkpoint's weights: `metadata.total_size` of its
    model.safetensors.index.json (every tensor, in the dtype stored)."""

    total_bytes: int


@frozen_fact
class PlanRequest(Fact):
    """`capdiag plan`: a deployment to size before any log exists. A setting left None is the
    framework's own default (or, for the dtypes, the checkpoint's), which the plan says it took."""

    params: Optional[float] = None  # parameters, when given as --params (else from config.json)
    weight_dtype: Optional[str] = None  # None: as config.json states it
    kv_dtype: Optional[str] = None  # None: `auto`, the model's dtype
    workloads: tuple[tuple[int, int], ...] = ()  # (context tokens, concurrent requests)
    contexts: tuple[int, ...] = ()
    gpus: Optional[int] = None
    tp: Optional[int] = None
    framework: str = "sglang"
    fraction: Optional[float] = None
    headroom: float = 0.15  # --training only: the share of the GPU a fine-tune keeps free
    training: Optional[str] = None  # "full" or "lora"
    weights_as_stored: bool = False  # size the weights from ModelWeights (the checkpoint's own bytes)
    version: Optional[str] = None  # the framework release to plan for (None: the newest modelled)
    settings: tuple[tuple[str, Any], ...] = ()  # --set KEY=VALUE: the framework's own settings


@frozen_fact
class Compared(Fact):
    """One figure of one of two start-ups being compared (`capdiag diff`): `side` is before or
    after; the Evidence is the line that figure rests on in that log."""

    side: str
    topic: str  # "config", "breakdown", "kv_pool", "concurrency", "finding"
    key: Any
    value: Any
