"""Typed, immutable observations read from the inputs: `from capdiag import facts as F`.

`base` holds what every fact shares (Evidence, Rank, Fact) and the kinds both frameworks
print; `failures` the pieces of tracebacks and dying processes (both frameworks); `sglang` and
`vllm` hold each framework's own line kinds; `runtime` the summed traffic lines; `inputs` the
facts of the command line, nvidia-smi output, config.json and the references.
"""
from capdiag.facts.base import *  # noqa: F401,F403
from capdiag.facts.failures import *  # noqa: F401,F403
from capdiag.facts.inputs import *  # noqa: F401,F403
from capdiag.facts.sglang import *  # noqa: F401,F403
from capdiag.facts.vllm import *  # noqa: F401,F403
from capdiag.facts.runtime import *  # noqa: F401,F403
from capdiag.facts.kinds import INPUT_KINDS, KEYWORDS, KINDS, OBSERVED, kinds_in_phase, kinds_where  # noqa: F401
