from __future__ import annotations

from capdiag import facts as F
from capdiag.engine import Parts, rule
from capdiag.rules._common import line_ref


@rule("swa-compressed-kv", code="CD121", severity="info", frameworks=("sglang",),
      reads=(F.DSV4MemoryCalculation,))
def swa_compressed_kv(kb):
    """What it checks: the model keeps a compressed, sliding-window KV cache (DeepSeek-V4's
    CSA/HCA pools: `DSV4 memory calculation` / `DSv4 memory calculation` lines).

    Why it matters: its `bytes_per_full_token` already holds the compression and the sliding
    windows, so no per-layer theoretical figure applies, and tokens are "full tokens" of the
    compressed layout. For DeepSeek-V4.1, 528 B / 288 B are the stored per-token payload and
    scale values, not the allocation after page padding.

    Example: `DSV4 memory calculation: bytes_per_full_token=7705.45, available_bytes=11.89 GB,
    c128_state_fixed=0.11 GB, full_token=1641472`.

    What to do: size capacity from the log's bytes_per_full_token and full_token; compare
    deployments by those, not by a per-layer formula.
    """
    calc = kb.first(F.DSV4MemoryCalculation, role=None)
    if calc is None:
        return
    yield Parts((calc,),
                title="KV is compressed (DeepSeek-V4 CSA/HCA)",
                message=f"Compressed sliding-window KV: {calc.bytes_per_full_token} bytes per full token "
                        f"({line_ref(calc)}) already hold the compression; no theoretical per-layer figure applies.",
                action="Compare capacity by bytes_per_full_token and full_token, as printed.")
