"""The ``vllm`` target: the hook ``experiments/targets/_registry.py`` imports.

- ``PARAMS``: the target's options (``--param``), with defaults (``_settings``).
- ``check_params(params)``: refuses bad options before anything is written
  (:class:`ParamError`, exit status 2).
- ``make_target(params)``: a managed :class:`VllmTarget` (launches replicas and,
  for ON blocks, the LMCache service; restarted every block), or, with
  ``attach=URL1,URL2[,service=URL]``, an :class:`AttachedTarget` that records
  what endpoints someone else started say about themselves and never restarts
  them.

Attach mode: ``/version``, ``/v1/models``, ``vllm:cache_config_info`` and the
whole ``/metrics`` snapshot are recorded in ``deployment.launched`` with
``attached: true`` and ``restarted: false``; the config digest is computed
from that observed configuration. Blocks are marked ``restarted: false`` in
``block.started``: caches are *not* fresh, so a second block's cold steps see
the first block's prefixes and the audit reports them (``namespace-leak``);
attach mode suits single-block runs (``validation``) or a deployment the
researcher restarts by hand between runs. The arm of a block is a label the
researcher vouches for (an attached deployment cannot be switched ON/OFF).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from collectors import gpu_inventory
from collectors._checkpoint import audit_checkpoint
from experiments import needle
from ledger import canonical_json, sha256_hex

from ..._params import ParamError
from .._base import Launch, LaunchRecord, Replica, Target, TargetError
from ._managed import VllmTarget, gpu_facts
from ._observe import Observed, observe, observed_config
from ._resolve import TINY, resolve
from ._settings import PARAMS, Settings, check, parse_hash_seed

__all__ = ["PARAMS", "AttachedTarget", "VllmTarget", "check_params", "make_target"]


def check_params(params: dict[str, Any]) -> None:
    """Refuse bad vllm options before anything is written (ParamError → exit 2)."""
    check(params)
    model = params.get("model")
    names = (TINY, *(c.name for c in needle.COMMITTED))
    if (
        model is not None
        and model not in names
        and not Path(str(model)).expanduser().is_dir()
        and params.get("attach") is None
    ):
        raise ParamError(f"model: not a directory (nor one of {', '.join(names)}): {model}")
    for name in ("vllm_python", "lmcache_python"):
        value = params.get(name)
        if value is not None and not Path(str(value)).expanduser().exists():
            raise ParamError(f"{name}: not found: {value}")


def make_target(params: Mapping[str, Any]) -> Target:
    """The managed target, or the attached one when ``attach`` is given."""
    settings = Settings(dict(params))
    if settings.attach_urls is not None:
        return AttachedTarget(settings)
    return VllmTarget(settings, resolve(settings))


class AttachedTarget:
    """Endpoints someone else started: observed and recorded, never (re)started or stopped."""

    name = "vllm"
    restarts_blocks = False
    warmup_every_replica = True
    health_settle_s = 1.0

    def __init__(self, settings: Settings) -> None:
        attach = settings.attach_urls
        assert attach is not None
        self.s = settings
        self.urls, self.service_url, self.service_metrics = attach
        with httpx.Client() as client:
            self.observed = [observe(client, url) for url in self.urls]
            self.service = self._observe_service(client)
        dead = [o.endpoint for o in self.observed if o.health != 200]
        if dead:
            raise TargetError(f"attached endpoint(s) not healthy: {', '.join(dead)}")
        self._client = httpx.AsyncClient(timeout=10.0)
        gpus = settings.gpu_list
        local = gpu_inventory()
        facts = gpu_facts(gpus or (), local)
        self.gpus: list[dict[str, Any] | None] = [facts[g] for g in gpus] if gpus else []
        loopback = all(urlsplit(u).hostname in ("127.0.0.1", "localhost", "::1") for u in self.urls)
        # Unknown hosts count as GPU paths: the audit then asks for the stricter validation layers.
        self.transfer_path = "cpu" if loopback and not gpus and not local else "gpu"

    def _observe_service(self, client: httpx.Client) -> dict[str, Any] | None:
        if self.service_url is None:
            return None
        out: dict[str, Any] = {"endpoint": self.service_url}
        for path in ("/healthcheck", "/status"):
            try:
                resp = client.get(self.service_url + path, timeout=10.0)
                try:
                    body: Any = resp.json()
                except ValueError:
                    body = resp.text[:2000]
                out[path.strip("/")] = {"status": resp.status_code, "body": body}
            except httpx.HTTPError as exc:
                out[path.strip("/")] = {"status": None, "error": str(exc)[:200]}
        return out

    # --- what the runner records -----------------------------------------------

    def service_config(self) -> dict[str, Any] | None:
        """The stable, correctness-relevant part of the service's ``/status`` (not its counters)."""
        if self.service is None:
            return None
        status = self.service.get("status", {}).get("body")
        if not isinstance(status, dict):
            status = {}
        storage = status.get("storage_manager") or {}
        l1 = ((storage.get("l1_managers") or {}).get("_default") or {}) if isinstance(storage, dict) else {}
        evict = (
            ((storage.get("l1_eviction_controllers") or {}).get("_default") or {})
            if isinstance(storage, dict)
            else {}
        )
        return {
            "engine_type": status.get("engine_type"),
            "chunk_size": status.get("chunk_size"),
            "hash_algorithm": status.get("hash_algorithm"),
            "l1_bytes": l1.get("memory_configured_bytes"),
            "eviction_policy": evict.get("eviction_policy"),
        }

    @property
    def chunk_size(self) -> int:
        """The service's own chunk when it says (``/status``), else the ``chunk_size`` param."""
        observed = (self.service_config() or {}).get("chunk_size")
        return int(observed) if isinstance(observed, int) and observed > 0 else int(self.s.chunk_size)

    @property
    def hash_seed(self) -> int | None:
        """The PYTHONHASHSEED the researcher says the replicas run with (None: not known)."""
        seed = parse_hash_seed(self.s.hash_seed)
        return None if seed is None or seed == "unset" else int(seed)

    @property
    def model_name(self) -> str:
        names = self.observed[0].served_names
        given = self.s.served_name
        if given is not None and (given in names or not names):
            return str(given)
        return names[0] if names else "tiny"

    @property
    def answers_meaningful(self) -> bool:
        given = self.s.answers_meaningful
        return True if given is None else bool(given)

    @property
    def _card(self) -> needle.Card | None:
        """The needle model's card, when the endpoints serve the committed checkpoint."""
        directory = self._checkpoint_dir()
        kept = needle.committed(directory) if directory is not None else None
        return kept.load_card() if kept is not None else None

    @property
    def meaningful_up_to_tokens(self) -> int | None:
        card = self._card
        return card.served_max_tokens if card is not None and self.s.answers_meaningful is None else None

    @property
    def model_card(self) -> dict[str, Any] | None:
        card = self._card
        return card.summary() if card is not None else None

    def config(self, arm: str) -> dict[str, Any]:
        """The observed configuration: what the endpoints said, no ports or pids."""
        return {
            "target": "vllm",
            "mode": "attach",
            "arm": arm,
            "chunk_size": self.chunk_size,
            "transfer_path": self.transfer_path,
            "replicas": [observed_config(o) for o in self.observed],
            "service": self.service_config() if arm == "ON" else None,
            "hash_seed": self.hash_seed,
        }

    def config_sha256(self, arm: str) -> str:
        return sha256_hex(canonical_json(self.config(arm)))

    def describe(self) -> dict[str, Any]:
        return {
            "mode": "attach",
            "endpoints": list(self.urls),
            "service": self.service_url,
            "engine_version": self.observed[0].version,
            "answers_meaningful": self.answers_meaningful,
            "restarts_blocks": False,
        }

    def _checkpoint_dir(self) -> Path | None:
        """The model directory to audit: the ``model`` param, else the served root if it is local."""
        for candidate in (self.s.model, self.observed[0].model_root):
            if candidate and Path(str(candidate)).expanduser().is_dir():
                return Path(str(candidate)).expanduser()
        return None

    async def prepare_run(self, run_id: str) -> tuple[LaunchRecord, ...]:
        """Record the checkpoint when it can be read from here (else the audit says it is missing)."""
        directory = self._checkpoint_dir()
        if directory is None:
            return ()
        manifest = Path(self.s.manifest).expanduser() if self.s.manifest else None
        kept = needle.committed(directory)
        if manifest is None and kept is not None:
            manifest = kept.manifest
        audit = await asyncio.to_thread(audit_checkpoint, directory, self.s.revision, manifest)
        return (LaunchRecord("checkpoint.audited", audit.data()),)

    # --- life cycle: observe, never restart ------------------------------------------

    async def start(self, *, arm: str, gpus: Sequence[int]) -> Launch:
        if arm not in ("ON", "OFF"):
            raise ValueError(f"arm must be ON or OFF, got {arm!r}")
        with httpx.Client() as client:
            now = await asyncio.to_thread(lambda: [observe(client, u) for u in self.urls])
        dead = [o.endpoint for o in now if o.health != 200]
        if dead:
            raise TargetError(f"attached endpoint(s) not healthy: {', '.join(dead)}")
        # The block's config and digest, once: every record of the block carries the same ones.
        config = self.config(arm)
        digest = sha256_hex(canonical_json(config))
        replicas = tuple(Replica(i, o.endpoint, self._gpu(i)) for i, o in enumerate(now))
        records = [
            LaunchRecord("deployment.launched", self._replica_data(i, o, arm, config, digest))
            for i, o in enumerate(now)
        ]
        if arm == "ON" and self.service is not None:
            records.append(
                LaunchRecord(
                    "service.launched",
                    {
                        "service": "lmcache",
                        "endpoint": self.service_url,
                        "metrics_endpoint": self.service_metrics,
                        "command": None,
                        "env": {},
                        "version": None,
                        "pool_bytes": None,
                        "pinned": None,
                        "config_sha256": digest,
                        "target": "vllm",
                        "attached": True,
                        "restarted": False,
                        "observed": self.service,
                        "service_config": self.service_config(),
                        "chunk_size": self.chunk_size,
                    },
                )
            )
        tier = self.service_metrics if arm == "ON" else None  # an OFF block shares through nothing
        return Launch(replicas, digest, tuple(records), tier_metrics=tier)

    def _gpu(self, i: int) -> dict[str, Any] | None:
        return self.gpus[i] if i < len(self.gpus) else None

    def _replica_data(
        self, i: int, o: Observed, arm: str, config: dict[str, Any], digest: str
    ) -> dict[str, Any]:
        return {
            "replica": i,
            "gpu": self._gpu(i),
            "endpoint": o.endpoint,
            "engine": "vllm",
            "engine_version": o.version,
            "server_info": o.server_info,
            "server_info_status": o.server_info_status,
            "command": None,
            "env": {},
            "model": {"path": o.model_root, "served_name": self.model_name, "revision": self.s.revision},
            "config_sha256": digest,
            "kv_connector": None,
            "target": "vllm",
            "hash_seed": self.hash_seed,
            "transfer_path": self.transfer_path,
            "arm": arm,
            "attached": True,
            "restarted": False,
            "config": config,
            "observed_config": observed_config(o),
            "models": o.models,
            "cache_config": o.cache_config,
            "metrics": o.metrics,
            "has_external_metrics": o.has_external_metrics,
        }

    async def stop(self) -> tuple[LaunchRecord, ...]:
        records = []
        for i, url in enumerate(self.urls):
            try:
                health: int | None = (await self._client.get(url + "/health")).status_code
            except httpx.HTTPError:
                health = None
            records.append(
                LaunchRecord(
                    "deployment.stopped",
                    {
                        "replica": i,
                        "endpoint": url,
                        "attached": True,
                        "stopped": False,
                        "health_at_stop": health,
                    },
                )
            )
        return tuple(records)

    async def healthy(self, replica: int) -> bool:
        try:
            return (await self._client.get(self.urls[replica] + "/health")).status_code == 200
        except (httpx.HTTPError, IndexError):
            return False

    async def close(self) -> None:
        await self._client.aclose()

    def endpoint(self, replica: int) -> str:
        return self.urls[replica]
