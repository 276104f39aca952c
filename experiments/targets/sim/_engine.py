"""One replica's cache logic: lookup order, counters and stores, as vLLM + LMCache.

Per request (at scheduling, like vLLM's scheduler):

1. Local prefix cache: the longest cached prefix of full blocks, capped so at
   least the last prompt token is computed: at most ``(n-1) // block`` blocks.
   ``prefix_cache_queries += n``, ``prefix_cache_hits += local``.
2. With the connector (shared ON): LMCache looks the prompt up chunk by chunk;
   a full-prompt hit is cut to ``n-1`` (vLLM must compute the last token), and
   the connector loads only what the local cache lacks:
   ``external = max(0, tier_hit - local)``;
   ``external_prefix_cache_queries += n - local``, ``..._hits += external``.
3. After prefill: every full block is cached locally, every full chunk is
   stored to the tier (ON).

State loaded under a load fault carries a taint; so does every block computed
after it in the same request (later tokens attend to the wrong state).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._answers import Taint, TaintRange
from ._cache import BlockCache, prompt_hashes
from ._config import SimConfig
from ._faults import FaultSet
from ._metrics import ReplicaMetrics
from ._protocol import CompletionRequest
from ._tier import SharedTier

__all__ = ["Prefill", "ReplicaEngine"]


@dataclass(frozen=True)
class Prefill:
    """What scheduling found for one request."""

    prompt_tokens: int
    local_hits: int
    external_hits: int
    taints: list[TaintRange]
    local_hashes: Sequence[bytes]

    @property
    def cached(self) -> int:
        return self.local_hits + self.external_hits


def _taint_from(taints: list[TaintRange], start: int, end: int) -> Taint | None:
    """Taint of the unit [start, end): the first tainted range beginning before its end."""
    return next((t.taint for t in taints if t.start < end), None) if start < end else None


class ReplicaEngine:
    """A replica's prefix cache, connector and vLLM counters."""

    def __init__(
        self, index: int, config: SimConfig, tier: SharedTier, faults: FaultSet, shared: bool
    ) -> None:
        self.index = index
        self.config = config
        self.tier = tier
        self.faults = faults
        self.shared = shared
        self.cache = BlockCache(config.capacity_blocks)
        self.metrics = ReplicaMetrics(config.model_name, config.cache_info())
        self.finished = 0

    def schedule(self, req: CompletionRequest) -> Prefill:
        """Look up local then external hits and count them."""
        stale = self.faults.replica(self.index, "stale-counters")
        self.metrics.frozen = stale is not None and self.finished >= stale.int_param("after")
        ids, n, block = req.token_ids, len(req.token_ids), self.config.block_size
        leak = self.faults.replica(self.index, "namespace-leak") is not None
        hashes = prompt_hashes(ids, block, None if leak else req.cache_salt, text=req.prompt_text)
        off = self.faults.replica(self.index, "cache-off") is not None
        # store() inserts this prompt's blocks right after (same GPU turn), touching them all.
        found: list[Taint | None] = [] if off else self.cache.lookup(hashes[: (n - 1) // block], touch=False)
        local = len(found) * block
        taints = (
            [TaintRange(j * block, (j + 1) * block, t) for j, t in enumerate(found) if t]
            if any(found)
            else []
        )
        external = self._external(req, local, taints) if self.shared else 0
        m = self.metrics
        m.add(m.prefix_queries, n)
        m.add(m.prefix_hits, local)
        if self.shared:
            m.add(m.ext_queries, n - local)
            m.add(m.ext_hits, external)
        return Prefill(n, local, external, taints, hashes)

    def _external(self, req: CompletionRequest, local: int, taints: list[TaintRange]) -> int:
        n, chunk = len(req.token_ids), self.config.chunk_size
        if self.faults.tier("cache-off") is not None:
            return 0
        found = self.tier.lookup(self.config.model_name, req.token_ids, req.cache_salt, req.prompt_text)
        external = max(0, min(len(found) * chunk, n - 1) - local)
        load = self.faults.load_taint(self.index) if external else None
        if external and (load is not None or any(found)):  # else no chunk brings a taint
            for j, stored in enumerate(found):
                start, end = max(j * chunk, local), min((j + 1) * chunk, local + external)
                wrong = load is not None and load.chunk in (None, j)
                taint = load if wrong else stored
                if start < end and taint is not None:
                    taints.append(TaintRange(start, end, taint))
            taints.sort(key=lambda t: t.start)
        return external

    def store(self, req: CompletionRequest, pre: Prefill) -> None:
        """Cache the prompt's full blocks locally and its full chunks in the tier."""
        block = self.config.block_size
        blocks: Sequence[Taint | None] = (
            [_taint_from(pre.taints, j * block, (j + 1) * block) for j in range(len(pre.local_hashes))]
            if pre.taints
            else [None] * len(pre.local_hashes)
        )
        self.cache.insert(pre.local_hashes, blocks)
        self.metrics.gauge(self.metrics.kv_usage, self.cache.usage())
        if self.shared:
            chunk, count = self.config.chunk_size, pre.prompt_tokens // self.config.chunk_size
            chunks = (
                [_taint_from(pre.taints, j * chunk, (j + 1) * chunk) for j in range(count)]
                if pre.taints
                else [None] * count
            )
            self.tier.store(self.config.model_name, req.token_ids, req.cache_salt, chunks, req.prompt_text)

    def count_prefill(self, pre: Prefill, ttft_s: float) -> None:
        """Prompt-token counters, recorded when the first token is out."""
        m = self.metrics
        computed = pre.prompt_tokens - pre.cached
        m.add(m.prompt_tokens, pre.prompt_tokens)
        m.add(m.cached_tokens, pre.cached)
        m.add(m.by_source, computed, source="local_compute")
        m.add(m.by_source, pre.local_hits, source="local_cache_hit")
        m.add(m.by_source, pre.external_hits, source="external_kv_transfer")
        m.observe(m.ttft, ttft_s)

    def count_finish(self, output_tokens: int, reason: str | None, e2e_s: float) -> None:
        """Generation counter always; success only for a request that finished."""
        m = self.metrics
        m.add(m.generation_tokens, output_tokens)
        if reason is not None:
            m.add(m.success, 1, finished_reason=reason)
            m.observe(m.e2e, e2e_s)
        self.finished += 1
