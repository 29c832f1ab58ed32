"""The tables other layers read about line kinds, generated from what each fact class declares
(see `Fact`): no side list to keep in step when a kind is added."""
from __future__ import annotations

from capdiag.facts import base, failures, inputs, runtime, sglang, vllm

# every fact class, in declaration order (module by module: the order preference follows)
KINDS: tuple[type[base.Fact], ...] = tuple(
    cls for module in (base, failures, sglang, vllm, runtime, inputs) for cls in vars(module).values()
    if isinstance(cls, type) and issubclass(cls, base.Fact) and cls.__module__ == module.__name__)

# the source's prefilter: a line holding none of these (in any case) is never parsed
KEYWORDS: tuple[str, ...] = tuple(dict.fromkeys(k for cls in KINDS for k in cls.KEYWORDS))
# the keywords of the traceback grammar's kinds (failures.py): a line holding no other keyword
# is offered to that grammar alone
TRACEBACK_KEYWORDS: tuple[str, ...] = tuple(dict.fromkeys(
    k for cls in KINDS if cls.__module__ == failures.__name__ for k in cls.KEYWORDS))


def kinds_where(flag: str, value=True) -> tuple[type[base.Fact], ...]:
    """The kinds that declare `flag` (e.g. "OPENS_LAUNCH") `value`."""
    return tuple(cls for cls in KINDS if getattr(cls, flag) == value)


def kinds_in_phase(phase: str) -> tuple[type[base.Fact], ...]:
    return tuple(cls for cls in KINDS if cls.PHASE == phase)


# (kind, attribute, observed key), the rows the report files a rank's printed figures by
OBSERVED: tuple[tuple[type[base.Fact], str, str], ...] = tuple(
    (cls, attr, key) for cls in KINDS for attr, key in cls.OBSERVED)

# the facts of inputs other than the log (facts/inputs.py): command line, nvidia-smi, config.json
INPUT_KINDS: tuple[type[base.Fact], ...] = tuple(cls for cls in KINDS if cls.__module__ == inputs.__name__)
