"""The bytes of a model's parameters on one rank, as the checkpoint stores them.

A quantized checkpoint converts its linear layers only: embeddings, norms, routers and every
module its config lists as not converted (`modules_to_not_convert`, `ignored_layers`,
`ignore`, `exclude_modules`) stay in the model dtype. Bytes per converted parameter, with the
scales each format stores (research/memory-models.md §D, from vLLM 0.32 and SGLang 0.5.23
`layers/quantization/`):

| format | bytes per parameter |
|---|---|
| fp8 per tensor / channel | 1 |
| fp8 block (`weight_block_size` b0 × b1) | 1 + 4 / (b0 × b1) (an fp32 scale per block) |
| AWQ / GPTQ b-bit, group g | b/8 + (2 + b/8) / g (an fp16 scale and a packed zero per group) |
| compressed-tensors int b-bit, group g | b/8 + 2/g (+ b/8 / g with zero points) |
| MXFP4 (gpt-oss: routed experts only) | 0.5 + 1/32 |
| NVFP4 (ModelOpt, compressed-tensors) | 0.5 + 1/16 |

`--weight-dtype` names the checkpoint's format where config.json has no quantization block
(a re-quantized copy whose config was not published with it): the generic layout of that
format (AWQ 4-bit, group 128; fp8 per channel; NVFP4) is applied to every linear layer of the
decoder, which is what such checkpoints convert.
"""
from __future__ import annotations

import fnmatch
import re
from typing import Optional

from capdiag.frozen import frozen
from capdiag.memory.shape import Params, Shape, padded_vocab_rows
from capdiag.vocabulary import element_size

GIB = 1 << 30


@frozen
class Quantization:
    """How a checkpoint stores its converted linear weights."""
    method: str
    bytes_per_param: float
    formula: str
    ignore: tuple[str, ...] = ()
    experts_only: bool = False  # MXFP4 converts routed experts alone


# the class of a `--weight-dtype` (what a config's own format must match to be used as it is)
DTYPE_CLASS = {"bf16": "16-bit", "bfloat16": "16-bit", "fp16": "16-bit", "float16": "16-bit", "fp8": "8-bit",
               "int8": "8-bit", "int4": "int4", "fp4": "fp4"}
GENERIC = {"8-bit": ("fp8", 1.0, "fp8 per channel: 1 B"),
           "int4": ("awq", 0.5 + 2.5 / 128, "4-bit, group 128 (AWQ layout): 0.5 + (2 B scale + 0.5 B zero) / 128"),
           "fp4": ("nvfp4", 0.5 + 1 / 16, "NVFP4: 0.5 + an fp8 scale per 16 = 0.5625 B")}


def _ignored(quant: dict) -> tuple[str, ...]:
    names = []
    for key in ("modules_to_not_convert", "ignored_layers", "ignore", "exclude_modules"):
        value = quant.get(key)
        if isinstance(value, list):
            names += [str(v) for v in value]
    return tuple(names)


def _group(value, default: int) -> Optional[int]:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value > 0 else None  # -1: one scale per output channel (no groups)


def checkpoint_quantization(cfg: dict) -> tuple[Optional[Quantization], str]:
    """(the config's own quantization, or None when it states none, with why)."""
    quant = cfg.get("quantization_config")
    if not isinstance(quant, dict) or not quant:
        return None, "config.json has no quantization_config"
    method = str(quant.get("quant_method") or quant.get("quant_algo") or "").lower()
    ignore = _ignored(quant)
    bits = quant.get("bits") or quant.get("w_bit")
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8") or (method == "modelopt" and "fp8" in str(quant.get("quant_algo", "")).lower()):
        block = quant.get("weight_block_size")
        if isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block):
            return Quantization("fp8", 1 + 4 / (block[0] * block[1]),
                                f"fp8 with {block[0]}×{block[1]} blocks: 1 B + a 4 B scale per block", ignore), ""
        return Quantization("fp8", 1.0, "fp8: 1 B", ignore), ""
    if method == "mxfp4":
        return Quantization("mxfp4", 0.5 + 1 / 32, "MXFP4 routed experts: 0.5 B + an e8m0 scale per 32", ignore,
                            experts_only=True), ""
    if method in ("nvfp4", "modelopt_fp4") or "nvfp4" in str(quant.get("quant_algo", "")).lower():
        return Quantization("nvfp4", 0.5 + 1 / 16, "NVFP4: 0.5 B + an fp8 scale per 16", ignore), ""
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits = bits if isinstance(bits, int) and bits in (2, 3, 4, 8) else None
        group = _group(quant.get("group_size", quant.get("q_group_size")), 128)
        if bits is None or group is None and quant.get("group_size") not in (-1,):
            return None, f"{method} with bits {quant.get('bits')!r} and group {quant.get('group_size')!r} is not sized"
        per = bits / 8 + ((2 + bits / 8) / group if group else 0)
        return Quantization(method.split("_")[0], per, f"{method} {bits}-bit"
                            + (f", group {group}: {bits / 8:g} B + (2 B scale + {bits / 8:g} B zero) / {group}"
                               if group else ", one scale per channel"), ignore), ""
    if method == "compressed-tensors":
        groups = quant.get("config_groups") if isinstance(quant.get("config_groups"), dict) else {}
        for name, group in groups.items():
            weights = group.get("weights") if isinstance(group, dict) else None
            if not isinstance(weights, dict):
                continue
            nbits, kind = weights.get("num_bits"), str(weights.get("type", "int"))
            if "nvfp4" in str(quant.get("format", "")) or (nbits == 4 and kind == "float"):
                return Quantization("nvfp4", 0.5 + 1 / 16, "compressed-tensors NVFP4: 0.5 B + an fp8 scale per 16",
                                    ignore), ""
            if nbits == 8:
                return Quantization("fp8" if kind == "float" else "int8", 1.0,
                                    f"compressed-tensors {nbits}-bit {kind}: 1 B", ignore), ""
            if isinstance(nbits, int) and nbits in (2, 3, 4):
                size = _group(weights.get("group_size"), 128)
                if size is None:
                    return None, f"compressed-tensors group {name} has group size {weights.get('group_size')!r}"
                zero = 0 if weights.get("symmetric", True) else nbits / 8
                return Quantization("int4" if nbits == 4 else f"int{nbits}", nbits / 8 + (2 + zero) / size,
                                    f"compressed-tensors int{nbits}, group {size}: {nbits / 8:g} B + "
                                    f"{2 + zero:g} B / {size}", ignore), ""
        return None, "compressed-tensors config_groups state no weight format"
    if method in ("bitsandbytes",):
        return None, "bitsandbytes checkpoints are not sized (their block scales depend on the loader)"
    return None, f"quantization {method or 'without a quant_method'!r} is not sized"


