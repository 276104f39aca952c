"""Prometheus scrapes, their events, and the hit-counter deltas derived from them.

Samples are keyed ``name{k="v",...}`` (labels sorted; a bare ``name`` when
there are none) by the *sample* name: prometheus_client's parser strips
``_total`` from a counter's family name, but its samples keep it, so the
keys read exactly as the exposition text (``vllm:prefix_cache_hits_total``).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ._client import DEFAULT_TIMEOUT_S, DEFAULT_TTFT_METHOD, EventSink, Outcome, RequestSpec, send_request

__all__ = [
    "EXTERNAL_HITS",
    "EXTERNAL_QUERIES",
    "LMCACHE_HIT",
    "LMCACHE_REQUESTED",
    "PREFIX_HITS",
    "PREFIX_QUERIES",
    "HitDelta",
    "MetricsError",
    "Scraper",
    "counter_delta",
    "hits_between",
    "parse_exposition",
    "record_hits",
    "record_scrape",
    "sample_key",
    "scrape_metrics",
]

PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
LMCACHE_REQUESTED = "lmcache_mp_lookup_requested_tokens_total"
LMCACHE_HIT = "lmcache_mp_lookup_hit_tokens_total"
_LMCACHE_COUNTERS = (LMCACHE_REQUESTED, LMCACHE_HIT)


class MetricsError(Exception):
    """A scrape failed (HTTP, network, or unparsable exposition text)."""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def sample_key(name: str, labels: Mapping[str, str]) -> str:
    """``name{k="v",...}`` with labels sorted, or ``name`` without labels."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{_escape(labels[k])}"' for k in sorted(labels))
    return f"{name}{{{inner}}}"


def parse_exposition(text: str) -> dict[str, float]:
    """Samples of a Prometheus text exposition, keyed by :func:`sample_key`.

    Parsed by prometheus_client, one metric family at a time, each family's
    text memoised: between two scrapes most families (histogram buckets,
    info metrics, counters of idle replicas) are unchanged, and the parser,
    pure Python, costs tens of milliseconds per scrape of a vLLM replica.
    """
    samples: dict[str, float] = {}
    try:
        for block in _family_blocks(text):
            samples.update(_parse_block(block))
    except ValueError as exc:
        raise MetricsError(f"unparsable metrics: {exc}") from exc
    return samples


def _family_blocks(text: str) -> list[str]:
    """The exposition cut before each family's ``# HELP`` (or a ``# TYPE`` without one)."""
    blocks: list[str] = []
    lines = text.splitlines(keepends=True)
    start, prev = 0, ""
    for i, line in enumerate(lines):
        starts = line.startswith("# HELP ") or (line.startswith("# TYPE ") and not prev.startswith("# HELP "))
        if starts and i > start:
            blocks.append("".join(lines[start:i]))
            start = i
        prev = line
    blocks.append("".join(lines[start:]))
    return blocks


@lru_cache(maxsize=4096)
def _parse_block(block: str) -> dict[str, float]:
    # Shared between calls: parse_exposition only reads it (update into a fresh dict).
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(block):
        for s in family.samples:
            out[sample_key(s.name, s.labels)] = float(s.value)
    return out


