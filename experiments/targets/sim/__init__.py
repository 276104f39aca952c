"""The ``sim`` target: simulated vLLM 0.33 replicas sharing an LMCache-like tier.

Every replica is a real HTTP server on loopback that speaks the surfaces
kvledger observes: the OpenAI-compatible API (streaming, ``cache_salt``,
usage with ``cached_tokens``), ``/tokenize``, and ``/metrics`` with vLLM's
names. Block-level prefix caches salted like vLLM's, a chunk-aligned shared
tier switchable ON/OFF, a latency model and the seed's faults make the whole
pipeline, and its audit, testable without a GPU.

    async with SimDeployment(replicas=2, shared=True, time_scale=0.001) as dep:
        ...  # dep.replica_urls, dep.shared_url

Fixture convention for answers: ``experiments.targets.sim._answers`` (also
``expected_answer``). Fault syntax: ``_faults``. Timing: ``LatencyModel``.
The server's own first-token times: ``GET /sim/requests`` on each replica.
"""

from ._answers import ASSIGNMENT, QUESTION, expected_answer, garble_value
from ._config import VLLM_VERSION, SimConfig
from ._deployment import SimDeployment
from ._faults import FAULT_KINDS, Fault, FaultSet, parse_faults
from ._latency import LatencyModel
from ._replica import SimReplica
from ._tier import SharedTier
from ._tokenizer import count_tokens, encode, render_chat, split

__all__ = [
    "ASSIGNMENT",
    "FAULT_KINDS",
    "QUESTION",
    "VLLM_VERSION",
    "Fault",
    "FaultSet",
    "LatencyModel",
    "SharedTier",
    "SimConfig",
    "SimDeployment",
    "SimReplica",
    "count_tokens",
    "encode",
    "expected_answer",
    "garble_value",
    "parse_faults",
    "render_chat",
    "split",
]
