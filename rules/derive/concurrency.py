"""How many requests of a given length fit at once."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import context_of, line_ref, request_lengths
from capdiag.memory.sglang import MAMBA_SLOTS_PER_REQUEST


@rule("concurrency", frameworks=("sglang",),
      reads=(F.Options, F.TokenBudget, F.MambaCacheAllocated, "config:dp_size", "config:context_len?",
             "config:max_model_len?"),
      concludes=("concurrency",))
def concurrency(kb):
    """What it concludes: `concurrency.<L>`: how many requests of L tokens fit in the SGLang pool at
    once.

    How: For each request length L (and the context itself where some L is longer: a row longer
    than the context keeps its arithmetic and says such a request is refused): token limit = max_total_num_tokens // L, request limit =
    max_running_requests, concurrent requests = the smaller (the token limit, marked as an upper
    bound, where the request limit is not printed; a hybrid model's Mamba state slots bound it then
    too, three a request, as SGLang caps its request limit). Both figures are per DP worker (SGLang
    divides them under DP attention); radix-cache sharing and page rounding are ignored, so this is
    the worst case of distinct prompts.

    Example: `max_total_num_tokens=415615, …, max_running_requests=4096`: min(415615 // 4096 = 101,
    4096) = 101."""
    options = kb.first(F.Options, role=None)
    lengths = request_lengths(kb)
    budget = next((b for b in kb.of(F.TokenBudget, role=None)), None)
    mamba = next((m for m in kb.of(F.MambaCacheAllocated, role=None) if m.max_cache_size), None)
    dp, context = kb.value("config", "dp_size"), context_of(kb)
    for length in lengths:
        if budget is None:
            yield Derived("concurrency", length, Unknown("the pool's token budget (`max_total_num_tokens`) is not stated"),
                          "concurrency", (options,) if options else ())
            continue
        value, formula, detail = limits(budget.max_total_num_tokens, budget.max_running_requests, length, dp)
        premises, formula = (budget,), f"{formula} ({line_ref(budget)})"
        slots = mamba.max_cache_size // MAMBA_SLOTS_PER_REQUEST if mamba is not None else None
        if budget.max_running_requests is None and slots is not None and slots < value:
            value, premises = slots, (budget, mamba)
            formula += (f"; at most {mamba.max_cache_size} Mamba state slots // {MAMBA_SLOTS_PER_REQUEST} = {slots} "
                        f"requests ({line_ref(mamba)})")
            detail = {**detail, "state_limit": slots, "binding": "state slots"}
        formula, detail = refused(formula, detail, length, context)
        yield Derived("concurrency", length, value, "concurrency", premises, formula, detail)


def refused(formula: str, detail: dict, length: int, context) -> tuple[str, dict]:
    """A row longer than the server's context: the arithmetic stands, but no such request runs."""
    if context is None or length <= context:
        return formula, detail
    return (formula + f"; longer than the {context:,}-token context, so such a request is refused",
            {**detail, "longer_than_context": True})


def limits(pool_tokens: int, requests, length: int, dp) -> tuple[int, str, dict]:
    """(concurrent requests, the arithmetic, the detail) of one request length, from the pool's
    tokens and the request limit (None when not printed). A `--what-if` projection sizes its
    rows with this too."""
    tokens = pool_tokens // length
    both = requests is not None
    value = min(tokens, requests) if both else tokens
    formula = (f"min({pool_tokens} // {length} = {tokens}, max_running_requests {requests})" if both else
               f"{pool_tokens} // {length} = {tokens}; max_running_requests not printed, so an upper bound")
    detail = {"token_limit": tokens, "request_limit": requests, "upper_bound": not both,
              "binding": ("tokens" if not both or tokens < requests else
                          "requests" if requests < tokens else "both")}
    if isinstance(dp, int) and dp > 1:
        detail["per_dp_worker"] = True
        detail["dp_size"] = dp
    return value, formula, detail