def quantization(cfg: dict, weight_dtype: Optional[str]) -> tuple[Optional[Quantization], str]:
    """The quantization the weights are stored in: config.json's own format where it states one
    (and `weight_dtype`, if given, is of its class); else the generic layout `weight_dtype`
    names; None for 16-bit weights. The second value says where it came from, or why it is
    unknown."""
    own, why = checkpoint_quantization(cfg)
    wanted = DTYPE_CLASS.get(str(weight_dtype).lower()) if weight_dtype else None
    if weight_dtype and wanted is None:
        return None, f"unknown weight dtype {weight_dtype!r}"
    if own is not None:
        own_class = {"fp8": "8-bit", "int8": "8-bit", "mxfp4": "fp4", "nvfp4": "fp4"}.get(own.method, "int4")
        if wanted in (None, own_class):
            return own, f"config.json quantization_config ({own.method})"
        if wanted == "16-bit":
            return None, f"--weight-dtype {weight_dtype} (config.json's {own.method} set aside)"
    elif why.startswith(("quantization", "compressed", "bitsandbytes", "awq", "gptq")) and wanted is None:
        return None, why  # a format the config states but the model cannot size: unknown, not 16-bit
    if wanted in (None, "16-bit"):
        return None, f"--weight-dtype {weight_dtype}" if weight_dtype else "unquantized (config.json)"
    method, per, formula = GENERIC[wanted]
    note = f"--weight-dtype {weight_dtype}: the generic {formula}"
    if own is not None:
        note += f" (config.json states {own.method}, set aside)"
    return Quantization(method, per, formula), note


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        try:
            return re.match(pattern[3:], name) is not None
        except re.error:
            return False
    if "*" in pattern or "?" in pattern:
        return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*")
    return name == pattern or name.startswith(pattern + ".") or name.endswith("." + pattern) \
        or ("." + pattern + ".") in name


def converted(p: Params, quant: Optional[Quantization], experts_kept: bool = False) -> bool:
    """Whether the format converts the group; `experts_kept`: the framework builds the routed
    experts unquantized for this format (SGLang on ROCm has no AWQ/GPTQ MoE method and falls back
    to the unquantized one: sglang/501's out-of-memory traceback is in its `create_weights`)."""
    if quant is None or not p.linear or p.split == "vocab" and p.name != "lm_head" or p.expert and experts_kept:
        return False
    if p.name == "lm_head" or p.name.endswith((".gate", ".router")) or p.name.startswith(("vision_tower", "multi_modal")):
        return False  # the LM head, routers and vision towers stay in the model dtype in every format sized here
    if quant.experts_only and not p.expert:
        return False
    return not any(_matches(p.name, pattern) for pattern in quant.ignore)


# MXFP4 MoE kernels pad an expert's hidden width to a multiple of 256 and its per-rank
# intermediate width to a multiple of 64 (research/memory-models.md §D: gpt-oss's 2880 becomes
# 3072); with those, gpt-oss-120b's loaded weights come out within 0.5% at TP 4 (vllm/002,
# 17.22 GiB) and TP 2 (vllm/609, 32.98 GiB), against 12% and 7% under without them
MXFP4_HIDDEN_ALIGN, MXFP4_INTERMEDIATE_ALIGN = 256, 64


