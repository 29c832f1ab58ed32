"""A model's config.json → a ModelConfig fact (JSON is read with the standard library: it is
data, not a log). Multimodal configs keep the language model's shape under `text_config`;
its fields are lifted so the rules see one flat shape."""
from __future__ import annotations

import json
from typing import Any

from capdiag import facts as F
from capdiag.errors import InputError
from capdiag.source import open_input


def read_model_config(path: str) -> F.ModelConfig:
    stream = open_input(path)
    try:
        raw = stream.read()
    finally:
        stream.close()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a JSON config ({exc})") from None
    return model_config_from(data, path)


def model_config_from(data: Any, path: str, source: str = "config.json") -> F.ModelConfig:
    """A config.json's parsed JSON (from a file, the Hub, or the command line's shape) → its fact."""
    if not isinstance(data, dict):
        raise InputError(f"{path}: config.json must be a JSON object")
    fields = dict(data)
    for nested in ("text_config", "language_config", "llm_config"):
        if isinstance(data.get(nested), dict):
            fields = {**fields, **data[nested], "_nested": nested}
    if not isinstance(fields.get("num_hidden_layers"), int):
        raise InputError(f"{path}: config.json has no num_hidden_layers; is it a model's config.json?")
    summary = ", ".join(f"{k}={fields[k]}" for k in ("model_type", "num_hidden_layers", "num_attention_heads",
                                                      "num_key_value_heads", "head_dim", "kv_lora_rank")
                        if k in fields)
    return F.ModelConfig(evidence=F.Evidence(1, f"{path}: {summary}", 0, source), fields=fields)
