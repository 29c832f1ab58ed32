"""How many requests of a given length fit at once."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, Unknown, rule
from capdiag.rules._common import line_ref
from capdiag.vocabulary import DEFAULT_TOKEN_LENGTHS


@rule("concurrency",
      reads=(F.Options, F.TokenBudget, "config:dp_size"),
      concludes=("concurrency",))
def concurrency(kb):
    """For each request length L: token limit = max_total_num_tokens // L, request limit =
    max_running_requests, concurrent requests = the smaller (the token limit, marked as an upper
    bound, where the request limit is not printed). Both figures are per DP worker
    (SGLang divides them under DP attention); radix-cache sharing and page rounding are
    ignored, so this is the worst case of distinct prompts."""
    options = kb.first(F.Options, role=None)
    lengths = options.token_lengths if options else DEFAULT_TOKEN_LENGTHS
    budget = next((b for b in kb.of(F.TokenBudget, role=None)), None)
    dp = kb.value("config", "dp_size")
    for length in lengths:
        if budget is None:
            yield Derived("concurrency", length, Unknown("the log has no max_total_num_tokens line"),
                          "concurrency", (options,) if options else ())
            continue
        tokens = budget.max_total_num_tokens // length
        requests = budget.max_running_requests
        both = requests is not None
        value = min(tokens, requests) if both else tokens
        formula = (f"min({budget.max_total_num_tokens} // {length} = {tokens}, max_running_requests "
                   f"{requests}) ({line_ref(budget)})" if both else
                   f"{budget.max_total_num_tokens} // {length} = {tokens}; max_running_requests not printed, "
                   f"so an upper bound ({line_ref(budget)})")
        detail = {"token_limit": tokens, "request_limit": requests, "upper_bound": not both,
                  "binding": ("tokens" if not both or tokens < requests else
                              "requests" if requests < tokens else "both")}
        if isinstance(dp, int) and dp > 1:
            detail["per_dp_worker"] = True
            detail["dp_size"] = dp
        yield Derived("concurrency", length, value, "concurrency", (budget,), formula, detail)
