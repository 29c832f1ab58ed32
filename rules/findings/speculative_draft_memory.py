from __future__ import annotations

from capdiag.engine import Parts, rule
from capdiag.rules._common import gib


@rule("speculative-draft-memory", code="CD120", worse=("gib", "higher"), severity="info",
      reads=("breakdown:weights", "breakdown:kv_cache", "breakdown:cuda_graph", "breakdown:draft_weights?", "breakdown:draft_kv_cache?", "breakdown:draft_cuda_graph?"))
def speculative_draft_memory(kb):
    """What it checks: a speculative-decoding draft model printed its own weight, KV or graph
    lines (EAGLE, MTP/NEXTN, standalone drafts).

    Why it matters: the draft's weights, KV cache and graphs come out of the same GPU; from
    SGLang v0.5.14 its weights and KV are inside the static fraction, before that they came out
    of the headroom. Knowing its share tells whether speculation pays for the KV it costs.

    Example: `Load weight end. type=LlamaForCausalLMEagle, … mem usage=3.82 GB` after the
    target's load.

    What to do: weigh the draft's memory against the acceptance rate (`accept len` in decode
    lines); a smaller draft or fewer speculative steps frees memory.
    """
    rows = [kb.get("breakdown", c) for c in ("draft_weights", "draft_kv_cache", "draft_cuda_graph")]
    known = [r for r in rows if r is not None and r.known]
    if not known:
        return
    total = gib(sum(r.value for r in known))
    target = [kb.get("breakdown", c) for c in ("weights", "kv_cache", "cuda_graph")]
    target_sum = sum(r.value for r in target if r is not None and r.known)
    share = f", {100 * total / (total + target_sum):.1f}% of model memory" if target_sum else ""
    yield Parts(known,
                title=f"The speculative draft model uses {total} GiB",
                message="The draft model holds " + ", ".join(f"{r.key.replace('draft_', '')} {r.value}" for r in known)
                        + f" GiB — {total} GiB in all{share}.",
                action="Compare with the acceptance rate; a smaller draft or fewer steps frees memory.",
                detail={"gib": total})