async def scrape_metrics(
    client: httpx.AsyncClient, base_url: str, timeout_s: float = 10.0
) -> dict[str, float]:
    """GET ``base_url/metrics`` and parse it; raises :class:`MetricsError`."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        resp = await client.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise MetricsError(f"scrape of {url} failed: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        raise MetricsError(f"scrape of {url}: http {resp.status_code}")
    return parse_exposition(resp.text)


def _json_value(value: float) -> float | str:
    # Canonical JSON has no NaN/Infinity: keep them as Prometheus spells them.
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def record_scrape(
    sink: EventSink,
    replica: int | str,
    endpoint: str,
    samples: Mapping[str, float],
    phase: str,
    request_id: str | None = None,
    window: str | None = None,
    error: str | None = None,
) -> None:
    """Emit ``metrics.scraped`` (non-finite values are stored as strings)."""
    sink.emit(
        "metrics.scraped",
        {
            "replica": replica,
            "endpoint": endpoint,
            "phase": phase,
            "request_id": request_id,
            "window": window,
            "samples": {k: _json_value(v) for k, v in samples.items()},
            "error": error,
        },
    )


def _series(samples: Mapping[str, float], name: str) -> dict[str, float]:
    prefix = name + "{"
    return {k: v for k, v in samples.items() if k == name or k.startswith(prefix)}


def counter_delta(
    before: Mapping[str, float], after: Mapping[str, float], name: str
) -> tuple[int | None, bool]:
    """Increase of counter ``name`` summed over its label sets, and whether one reset.

    None when neither scrape has the counter. A series that went down (the
    process restarted) counts its ``after`` value, as PromQL's ``increase``
    does, and the reset is reported. A series that appears only after counts
    from zero (vLLM materialises its series at start, LMCache on first use).
    """
    b, a = _series(before, name), _series(after, name)
    if not b and not a:
        return None, False
    total, reset = 0.0, False
    for key, value in a.items():
        start = b.get(key, 0.0)
        if value < start:
            reset = True
            total += value
        else:
            total += value - start
    reset = reset or any(key not in a for key in b)
    return round(total), reset


@dataclass(frozen=True)
class HitDelta:
    """Token-counter increases over one window (None: the counter was not exposed)."""

    prefix_queries: int | None
    local_hit_tokens: int | None
    external_queries: int | None
    external_hit_tokens: int | None
    lmcache_requested_tokens: int | None = None
    lmcache_hit_tokens: int | None = None
    counter_reset: bool = False
    resets: tuple[str, ...] = field(default=())

    def data(self) -> dict[str, Any]:
        d = asdict(self)
        d["resets"] = list(self.resets)
        return d


def hits_between(
    before: Mapping[str, float],
    after: Mapping[str, float],
    tier_before: Mapping[str, float] | None = None,
    tier_after: Mapping[str, float] | None = None,
) -> HitDelta:
    """vLLM (and optionally LMCache service) counter deltas between two scrapes.

    The LMCache counters are read from ``tier_*`` when given, else from the
    replica scrapes themselves (an in-process connector exposes them there).
    ``counter_reset`` is a reset of the replica's own counters (what its window's scrapes show,
    and what ``counters_match`` relies on); ``resets`` names every counter that reset, the tier's
    too.
    """
    tiered = tier_before is not None or tier_after is not None
    tb = before if tier_before is None else tier_before
    ta = after if tier_after is None else tier_after
    names = {
        "prefix_queries": (PREFIX_QUERIES, before, after),
        "local_hit_tokens": (PREFIX_HITS, before, after),
        "external_queries": (EXTERNAL_QUERIES, before, after),
        "external_hit_tokens": (EXTERNAL_HITS, before, after),
        "lmcache_requested_tokens": (LMCACHE_REQUESTED, tb, ta),
        "lmcache_hit_tokens": (LMCACHE_HIT, tb, ta),
    }
    values: dict[str, int | None] = {}
    resets: list[str] = []
    replica_reset = False
    for field_name, (metric, b, a) in names.items():
        values[field_name], reset = counter_delta(b, a, metric)
        if reset:
            resets.append(metric)
            replica_reset = replica_reset or not (tiered and metric in _LMCACHE_COUNTERS)
    return HitDelta(**values, counter_reset=replica_reset, resets=tuple(resets))


def record_hits(
    sink: EventSink,
    replica: int | str,
    delta: HitDelta,
    *,
    request_id: str | None = None,
    window: str | None = None,
    prompt_tokens: int | None = None,
) -> None:
    """Emit ``hits.observed`` for a single-request window or a concurrent window."""
    sink.emit(
        "hits.observed",
        {
            "request_id": request_id,
            "window": window,
            "replica": replica,
            "prompt_tokens": prompt_tokens,
            **delta.data(),
        },
    )


@dataclass
class _Window:
    """What a :meth:`Scraper.window` yields; ``deltas`` is filled on exit."""

    window: str
    deltas: dict[int | str, HitDelta] = field(default_factory=dict)


class Scraper:
    """Scrapes replicas (and the shared tier) around measured windows.

    Every scrape is recorded as ``metrics.scraped`` (phase ``before``/``after``);
    a failed scrape is recorded with its ``error`` and empty samples, and the
    deltas it would have fed are None. Nothing here raises for a scrape fault.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        sink: EventSink,
        tier_url: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.client = client
        self.sink = sink
        self.tier_url = tier_url
        self.timeout_s = timeout_s
        self.last_samples: tuple[dict[str, float] | None, dict[str, float] | None] = (None, None)
        """The samples before and after the last :meth:`single` window that LMCache's counters
        were read from (None: failed): the shared tier's where a tier URL is set, else the
        replica's (an in-process connector exposes them there); what a caller reads beyond the
        deltas, e.g. counters labelled by one ``cache_salt``."""

    async def scrape(
        self,
        replica: int | str,
        base_url: str,
        phase: str,
        *,
        request_id: str | None = None,
        window: str | None = None,
    ) -> dict[str, float] | None:
        """One recorded scrape; None when it failed (the failure is recorded)."""
        try:
            samples = await scrape_metrics(self.client, base_url, self.timeout_s)
        except MetricsError as exc:
            record_scrape(self.sink, replica, base_url, {}, phase, request_id, window, str(exc))
            return None
        record_scrape(self.sink, replica, base_url, samples, phase, request_id, window)
        return samples

    async def _tier(self, phase: str, request_id: str | None, window: str | None) -> dict[str, float] | None:
        if self.tier_url is None:
            return None
        return await self.scrape("tier", self.tier_url, phase, request_id=request_id, window=window)

    @staticmethod
    def _delta(
        b: dict[str, float] | None,
        a: dict[str, float] | None,
        tb: dict[str, float] | None,
        ta: dict[str, float] | None,
        use_tier: bool,
    ) -> HitDelta:
        if b is None or a is None:
            return HitDelta(None, None, None, None)
        if use_tier and (tb is None or ta is None):
            tb, ta = {}, {}
        return hits_between(b, a, tb, ta) if use_tier else hits_between(b, a)

    async def single(
        self,
        spec: RequestSpec,
        replica: int | str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        method: str = DEFAULT_TTFT_METHOD,
        send: Callable[[RequestSpec], Awaitable[Outcome]] | None = None,
    ) -> tuple[Outcome, HitDelta]:
        """Scrape, send ``spec``, scrape again; emit ``hits.observed`` with the deltas.

        Meant for single-request windows: nothing else may run against the
        replica (or the tier) meanwhile, or the deltas are not this request's.
        ``send`` sends it (a run's own sender, its connection limit and TTFT
        method); by default :func:`send_request` with ``timeout_s`` and ``method``.
        """
        rid = spec.request_id
        before = await self.scrape(replica, spec.base_url, "before", request_id=rid)
        tier_before = await self._tier("before", rid, None)
        if send is None:
            outcome = await send_request(self.client, spec, self.sink, timeout_s, method=method)
        else:
            outcome = await send(spec)
        after = await self.scrape(replica, spec.base_url, "after", request_id=rid)
        tier_after = await self._tier("after", rid, None)
        delta = self._delta(before, after, tier_before, tier_after, self.tier_url is not None)
        record_hits(self.sink, replica, delta, request_id=rid, prompt_tokens=outcome.prompt_tokens)
        self.last_samples = (tier_before, tier_after) if self.tier_url is not None else (before, after)
        return outcome, delta

    @asynccontextmanager
    async def window(self, replicas: Mapping[int | str, str], window: str) -> AsyncIterator[_Window]:
        """Scrape every replica before and after the block; one ``hits.observed`` each.

        The per-replica deltas of a concurrent window are interpreted only as
        a whole (docs/design.md). The tier's counters, when a tier URL is set, are
        attributed to every replica's event alike (they cannot be split).
        """
        state = _Window(window)
        before = {r: await self.scrape(r, url, "before", window=window) for r, url in replicas.items()}
        tier_before = await self._tier("before", None, window)
        yield state
        after = {r: await self.scrape(r, url, "after", window=window) for r, url in replicas.items()}
        tier_after = await self._tier("after", None, window)
        for r in replicas:
            d = self._delta(before[r], after[r], tier_before, tier_after, self.tier_url is not None)
            state.deltas[r] = d
            record_hits(self.sink, r, d, window=window)
