"""The latency model: how long prefill, transfer and decode take.

Times are simulated seconds; the deployment's ``time_scale`` multiplies every
delay before sleeping (1.0 real time, 0.005 for the screening, 0.0001 for
tests). A replica sends the first token at the request's arrival (the kernel's
receive time of its first bytes, experiments/targets/sim/_arrival.py; or the end
of the previous prefill, one GPU) plus the scaled prefill time: its own work
on the request counts inside that, so a client sees
max(modelled, actual work) plus transport, never their sum. The defaults are
chosen to give the seed's shape for a 27B model on one GPU, not to fit its
numbers: a cold 128k prefill takes about 20 s, a cross-replica reuse at 128k
about 0.5-0.7 s, a first local reuse at 128k about 20 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LatencyModel"]


@dataclass(frozen=True)
class LatencyModel:
    """Parameters of the simulated timing (simulated seconds)."""

    overhead_s: float = 0.015
    """Per request: parsing, tokenization, scheduling."""
    prefill_s_per_token: float = 5e-5
    """Linear part of prefill (projections, MLP) per computed token."""
    attention_s_per_token_pair: float = 1.6e-9
    """Attention: each computed token attends to every token before it, so
    computing tokens s..n costs this times (n² - s²) / 2: superlinear."""
    transfer_s_per_token: float = 3.5e-6
    """Loading one externally hit token's KV state from the shared tier."""
    decode_s_per_token: float = 0.02
    """Each output token after the first."""
    decode_s_per_context_token: float = 1e-8
    """Extra per output token for each token of context (KV reads)."""

    def prefill_s(self, prompt_tokens: int, local_hits: int, external_hits: int) -> float:
        """Time to the first token: overhead, transfer, then compute the rest."""
        reused = min(prompt_tokens, local_hits + external_hits)
        computed = prompt_tokens - reused
        attention = self.attention_s_per_token_pair * (prompt_tokens**2 - reused**2) / 2
        return (
            self.overhead_s
            + self.transfer_s_per_token * external_hits
            + self.prefill_s_per_token * computed
            + attention
        )

    def decode_step_s(self, context_tokens: int) -> float:
        """Time for one more output token at the given context length."""
        return self.decode_s_per_token + self.decode_s_per_context_token * context_tokens
