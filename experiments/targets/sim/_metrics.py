"""Prometheus metrics with vLLM's and LMCache's names, one registry each.

A fresh registry per replica (and per restart) is what makes a restart look
like a fresh process: every counter starts again at zero.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["TTFT_BUCKETS", "ReplicaMetrics", "TierMetrics"]

# vLLM's buckets for vllm:time_to_first_token_seconds.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_LABELS = ("model_name", "engine")
_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


class ReplicaMetrics:
    """One replica's vLLM metrics; ``frozen`` stops the counters (stale-counters)."""

    def __init__(self, model_name: str, cache_info: Mapping[str, str], engine: str = "0") -> None:
        self.registry = CollectorRegistry()
        self.frozen = False
        self._labels = {"model_name": model_name, "engine": engine}
        r = self.registry

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, _LABELS, registry=r)

        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, tokens.")
        self.ext_queries = counter(
            "vllm:external_prefix_cache_queries", "KV connector prefix cache queries, tokens."
        )
        self.ext_hits = counter("vllm:external_prefix_cache_hits", "KV connector prefix cache hits, tokens.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generation tokens.")
        self.cached_tokens = counter(
            "vllm:prompt_tokens_cached", "Prompt tokens served from cache (local + external)."
        )
        self.preemptions = counter("vllm:num_preemptions", "Cumulative preemptions.")
        self.by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Prompt tokens by source.",
            (*_LABELS, "source"),
            registry=r,
        )
        self.success = Counter(
            "vllm:request_success",
            "Successfully finished requests.",
            (*_LABELS, "finished_reason"),
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token, seconds.",
            _LABELS,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency, seconds.",
            _LABELS,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.running = Gauge("vllm:num_requests_running", "Requests running.", _LABELS, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting.", _LABELS, registry=r)
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV cache usage, 1 means 100 percent.", _LABELS, registry=r
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the cache config.",
            (*cache_info, "engine"),
            registry=r,
        )
        info.labels(**cache_info, engine=engine).set(1)
        # Materialise every labelled series at zero, as vLLM does at start-up.
        for c in (
            self.prefix_queries,
            self.prefix_hits,
            self.ext_queries,
            self.ext_hits,
            self.prompt_tokens,
            self.generation_tokens,
            self.cached_tokens,
            self.preemptions,
        ):
            c.labels(**self._labels)
        for source in _SOURCES:
            self.by_source.labels(**self._labels, source=source)
        for reason in ("stop", "length", "abort"):
            self.success.labels(**self._labels, finished_reason=reason)
        for g in (self.running, self.waiting, self.kv_usage):
            g.labels(**self._labels).set(0)

    def add(self, counter: Counter, amount: float, **extra: str) -> None:
        """Increment unless frozen; zero increments are skipped."""
        if not self.frozen and amount:
            counter.labels(**self._labels, **extra).inc(amount)

    def observe(self, histogram: Histogram, seconds: float) -> None:
        if not self.frozen:
            histogram.labels(**self._labels).observe(seconds)

    def gauge(self, gauge: Gauge, value: float) -> None:
        gauge.labels(**self._labels).set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class TierMetrics:
    """The LMCache service's lookup counters, labelled by model and salt."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.frozen = False
        labels = ("model_name", "cache_salt")
        self.requested = Counter(
            "lmcache_mp_lookup_requested_tokens",
            "Tokens asked for by lookups.",
            labels,
            registry=self.registry,
        )
        self.hit = Counter(
            "lmcache_mp_lookup_hit_tokens",
            "Tokens found by lookups.",
            labels,
            registry=self.registry,
        )
        # The sim's own name (LMCache exposes no stored-object count under a name recorded so far).
        self.stored = Gauge("sim_lmcache_stored_chunks", "Chunks stored in the tier.", registry=self.registry)

    def record_lookup(self, model_name: str, salt: str | None, requested: int, hit: int) -> None:
        if self.frozen:
            return
        # Unsalted requests are labelled with the empty salt.
        labels = {"model_name": model_name, "cache_salt": salt or ""}
        self.requested.labels(**labels).inc(requested)
        self.hit.labels(**labels).inc(hit)

    def render(self) -> bytes:
        return generate_latest(self.registry)
