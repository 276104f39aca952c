"""The shared KV tier: an LMCache-like service that replicas load from and store to.

One object in the deployment's process, shared by the replicas by reference
(the connector), and also an HTTP server of its own with LMCache's service
surface: ``/metrics``, ``/healthcheck``, ``/status``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from ._answers import Taint
from ._cache import BlockCache, prompt_hashes
from ._faults import FaultSet
from ._metrics import TierMetrics

__all__ = ["SharedTier"]

LMCACHE_VERSION = "0.5.6+sim"


class SharedTier:
    """Chunk-aligned, salted KV store with LRU eviction and lookup counters."""

    def __init__(
        self, *, chunk_size: int = 256, capacity_chunks: int = 1 << 20, faults: FaultSet | None = None
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        self.chunk_size = chunk_size
        self.capacity_chunks = capacity_chunks
        self.faults = faults if faults is not None else FaultSet()
        self.reset()

    def reset(self) -> None:
        """Empty store and zeroed counters: what a restarted service has."""
        self.chunks = BlockCache(self.capacity_chunks)
        self.metrics = TierMetrics()
        self.lookups = 0

    def _hashes(
        self, model: str, token_ids: Sequence[int], salt: str | None, text: str | None
    ) -> Sequence[bytes]:
        if self.faults.tier("namespace-leak") is not None:
            salt = None  # the fault: every salt lands in one namespace
        return prompt_hashes(token_ids, self.chunk_size, salt, b"lmcache|" + model.encode(), text=text)

    def lookup(
        self, model: str, token_ids: Sequence[int], salt: str | None, text: str | None = None
    ) -> list[Taint | None]:
        """Stored state of the longest chunk-aligned prefix (one entry per chunk)."""
        stale = self.faults.tier("stale-counters")
        self.metrics.frozen = stale is not None and self.lookups >= stale.int_param("after")
        self.lookups += 1
        found = self.chunks.lookup(self._hashes(model, token_ids, salt, text))
        self.metrics.record_lookup(model, salt, len(token_ids), len(found) * self.chunk_size)
        return found

    def store(
        self,
        model: str,
        token_ids: Sequence[int],
        salt: str | None,
        taints: Sequence[Taint | None],
        text: str | None = None,
    ) -> None:
        """Store the full chunks; ``taints`` gives each chunk's state (``text``: the prompt, for the memo)."""
        hashes = self._hashes(model, token_ids, salt, text)
        self.chunks.insert(hashes, list(taints)[: len(hashes)])

    def status(self) -> dict[str, Any]:
        return {
            "status": "healthy",
            "version": LMCACHE_VERSION,
            "chunk_size": self.chunk_size,
            "capacity_chunks": self.capacity_chunks,
            "stored_chunks": len(self.chunks),
            "usage": self.chunks.usage(),
            "lookups": self.lookups,
            "faults": self.faults.spec(),
        }

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthcheck", self._health)
        app.router.add_get("/status", self._status)
        return app

    async def _metrics(self, _: web.Request) -> web.Response:
        self.metrics.stored.set(len(self.chunks))
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "healthy"})

    async def _status(self, _: web.Request) -> web.Response:
        return web.json_response(self.status())