def on_rank(p: Params, tp: int, quant: Optional[Quantization] = None) -> float:
    """Parameters of the group one rank of `tp` holds (MXFP4 experts with the kernels' padding)."""
    if quant is not None and quant.method == "mxfp4" and p.expert and len(p.dims) == 2:
        hidden, inter = p.dims
        return p.count / tp * (_round_up(hidden, MXFP4_HIDDEN_ALIGN) / hidden) \
            * (_round_up(-(-inter // tp), MXFP4_INTERMEDIATE_ALIGN) / (inter / tp))
    if p.split == "replicated":
        return float(p.count)
    if p.split == "kv":
        return p.count * max(1, p.parts // tp) / p.parts
    if p.split == "vocab":
        return p.count / p.parts * padded_vocab_rows(p.parts, tp)
    return p.count / tp


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


@frozen
class WeightBytes:
    bytes: float
    quantized_params: float  # on the rank
    other_params: float
    formula: str

    @property
    def gib(self) -> float:
        return self.bytes / GIB


def weight_bytes(shape: Shape, tp: int, quant: Optional[Quantization], dtype_bytes: float,
                 experts_kept: bool = False) -> WeightBytes:
    """The bytes one of `tp` ranks holds: converted parameters at the format's bytes, the rest
    at `dtype_bytes` (the model dtype)."""
    quantized = other = 0.0
    for p in shape.params:
        if converted(p, quant, experts_kept):
            quantized += on_rank(p, tp, quant)
        else:
            other += on_rank(p, tp)
    total = quantized * (quant.bytes_per_param if quant else 0) + other * dtype_bytes
    if quant is None:
        formula = f"{other / 1e9:.3f} B parameters on the rank × {dtype_bytes:g} B"
    else:
        formula = (f"{quantized / 1e9:.3f} B converted parameters × {quant.bytes_per_param:.4g} B ({quant.formula}) + "
                   f"{other / 1e9:.3f} B others (embeddings, norms, routers, unconverted modules) × {dtype_bytes:g} B")
    if experts_kept and shape.experts:
        formula += "; the routed experts unquantized (no MoE method for this format on this platform)"
    return WeightBytes(total, quantized, other, formula + f" = {total / GIB:.2f} GiB per rank at TP {tp}")


def model_dtype_bytes(cfg: dict, weight_dtype: Optional[str]) -> tuple[float, str]:
    """Bytes of an unconverted parameter. Both frameworks serve `dtype=auto`: config.json's
    16-bit dtype as it is, and a float32 or unstated one in 16 bits (bf16, or fp16 before
    compute capability 8.0) — 2 B either way; a 16-bit `weight_dtype` says the same."""
    stated = cfg.get("torch_dtype") or cfg.get("dtype")
    if weight_dtype and DTYPE_CLASS.get(str(weight_dtype).lower()) == "16-bit":
        return 2.0, f"--weight-dtype {weight_dtype}"
    if isinstance(stated, str) and element_size(stated) == 2:
        return 2.0, f"config.json dtype {stated}"
    return 2.0, (f"config.json dtype {stated}, served in 16 bits by dtype=auto" if stated else
                 "config.json names no dtype: dtype=auto serves it in 16 bits")


_NAMED = re.compile(r"(?:^|[-_/ ])(\d+(?:\.\d+)?)[bB](?=$|[-_/ .])")


def parameters_from_name(name: str) -> Optional[float]:
    """The parameter count a model's name states (`Qwen3.5-122B-A10B` → 122e9; the active count
    after `A` is not the total); None when the name states none."""
    found = [float(m.group(1)) for m in _NAMED.finditer(str(name)) if not str(name)[:m.start(1)].endswith(("A", "a"))]
    return found[0] * 1e9 if found else None


def named_weight_gib(name: str, quantization: Optional[str], tp: int) -> Optional[tuple[float, str]]:
    """(GiB a rank, how) estimated from the name's parameter count and the stated quantization:
    16 bits, 1 B for fp8/int8, 4-bit formats at the AWQ layout — a floor, as embeddings and
    unconverted layers are not counted apart."""
    params = parameters_from_name(name)
    if params is None:
        return None
    q = str(quantization or "").lower()
    per, what = ((1.0, "8-bit") if "fp8" in q or "int8" in q or "w8" in q else
                 (0.5 + 2.5 / 128, "4-bit") if any(k in q for k in ("awq", "gptq", "int4", "w4", "fp4", "mxfp4")) else
                 (2.0, "16-bit") if q in ("", "none") else (None, q))
    if per is None:
        return None
    gib = params * per / GIB / tp
    return gib, f"{params / 1e9:g} B parameters (the model's name) × {per:.3g} B ({what}) ÷ TP {tp} = {gib:.1f} GiB"
