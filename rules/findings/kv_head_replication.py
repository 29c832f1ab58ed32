from __future__ import annotations

from capdiag.engine import Parts, cannot_judge, rule


@rule("kv-head-replication", code="CD113", worse=("copies", "higher"), severity="info",
      reads=("kv_pool:theoretical_bytes_per_token",))
def kv_head_replication(kb):
    """What it checks: the model has fewer KV heads than the attention TP size (config.json),
    so each rank stores a copy of one head and the same KV is held several times.

    Why it matters: with 8 KV heads on TP 16, every head is stored twice; the cluster's KV
    memory holds half as many distinct tokens as its size suggests.

    Example: Llama-3.1-70B (8 KV heads) at `--tp 16`.

    What to do: DP attention (`--enable-dp-attention`, attention TP = TP / DP) or a TP size no
    larger than the KV-head count removes the copies; pipeline parallelism scales without them.
    """
    theory = kb.get("kv_pool", "theoretical_bytes_per_token")
    if theory is None or not theory.known:
        what = "the theoretical KV bytes per token" if theory is not None else "the model's config.json"
        yield cannot_judge((what, theory or "give --config-json"))
        return
    if theory.detail.get("replication", 1) <= 1:
        return
    copies = theory.detail["replication"]
    yield Parts((theory,),
                title=f"KV heads are replicated {copies}×",
                message=f"Each KV head is stored {copies} times across the attention-TP ranks ({theory.formula}).",
                action="Use DP attention or a TP size ≤ the KV-head count (with PP for the rest) to stop storing "
                       "copies.",
                detail={"copies": copies})
