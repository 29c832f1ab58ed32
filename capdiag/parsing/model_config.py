"""A model's config.json → a ModelConfig fact (JSON is read with the standard library: it is
data, not a log). Multimodal configs keep the language model's shape under `text_config`;
its fields are lifted so the rules see one flat shape.

Every shape field the rules compute with is checked here, once: a whole number in its range
(a layer count of 10^9 or a head count given as the string "8" is an error naming the field,
not a hang or a string multiplied a billion times), and the nested tables are tables."""
from __future__ import annotations

from typing import Any

from capdiag import facts as F
from capdiag.errors import InputError
from capdiag.side_input import read_json

MAX_LAYERS = 10_000  # the deepest published models have a few hundred
MAX_DIM = 1 << 24  # widths, head counts, vocabulary, expert counts
# field -> smallest allowed value (0 where 0 means "none": no shared experts, no dense prefix)
_WHOLE = {"num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 1,
          "v_head_dim": 1, "hidden_size": 1, "intermediate_size": 1, "moe_intermediate_size": 1,
          "shared_expert_intermediate_size": 1, "vocab_size": 1, "kv_lora_rank": 0, "q_lora_rank": 0,
          "qk_rope_head_dim": 0, "qk_nope_head_dim": 0, "index_head_dim": 0, "n_routed_experts": 0,
          "num_local_experts": 0, "num_experts": 0, "n_shared_experts": 0, "first_k_dense_replace": 0,
          "decoder_sparse_step": 0, "full_attention_interval": 0}
_TABLES = ("quantization_config", "rope_scaling")
_LISTS = ("layer_types", "layers_block_type", "mlp_only_layers", "architectures")


def _check(path: str, fields: dict[str, Any]) -> None:
    for key, low in _WHOLE.items():
        value = fields.get(key)
        high = MAX_LAYERS if key == "num_hidden_layers" else MAX_DIM
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
            raise InputError(f"{path}: {key} must be a whole number from {low} to {high}, not {value!r:.40}")
    for key in _TABLES:
        if fields.get(key) is not None and not isinstance(fields[key], dict):
            raise InputError(f"{path}: {key} must be a JSON object, not {fields[key]!r:.40}")
    for key in _LISTS:
        value = fields.get(key)
        if value is not None and not (isinstance(value, list) and len(value) <= MAX_LAYERS):
            raise InputError(f"{path}: {key} must be a JSON list of at most {MAX_LAYERS} items")
    if not isinstance(fields.get("mlp_only_layers", []), list) or \
            not all(isinstance(i, int) and not isinstance(i, bool) for i in fields.get("mlp_only_layers", [])):
        raise InputError(f"{path}: mlp_only_layers must list layer numbers")
    pattern = fields.get("hybrid_override_pattern")
    if pattern is not None and not (isinstance(pattern, str) and len(pattern) <= MAX_LAYERS):
        raise InputError(f"{path}: hybrid_override_pattern must be a string of at most {MAX_LAYERS} characters")


def _stated(fields: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


def read_model_config(path: str) -> F.ModelConfig:
    return model_config_from(read_json(path, "config.json"), path)


def model_config_from(data: Any, path: str, source: str = "config.json") -> F.ModelConfig:
    """A config.json's parsed JSON (from a file, the Hub, or the command line's shape) → its fact."""
    if not isinstance(data, dict):
        raise InputError(f"{path}: config.json must be a JSON object")
    # a field set to null is a field not stated (as transformers reads it): the rules' own
    # handling of an absent field applies, instead of arithmetic on None
    fields = _stated(data)
    for nested in ("text_config", "language_config", "llm_config"):
        if isinstance(data.get(nested), dict):
            fields = {**fields, **_stated(data[nested]), "_nested": nested}
    if not isinstance(fields.get("num_hidden_layers"), int):
        raise InputError(f"{path}: config.json has no num_hidden_layers; is it a model's config.json?")
    _check(path, fields)
    summary = ", ".join(f"{k}={fields[k]}" for k in ("model_type", "num_hidden_layers", "num_attention_heads",
                                                      "num_key_value_heads", "head_dim", "kv_lora_rank")
                        if k in fields)
    return F.ModelConfig(evidence=F.Evidence(1, f"{path}: {summary}", 0, source), fields=fields)
