"""The ``Target`` protocol: what the runner needs from a deployment under test.

A target starts one block's deployment (the arm decides whether the shared
KV tier is connected), says where its replicas listen and what was launched,
and stops it. Every block calls ``start`` again: a (re)start must give fresh
caches and zeroed counters, as the seed's independently restarted blocks.

The runner emits the launch records it gets back (``deployment.launched`` per
replica, ``service.launched`` for a shared cache service) under the block's id;
the target itself never touches the ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ledger import TargetError

__all__ = ["Launch", "LaunchRecord", "Replica", "Target", "TargetError"]


@dataclass(frozen=True)
class Replica:
    """One serving replica: its index, base URL and the GPU it runs on."""

    index: int
    endpoint: str
    gpu: dict[str, Any] | None
    """``{"index", "uuid", "name"}`` per the event conventions (sim: uuid null)."""


@dataclass(frozen=True)
class LaunchRecord:
    """An event the runner appends for the target: ``kind`` and its data."""

    kind: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Launch:
    """A started deployment: replicas in index order, plus what to record."""

    replicas: tuple[Replica, ...]
    config_sha256: str
    records: tuple[LaunchRecord, ...] = field(default_factory=tuple)
    tier_metrics: str | None = None
    """Base URL whose ``/metrics`` exposes the shared tier's own counters (LMCache's lookups, by
    ``cache_salt``), scraped around every measured window beside the replicas; None where the
    block has no shared tier, or its metrics are not served."""


@runtime_checkable
class Target(Protocol):
    """A deployment the runner can start per block, probe and stop."""

    name: str
    """``sim`` or ``vllm``: recorded as ``run.started.params.target``."""

    restarts_blocks: bool
    """Every block runs on a freshly restarted deployment (attached endpoints: no)."""

    warmup_every_replica: bool
    """Every replica gets a warmup before any measured request, even with warmups=0 (real
    engines: a fresh vLLM replica whose first request was a cross-replica hit was seen to die)."""

    health_settle_s: float
    """After a failed request, a second health look this much later (0: none); a dying
    engine can end the stream before its server reports it."""

    @property
    def answers_meaningful(self) -> bool:
        """False for a random-weight model: exact values are then not checked (not applicable)."""
        ...

    @property
    def meaningful_up_to_tokens(self) -> int | None:
        """The largest prompt whose answers mean something (a model card's limit); None: any."""
        ...

    @property
    def model_card(self) -> dict[str, Any] | None:
        """The served model's card summary (``unserved``: size → accuracy), when it has one."""
        ...

    async def prepare_run(self, run_id: str) -> tuple[LaunchRecord, ...]:
        """Bind the run (its id names logs) and return run-level records (``checkpoint.audited``)."""
        ...

    def config_sha256(self, arm: str) -> str:
        """Digest of the correctness-relevant configuration of an arm, before any start.

        Must equal the ``config_sha256`` of the launch records of that arm, so a
        validation run can name the configuration it validates up front.
        """
        ...

    def describe(self) -> dict[str, Any]:
        """Target options worth recording in ``run.started.params`` (JSON-able)."""
        ...

    @property
    def chunk_size(self) -> int:
        """The shared tier's chunk, tokens: what a cross-replica hit is aligned to."""
        ...

    @property
    def model_name(self) -> str:
        """The served model name, sent as the request's ``model``."""
        ...

    async def start(self, *, arm: str, gpus: Sequence[int]) -> Launch:
        """(Re)start the deployment with fresh caches; replica i runs on ``gpus[i]``."""
        ...

    async def stop(self) -> tuple[LaunchRecord, ...]:
        """Stop the block's deployment; returns ``*.stopped`` records."""
        ...

    async def healthy(self, replica: int) -> bool:
        """Whether replica ``replica`` answers its health check."""
        ...

    async def close(self) -> None:
        """Release everything (processes, ports) at the end of the run."""
        ...
