from __future__ import annotations

from capdiag.engine import Parts, rule
from capdiag.rules._common import gib
from capdiag.vocabulary import GIB


@rule("pool-capped", code="CD130", severity="info",
      reads=("pool_cap", "breakdown:free?", "kv_pool:tokens?", "kv_pool:bytes_per_token?", "phase?"))
def pool_capped(kb):
    """What it checks: a setting, not the memory fraction, sizes the KV pool — SGLang's
    `--max-total-tokens`, vLLM's `--kv-cache-memory` (`kv_cache_memory_bytes`) or
    `--num-gpu-blocks-override`.

    Why it matters: memory left free after start-up is then no sign that the fraction is too
    low, and raising the fraction would change nothing: the cap decides. Advice that reads the
    free memory as waste ("raise the fraction") is wrong for such a start-up; capdiag gives
    none and says what caps the pool instead.

    DeepSeek-V4's pools are built for no more than `max_running_requests` requests of the whole
    context (`pool.cap`): the memory the fraction bought beyond them stays free.

    Example: `server_args=ServerArgs(…, max_total_tokens=20480, …)` with 60 GiB free at the end.

    What to do: keep the cap if it is deliberate (a test, a shared GPU); otherwise remove it and
    let the fraction size the pool — the free memory shown is about what the pool could grow by.
    For DeepSeek-V4's request-sized pools, raise `--max-running-requests` to use what the memory
    bought.
    """
    cap = kb.get("pool_cap")
    if cap is None:
        return
    setting, value = cap.value["setting"], cap.value["value"]
    free, tokens, per_token = kb.get("breakdown", "free"), kb.get("kv_pool", "tokens"), kb.get("kv_pool", "bytes_per_token")
    gain = ""
    premises = [cap]
    if free is not None and free.known and per_token is not None and per_token.known and kb.value("phase") == "ready":
        extra = int(free.value * GIB // per_token.value)
        gain = (f" {gib(free.value)} GiB is free after start-up; without the cap the fraction would size the pool, "
                f"up to about {extra:,} more tokens at {per_token.value:,} bytes each, less the headroom kept free.")
        premises += [free, per_token]
    if tokens is not None and tokens.known:
        premises.append(tokens)
    if "bought_tokens" in cap.value:  # DeepSeek-V4's pools, cut below what the memory bought
        built, bought = cap.value["built_tokens"], cap.value["bought_tokens"]
        if setting == "max_running_requests":
            context = built // value if value else 0
            title = f"DeepSeek-V4's KV pools are built for {value} request(s), not for the memory"
            message = (f"DeepSeek-V4's pools are built for max_running_requests={value} request(s) of the "
                       f"{context:,}-token context ({built:,} tokens), where the memory bought {bought:,}: ")
            action = (f"If more requests must run at once, raise --max-running-requests (the memory holds about "
                      f"{bought // context if context else 0} of the full context); the pools are rebuilt for the count.")
        else:
            title = "DeepSeek-V4's KV pools were cut below what the memory bought"
            message = (f"DeepSeek-V4's pools were built for {built:,} tokens where the memory bought {bought:,}: a limit "
                       "cut them (the log does not state which: --max-total-tokens, or --max-running-requests × the "
                       "context), and ")
            action = ("Raise or remove that limit (--max-total-tokens, else --max-running-requests) to give the pools "
                      f"the memory the fraction bought, about {bought:,} tokens.")
        yield Parts(premises, title=title, message=message + "the rest of the budget stays free.", action=action,
                    detail={"setting": setting, "value": value, "bought_tokens": bought})
        return
    yield Parts(premises,
                title=f"The KV pool is capped by {setting}, not by memory",
                message=f"The KV pool is capped by {setting}={value}, not by memory"
                        f"{f' ({tokens.value:,} tokens)' if tokens is not None and tokens.known else ''}: "
                        f"the memory fraction does not size it.{gain}",
                action=f"Keep {setting} if the cap is deliberate; remove it to let the memory fraction size the pool.",
                detail={"setting": setting, "value": value})
