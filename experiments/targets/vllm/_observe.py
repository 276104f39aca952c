"""What a running vLLM replica says about itself over HTTP.

``/version``, ``/server_info`` (served only in vLLM's development mode), ``/v1/models``,
and from ``/metrics`` the ``vllm:cache_config_info``
labels (block size, cache dtype, prefix caching, KV cache size) plus the whole
metrics snapshot. Used to confirm a managed launch (the engine version the
config digest named is the one serving) and, in attach mode, as all there is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from collectors import MetricsError, parse_exposition
from collectors._secrets import redact_tree

__all__ = ["Observed", "cache_config", "observe", "observed_config"]

_CACHE_INFO = "vllm:cache_config_info"
# Labels of cache_config_info that decide what the cache holds (not sizes that vary by host).
_CACHE_KEYS = (
    "block_size",
    "cache_dtype",
    "enable_prefix_caching",
    "prefix_caching_hash_algo",
    "sliding_window",
    "kv_sharing_fast_prefill",
)


def _labels(key: str) -> dict[str, str]:
    """``name{a="1",b="x"}`` → {"a": "1", "b": "x"} (values have no commas or quotes here)."""
    inner = key[key.find("{") + 1 : key.rfind("}")] if "{" in key else ""
    out = {}
    for part in inner.split('",'):
        name, _, value = part.partition("=")
        if name:
            out[name.strip()] = value.strip().strip('"')
    return out


def cache_config(samples: dict[str, float]) -> dict[str, str] | None:
    """The ``vllm:cache_config_info`` labels, or None when the replica does not export it."""
    for key in samples:
        if key.startswith(_CACHE_INFO + "{"):
            return _labels(key)
    return None


@dataclass(frozen=True)
class Observed:
    """One replica's self-description."""

    endpoint: str
    health: int | None
    version: str | None
    models: list[dict[str, Any]]
    cache_config: dict[str, str] | None
    metrics: dict[str, float]
    has_external_metrics: bool
    server_info: dict[str, Any] | None = None
    server_info_status: int | None = None  # 404 where the replica does not serve it

    @property
    def served_names(self) -> list[str]:
        return [str(m.get("id")) for m in self.models]

    @property
    def model_root(self) -> str | None:
        return str(self.models[0].get("root")) if self.models else None

    @property
    def max_model_len(self) -> int | None:
        value = self.models[0].get("max_model_len") if self.models else None
        return int(value) if value is not None else None


def _get(client: httpx.Client, url: str) -> httpx.Response | None:
    try:
        return client.get(url, timeout=10.0)
    except httpx.HTTPError:
        return None


def _json(resp: httpx.Response | None) -> dict[str, Any]:
    """The JSON object of a 200 answer, else {} (a dead or odd endpoint is no crash)."""
    if resp is None or resp.status_code != 200:
        return {}
    try:
        data = resp.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def observe(client: httpx.Client, endpoint: str) -> Observed:
    """Probe one replica (never raises for a dead one: fields stay empty)."""
    health = _get(client, endpoint + "/health")
    version = _get(client, endpoint + "/version")
    server_info = _get(client, endpoint + "/server_info")
    models = _get(client, endpoint + "/v1/models")
    metrics = _get(client, endpoint + "/metrics")
    samples: dict[str, float] = {}
    if metrics is not None and metrics.status_code == 200:
        try:
            samples = parse_exposition(metrics.text)
        except MetricsError:
            samples = {}
    return Observed(
        endpoint=endpoint,
        health=health.status_code if health is not None else None,
        version=str(_json(version).get("version")) if _json(version) else None,
        models=list(_json(models).get("data", [])),
        cache_config=cache_config(samples),
        metrics=samples,
        has_external_metrics=any(k.startswith("vllm:external_prefix_cache_hits") for k in samples),
        server_info=redact_tree(_json(server_info)) or None,
        server_info_status=server_info.status_code if server_info is not None else None,
    )


def observed_config(obs: Observed) -> dict[str, Any]:
    """The correctness-relevant part of what an attached replica shows (for its digest)."""
    cc = obs.cache_config or {}
    return {
        "engine_version": obs.version,
        "served_names": obs.served_names,
        "model_root": obs.model_root,
        "max_model_len": obs.max_model_len,
        "cache_config": {k: cc.get(k) for k in _CACHE_KEYS},
        "kv_connector_metrics": obs.has_external_metrics,
    }
