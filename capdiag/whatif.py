"""`--what-if KEY=VALUE` parsing: the settings a projection may change, typed and checked."""
from __future__ import annotations

from typing import Any

from capdiag import facts as F
from capdiag.errors import InputError

MAX_SETTING = 1 << 40  # tokens, requests, ranks: far beyond any deployment

# key -> (type, meaning); both frameworks' names are accepted, the rules say which applies
KEYS: dict[str, tuple[type, str]] = {
    "mem_fraction_static": (float, "SGLang's static fraction"),
    "gpu_memory_utilization": (float, "vLLM's memory utilization"),
    "kv_cache_dtype": (str, "KV cache dtype: fp8_e4m3, fp8_e5m2, fp8, bf16, fp16, auto"),
    "tp_size": (int, "tensor parallel size (needs --config-json)"),
    "max_running_requests": (int, "SGLang's request limit"),
    "max_num_seqs": (int, "vLLM's request limit"),
    "context_len": (int, "SGLang's context length"),
    "max_model_len": (int, "vLLM's context length"),
    "page_size": (int, "tokens per KV page"),
    "block_size": (int, "vLLM's tokens per KV block"),
    "max_num_batched_tokens": (int, "vLLM's batched tokens a step"),
    "chunked_prefill_size": (int, "SGLang's chunked-prefill size"),
    "enforce_eager": (bool, "vLLM without CUDA graphs"),
}
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def parse_settings(items: tuple[str, ...], option: str = "--what-if") -> dict[str, Any]:
    """`KEY=VALUE` items (`option` names them in errors) → {key: typed value}."""
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in KEYS:
            raise InputError(f"{option} {item!r}: use KEY=VALUE with KEY one of {', '.join(KEYS)}")
        kind = KEYS[key][0]
        if kind is bool:
            if raw.strip().lower() not in _BOOLS:
                raise InputError(f"{option} {item}: {key} takes true or false")
            changes[key] = _BOOLS[raw.strip().lower()]
            continue
        try:
            value = kind(raw.strip()) if kind is not str else raw.strip()
        except ValueError:
            raise InputError(f"{option} {item}: {key} takes {kind.__name__} values") from None
        if kind is float and not 0 < value < 1:
            raise InputError(f"{option} {item}: a fraction between 0 and 1")
        if kind is int and not 0 < value <= MAX_SETTING:
            raise InputError(f"{option} {item}: a positive whole number, at most {MAX_SETTING}")
        changes[key] = value
    return changes


def parse_what_if(items: tuple[str, ...]) -> F.WhatIf | None:
    if not items:
        return None
    changes = parse_settings(items)
    text = "--what-if " + " ".join(items)
    return F.WhatIf(evidence=F.Evidence(F.INPUT_LINE, text, 0, "input"), changes=changes)
