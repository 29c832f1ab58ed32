"""Helpers the rule modules share: the target rank, GiB arithmetic as printed, line references,
the framework's knob, command-line values."""
from __future__ import annotations

from typing import Optional

from capdiag import facts as F
from capdiag.engine import Knowledge
from capdiag.parsing.bounds import in_range
from capdiag.vocabulary import DEFAULT_TOKEN_LENGTHS


def target(kb: Knowledge) -> Optional[tuple]:
    """The rank key the breakdown describes (concluded by rules/target_rank.py)."""
    return kb.value("target_rank")


def gib(value: float) -> float:
    """Round a GiB figure to the two decimals SGLang prints, dropping float noise."""
    return round(value + 0.0, 2)


def breakdown_rows(kb: Knowledge, categories) -> list:
    """The breakdown's rows of `categories` that it has, in that order (known or not)."""
    return [d for d in (kb.get("breakdown", c) for c in categories) if d is not None]


def line_ref(fact: F.Fact) -> str:
    if fact.evidence.line == F.INPUT_LINE:  # the command line, the references, or an endpoint
        return "input" if fact.evidence.source in ("input", "log", "references") else fact.evidence.source
    return f"line {fact.evidence.line}" if fact.evidence.source == "log" else \
        f"{fact.evidence.source} line {fact.evidence.line}"


def dsv4_built(kb: Knowledge, rank, role: Optional[str] = "target") -> Optional[tuple[F.Fact, F.Fact, F.Fact]]:
    """(DeepSeek-V4's memory calculation, the first and the last `DSV4 pool sizes` line) of the
    rank, after the calculation and before the rank's first `Memory pool end`: the first is what
    the memory bought, the last what the pools were built with — a second line means a limit cut
    them (compare the first line, not the calculation's `full_token`, which a paste may cut short).
    None without both kinds of line."""
    calc = kb.first(F.DSV4MemoryCalculation, rank, role)
    if calc is None:
        return None
    end = kb.first(F.MemoryPoolEnd, rank, role)
    sizes = [s for s in kb.of(F.DSV4PoolSizes, rank=rank, role=role) if s.full is not None
             and s.evidence.line > calc.evidence.line and (end is None or s.evidence.line < end.evidence.line)]
    return (calc, sizes[0], sizes[-1]) if sizes else None


def context_of(kb: Knowledge) -> Optional[int]:
    """The longest request the server takes (vLLM's max_model_len, SGLang's context_len), or None."""
    context = kb.value("config", "max_model_len") or kb.value("config", "context_len")
    return context if isinstance(context, int) and not isinstance(context, bool) and context > 0 else None


def request_lengths(kb: Knowledge) -> tuple[int, ...]:
    """The request lengths of the concurrency table: the user's (or the default ones), and the
    server's context too where one of them is longer than it (such a request is refused, not
    queued: its row says so, and the context's row says what does run)."""
    options = kb.first(F.Options, role=None)
    lengths = tuple(options.token_lengths if options is not None and options.token_lengths else DEFAULT_TOKEN_LENGTHS)
    context = context_of(kb)
    return tuple(sorted(set(lengths) | {context})) if context is not None and max(lengths) > context else lengths


def sizing_length(kb: Knowledge) -> int:
    """The request length a remedy states its figures at: the first of the table's lengths the
    server takes."""
    context = context_of(kb)
    return next((length for length in request_lengths(kb) if context is None or length <= context), context or 0)


def framework(kb: Knowledge) -> Optional[str]:
    """The log's framework, as detected from it or as --framework says; None when neither."""
    options = kb.first(F.Options, role=None)
    return options.framework if options is not None else None


def is_vllm(kb: Knowledge) -> bool:
    """The log is vLLM's (as detected from it, or as --framework says)."""
    return framework(kb) == "vllm"


def shares_system_memory(kb: Knowledge) -> bool:
    """The GPU's memory is the machine's (DGX Spark GB10, Jetson): what is "free" on it is the
    operating system's too, so advice never hands it more."""
    ident = kb.get("gpu", "identity")
    return ident is not None and ident.known and bool(ident.value.get("shared_system_memory"))


def knob(kb: Knowledge) -> str:
    """The static-fraction flag of the framework that printed the log."""
    return "--gpu-memory-utilization" if is_vllm(kb) else "--mem-fraction-static"


def number_or_text(text: str):
    """A command-line value as the number it spells, else the text."""
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:  # not that kind, or past int()'s digit limit
            continue
        return value if in_range(value) else text  # `inf`, `nan`, 1e308 stay the text they are
    return text


def command_option(command: F.LaunchCommand, name: str, aliases: dict) -> Optional[tuple[str, str]]:
    """(option as written, value) of a setting in a launch command, under its name or one of
    its aliases; None when the command does not give it."""
    for option in (name,) + aliases.get(name, ()):
        if command.args.get(option) is not None:
            return option, command.args[option]
    return None


def runtime(kb: Knowledge):
    """The run-time summary of all ranks' traffic lines (rules/runtime.py), or None."""
    rows = kb.topic("runtime")
    return kb.get("runtime", "all") or (rows[0] if len(rows) == 1 else None)


def observed_concurrency(runtime_value: dict) -> Optional[tuple[int, str]]:
    """(requests the pool holds, at what length) at the lengths the server really saw: the KV a
    running request held in SGLang's decode lines, else the mean finished request of a server's
    length histograms, else the most a request may come to hold by vLLM's request lines (prompt
    + max_tokens: the pool holds at least that many); None when none is known."""
    lengths = runtime_value["observed_lengths"]
    if lengths["concurrency_at_mean_context"]:
        return (lengths["concurrency_at_mean_context"],
                f"the observed mean context of {lengths['mean_context_tokens']:,} tokens per running request")
    if lengths.get("concurrency_at_mean_request"):
        return (lengths["concurrency_at_mean_request"],
                f"the observed mean finished request of {lengths['mean_request_tokens']:,} tokens (prompt + generated)")
    if lengths.get("concurrency_at_request_budget"):
        logged = lengths["request_log"]
        return (lengths["concurrency_at_request_budget"],
                f"the requests' own budget of {lengths['mean_request_budget_tokens']:,} tokens (vLLM's request lines: "
                f"mean prompt {logged['prompt_tokens']['mean']:,} + mean max_tokens {logged['max_tokens']['mean']:,}; "
                "a request that stops early holds less)")
    return None
