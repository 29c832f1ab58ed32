"""Whether the server shares its GPU with a trainer by design (RL frameworks' colocated rollout)."""
from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Derived, rule
from capdiag.rules._common import line_ref

# The option that lets a trainer take the GPU back between rollouts, per framework: vLLM's sleep
# mode (`LLM.sleep()` frees the weights and the KV cache), SGLang's memory saver
# (`release_memory_occupation`). verl, OpenRLHF and slime start their rollout servers with it.
_OPTIONS = ((F.ServerArgs, "enable_memory_saver"), (F.VllmArgs, "enable_sleep_mode"))


def _on(value) -> bool:
    return value is True or (isinstance(value, str) and value.lower() in ("true", "1"))


@rule("config.colocated", concludes=("config:sleep_mode",),
      reads=(F.ServerArgs, F.VllmArgs, F.VllmEngineConfig, F.LaunchCommand))
def colocated(kb):
    """What it concludes: `config.sleep_mode`: the server was started able to hand its memory
    back (vLLM `enable_sleep_mode`, SGLang `enable_memory_saver`) — the mark of a rollout server
    colocated with training, whose GPU memory outside the budget belongs to the trainer.

    How: the resolved arguments (server_args, `non-default args`, the engine config), else the
    flag in a launch command or an argument vector (a bare `--enable-sleep-mode` is on). Not
    stated → not concluded: both default to off, and an unstated option says nothing.

    Example: verl's `['serve', MODEL, …, '--enable_sleep_mode', …]`."""
    for kind, name in _OPTIONS:
        for fact in kb.of(kind, role=None):
            if name in fact.fields:
                yield Derived("config", "sleep_mode", _on(fact.fields[name]), "config.colocated", (fact,),
                              f"{name}={fact.fields[name]!r} ({line_ref(fact)})")
                return
    engine = kb.first(F.VllmEngineConfig, role=None)
    if engine is not None and "enable_sleep_mode" in engine.fields:
        yield Derived("config", "sleep_mode", _on(engine.fields["enable_sleep_mode"]), "config.colocated", (engine,),
                      f"engine config enable_sleep_mode={engine.fields['enable_sleep_mode']} ({line_ref(engine)})")
        return
    command = kb.first(F.LaunchCommand, role=None)
    for _, name in _OPTIONS:
        if command is not None and name in command.args:
            value = command.args[name]
            yield Derived("config", "sleep_mode", value is None or _on(value), "config.colocated", (command,),
                          f"launch command --{name.replace('_', '-')}" + (f" {value}" if value is not None else ""))
            return
