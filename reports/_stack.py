"""The stack guard: which metric names each engine version exposes, and stacks known to be bad.

:data:`METRIC_REGISTRY` names, per vLLM version range, the counters a hit delta
is computed from and the other series the report reads. The names were read
from recorded scrapes (vLLM 0.26.0 with LMCache 0.5.3 on an H200, vLLM 0.32.0
with LMCache 0.5.6 on CPU, the sim's 0.33.0 surface), not from documentation.
A hit counter the registry requires that a window's scrapes lack is recorded
as null, and every table reads null as zero, so the audit blocks it
(``metrics-missing``) instead. :data:`KNOWN_INCOMPATIBLE` lists engine and
LMCache version pairs whose KV layouts disagree; an ON configuration launched
on one is blocked (``known-incompatible-stack``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KNOWN_INCOMPATIBLE",
    "METRIC_REGISTRY",
    "Incompatible",
    "MetricNames",
    "incompatible",
    "names_for",
    "registry_table",
    "version_key",
]


@dataclass(frozen=True)
class MetricNames:
    """The series one engine exposes from version ``since`` (inclusive) up to ``until`` (exclusive)."""

    engine: str
    since: tuple[int, ...]
    until: tuple[int, ...] | None
    series: dict[str, str]
    """Logical name → exposition name (counters with their ``_total`` sample suffix)."""
    required: frozenset[str]
    """Logical names of the counters a hit delta needs, on every block (the recorded scrapes show
    the connector's counters on OFF blocks too, at zero)."""


_VLLM_V1 = {
    "prefix_queries": "vllm:prefix_cache_queries_total",
    "local_hit_tokens": "vllm:prefix_cache_hits_total",
    "external_queries": "vllm:external_prefix_cache_queries_total",
    "external_hit_tokens": "vllm:external_prefix_cache_hits_total",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
    "cache_config": "vllm:cache_config_info",
    "prompt_tokens_by_source": "vllm:prompt_tokens_by_source_total",
}
_HITS = frozenset({"prefix_queries", "local_hit_tokens", "external_hit_tokens"})

METRIC_REGISTRY: tuple[MetricNames, ...] = (
    # Seen on vLLM 0.26.0 (GPU) and up.
    MetricNames("vllm", (0, 26), (0, 32), dict(_VLLM_V1), _HITS),
    # vLLM 0.32.0 (seen on the CPU engines) adds the cached tokens by source (local, connector),
    # which vLLM 0.33 keeps: vllm:prompt_tokens_cached_by_source{source}.
    MetricNames(
        "vllm",
        (0, 32),
        None,
        {**_VLLM_V1, "prompt_tokens_cached_by_source": "vllm:prompt_tokens_cached_by_source_total"},
        _HITS,
    ),
)


@dataclass(frozen=True)
class Incompatible:
    """An engine and LMCache version pair known to produce wrong KV state together."""

    engine: str
    engine_versions: str
    """A version prefix (``0.26``: every 0.26.x)."""
    lmcache_versions: str
    reason: str


KNOWN_INCOMPATIBLE: tuple[Incompatible, ...] = (
    Incompatible(
        "vllm",
        "0.26",
        "0.5.2",
        "LMCache 0.5.2 stores KV in a packed layout that vLLM 0.26's connector reads as its own paged "
        "layout: offloaded prefixes come back as wrong state (wrong answers with HTTP 200 and rising hits)",
    ),
)


def version_key(version: str | None) -> tuple[int, ...] | None:
    """``0.26.0+cu129`` → (0, 26, 0); None when there is no leading number."""
    if not version:
        return None
    numbers = re.findall(r"\d+", str(version).split("+")[0])
    return tuple(int(n) for n in numbers[:3]) if numbers else None


def names_for(engine: str, version: str | None) -> MetricNames | None:
    """The registry entry of ``engine`` at ``version`` (None: not in the registry)."""
    key = version_key(version)
    if key is None:
        return None
    for entry in METRIC_REGISTRY:
        if entry.engine == engine and entry.since <= key and (entry.until is None or key < entry.until):
            return entry
    return None


def _matches(prefix: str, version: str | None) -> bool:
    if not version:
        return False
    public = str(version).split("+")[0]
    return public == prefix or public.startswith(prefix + ".")


def incompatible(engine: str, engine_version: str | None, lmcache_version: str | None) -> Incompatible | None:
    """The known-bad entry a launched pair matches, if any."""
    for bad in KNOWN_INCOMPATIBLE:
        if (
            bad.engine == engine
            and _matches(bad.engine_versions, engine_version)
            and _matches(bad.lmcache_versions, lmcache_version)
        ):
            return bad
    return None


def registry_table() -> list[dict[str, Any]]:
    """The registry as rows (for documentation and tests)."""
    return [
        {
            "engine": e.engine,
            "since": ".".join(map(str, e.since)),
            "until": None if e.until is None else ".".join(map(str, e.until)),
            "series": dict(e.series),
            "required": sorted(e.required),
        }
        for e in METRIC_REGISTRY
    ]
