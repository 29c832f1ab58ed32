"""The memory model: how SGLang and vLLM size a GPU's memory, written once as each framework
computes it, and run three ways so the directions cannot disagree — backwards (`explain`: the
log's figures are its inputs and outputs), sideways (`--what-if`: a changed setting projected
through it) and forwards (`plan`: config.json + GPU + settings give the pool the framework
would allocate).

- `shape`: config.json → the layers, attention kinds, recurrent state and parameter groups the
  frameworks build (what is sharded over TP, what is replicated, what is quantized);
- `weights`: the bytes of those parameters on one rank, by the checkpoint's quantization;
- `kv`: the bytes of one token's KV (per attention kind) and of one request's recurrent state;
- `sglang`, `vllm`: each framework's budget and pool arithmetic;
- `measured`: the terms no formula gives (CUDA context, load overhead, activation peak), as
  data measured on real start-ups, each with its source line.

Nothing here reads a log or a fact: the rules hand in numbers and get numbers with their
arithmetic back.
"""
