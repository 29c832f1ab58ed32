"""The words every layer shares, written once: the memory categories a GPU's start-up memory is
split into, the configuration keys a report states, the request lengths the concurrency table
uses when none are given, and the KV cache's bytes per token a log implies, with the band its
printed rounding leaves (what config.json implies is the memory model's: capdiag.memory.kv).

Rules, the plan worksheet, what-if, the report and the bars read these; the templates get the
categories through the report and the bars. Nothing here reads a log or a fact.
"""
from __future__ import annotations

from typing import Optional

from capdiag.frozen import frozen

GIB = 1 << 30

# What a start-up leaves resident on a GPU, bottom to top of a rank's stacked bar.
HELD = ("framework", "weights", "kv_cache", "mamba_state", "cuda_graph", "draft_weights", "draft_kv_cache",
        "draft_cuda_graph")
# A rank's bar, bottom to top: what is held, vLLM's profiled activation peak, what no log line
# names (SGLang), then free: the breakdown's top-level rows, which sum to the GPU total.
SEGMENTS = HELD + ("activation", "unattributed", "free")
# The breakdown table's rows: vLLM's profiled activation peak sits with the target model's
# rows; `unattributed` (SGLang: free before weights less the rows and the free memory) and
# `unstated` (vLLM: the GPU total less the rows) are the residual no line names, and `other`,
# nvidia-smi's later reading of that unnamed memory, is a row within the residual.
BREAKDOWN = HELD[:5] + ("activation",) + HELD[5:] + ("unattributed", "unstated", "other", "free")
# Each framework's residual row, and the rows nested in another (row: its parent, by framework).
RESIDUAL = {"sglang": "unattributed", "vllm": "unstated"}
NESTED = {"other": RESIDUAL}
# The rows a log line names: what nvidia-smi's used memory is compared with.
NAMED = HELD + ("activation",)
# Held since the weights began to load: free memory before the weights load, less these and the
# free memory at the end, is what no row explains (the framework's part came before).
HELD_SINCE_WEIGHTS = ("weights", "kv_cache", "cuda_graph", "mamba_state", "draft_weights", "draft_kv_cache",
                      "draft_cuda_graph")

# The serving configuration a report states and a diff compares, in the report's order.
# The most of a GPU a static fraction may take: above it nothing is left for activations and graphs.
MAX_FRACTION = 0.95

# A finding's severities, least first (a policy's fail-on level, the report's order, a remedy that
# makes a finding worse all rank by this)
SEVERITIES = ("info", "warning", "error")

CONFIG_KEYS = ("framework_version", "model", "tp_size", "pp_size", "dp_size", "ep_size", "mem_fraction_static",
               "gpu_memory_utilization", "kv_cache_dtype", "max_model_len", "context_len",
               "max_running_requests", "page_size", "block_size", "quantization")

# Request lengths (tokens) of the concurrency table when `--token-lengths` is not given.
DEFAULT_TOKEN_LENGTHS = (4096, 6144, 8192)

# The printed KV sizes carry two decimals of GiB (SGLang's "GB" is GiB; vLLM's GiB): ± half of that.
PRINTED_GIB_ROUNDING = 0.005

_ELEMENT = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
            "bf16 or fp16": 2}  # the last: a width read from the log (kv-pool.dtype)


def element_size(dtype: Optional[str]) -> Optional[float]:
    """Bytes per KV element for a dtype as configs and logs spell it; None for fp4 and unknowns."""
    if not dtype:
        return None
    name = str(dtype).lower().replace("torch.", "")
    if "fp4" in name or "float4" in name or "nvfp4" in name:
        return None
    if "fp8" in name or "float8" in name or name in ("mxfp8", "int8", "uint8"):
        return 1
    return _ELEMENT.get(name)


@frozen
class ImpliedCell:
    """The bytes per token a printed KV size and token count imply, and the band the size's
    printed rounding leaves around it."""
    bytes: int
    low: int
    high: int
    formula: str


def implied_bytes_per_token(kv_gib: float, tokens: int) -> ImpliedCell:
    """KV bytes / tokens for a KV size printed in GiB to two decimals (± 0.005 GiB)."""
    low = (kv_gib - PRINTED_GIB_ROUNDING) * GIB / tokens
    high = (kv_gib + PRINTED_GIB_ROUNDING) * GIB / tokens
    value = round(kv_gib * GIB / tokens)
    return ImpliedCell(value, round(low), round(high),
                       f"{kv_gib} GiB × 2^30 / {tokens} tokens = {value} B (printed rounding: {low:.0f}–{high:.0f} B)")
