"""The two LMCache generations the vllm target speaks, chosen by the installed LMCache version.

- ``mp`` (LMCache 0.5.3 and later: 0.5.6 in the CPU engines, 0.5.3 in the GPU
  bundle): a multiprocess service (``python -m lmcache.v1.multiprocess.server``,
  its Prometheus counters served on a port of their own) that every ON replica
  reaches through vLLM's ``LMCacheMPConnector``. Its L1 allocator is lazy
  unless ``--no-l1-use-lazy`` (the mixed allocator) is given.
- ``remote`` (earlier releases, or ``lmcache_mode=remote``):
  ``LMCacheConnectorV1`` inside each replica, configured by ``LMCACHE_*``
  variables, sharing through an ``lm://`` server (``python -m
  lmcache.v1.server HOST PORT``, a bare TCP server). Its local CPU backend's
  allocator is chosen by ``enable_lazy_memory_allocator``
  (``LMCACHE_ENABLE_LAZY_MEMORY_ALLOCATOR``); in 0.5.3 a lazy request falls
  back to ``MixedMemoryAllocator`` with a warning
  (``lmcache/v1/storage_backend/local_cpu_backend.py``), so the mixed one is
  in use either way.

Why ``mp`` from 0.5.3: on two H200s with vLLM 0.26, LMCache 0.5.3's in-process
connector loaded KV that changed the answers (vLLM 0.26 packs K and V into one
page; that connector copies the older layout) and keyed chunks without vLLM's
``cache_salt``, with every hit counter exact. The same release's multiprocess
service, same model and shape, passed every check (``tests/data/gpu`` against
``tests/data/gpu-mp``, docs/gpu-study.md). ``remote`` stays to reproduce that.

Replicas hash token chunks with Python's ``hash`` unless told otherwise: each
replica of an ON block needs the same ``PYTHONHASHSEED`` or they share
nothing, silently. The seed is set by the target and recorded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..._params import ParamError
from . import _argv_templates as cmds

__all__ = ["MODES", "MP_SINCE", "Generation", "choose_mode", "version_tuple"]

MODES = ("mp", "remote")
MP_SINCE = (0, 5, 3)
"""The first LMCache release the target drives through the multiprocess service."""
REMOTE_CONNECTOR = "LMCacheConnectorV1"
ALLOCATORS = ("mixed", "lazy")


def version_tuple(version: str) -> tuple[int, ...]:
    """``0.5.3`` → (0, 5, 3); ``0.5.6.dev1+g12`` → (0, 5, 6)."""
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def choose_mode(version: str | None, forced: str | None = None) -> str:
    """``forced`` when given, else by version: ``mp`` from :data:`MP_SINCE`, ``remote`` before."""
    if forced is not None:
        if forced not in MODES:
            raise ParamError(f"lmcache_mode must be one of {list(MODES)} or null, got {forced!r}")
        return forced
    if version is None:
        return "mp"
    return "mp" if version_tuple(version) >= MP_SINCE else "remote"


@dataclass(frozen=True)
class Generation:
    """How ON blocks share KV cache: connector, server, variables and allocator."""

    mode: str
    version: str | None
    chunk_size: int
    cpu_gb: float
    allocator: str | None  # requested: "mixed", "lazy" or None (LMCache's default)

    def __post_init__(self) -> None:
        if self.allocator not in (None, *ALLOCATORS):
            raise ParamError(
                f"lmcache_allocator must be one of {list(ALLOCATORS)} or null, got {self.allocator!r}"
            )

    @property
    def connector(self) -> str:
        return cmds.CONNECTOR if self.mode == "mp" else REMOTE_CONNECTOR

    def connector_config(self, host: str, port: int | None) -> dict[str, Any]:
        """The ``--kv-transfer-config`` of an ON replica (``port`` None: for the config digest)."""
        if self.mode == "mp":
            if port is None:  # the digest's form: the service's port changes every block
                return {"kv_connector": cmds.CONNECTOR, "kv_role": "kv_both"}
            return cmds.kv_transfer_config(host, port)
        return {"kv_connector": REMOTE_CONNECTOR, "kv_role": "kv_both"}

    def replica_env(self, host: str, port: int | None) -> dict[str, str]:
        """``LMCACHE_*`` of an ON replica in remote mode (the server's port in the URL); {} for mp."""
        if self.mode == "mp":
            return {}
        env = {
            "LMCACHE_CHUNK_SIZE": str(self.chunk_size),
            "LMCACHE_LOCAL_CPU": "True",
            "LMCACHE_MAX_LOCAL_CPU_SIZE": _number(self.cpu_gb),
            # Without a port in the digest's form: the server's port changes every block.
            "LMCACHE_REMOTE_URL": f"lm://{host}" + (f":{port}" if port is not None else ""),
            "LMCACHE_REMOTE_SERDE": "naive",
        }
        if self.allocator is not None:
            env["LMCACHE_ENABLE_LAZY_MEMORY_ALLOCATOR"] = "True" if self.allocator == "lazy" else "False"
        return env

    def service_argv(self, template: list[str] | None, values: Mapping[str, Any]) -> list[str]:
        """The LMCache server of an ON block, rendered (``template`` overrides the default)."""
        if template is not None:
            return cmds.render(template, values)
        if self.mode == "remote":
            return cmds.render(cmds.REMOTE_SERVER_TEMPLATE, values)
        argv = cmds.render(cmds.SERVICE_TEMPLATE, values)
        if self.allocator is not None:
            argv.append("--no-l1-use-lazy" if self.allocator == "mixed" else "--l1-use-lazy")
        return argv

    @property
    def serves_metrics(self) -> bool:
        """The server's own Prometheus counters are served (``--prometheus-port``): the
        multiprocess service's lookups by ``cache_salt``; the bare ``lm://`` server has none."""
        return self.mode == "mp"

    def allocator_record(self) -> dict[str, Any]:
        """The allocator asked for and the one in use, from the configuration given to LMCache."""
        if self.mode == "mp":
            flag = {None: None, "mixed": "--no-l1-use-lazy", "lazy": "--l1-use-lazy"}[self.allocator]
            in_use = "mixed" if self.allocator == "mixed" else "lazy"  # the service's default is lazy
            return {
                "requested": self.allocator,
                "in_use": in_use,
                "config": {"l1_use_lazy_flag": flag},
                "where": "lmcache server (L1)",
            }
        lazy = {None: None, "mixed": "False", "lazy": "True"}[self.allocator]
        return {
            "requested": self.allocator,
            "in_use": "mixed",
            "config": {"LMCACHE_ENABLE_LAZY_MEMORY_ALLOCATOR": lazy},
            "where": "each replica's local CPU backend (a lazy request falls back to mixed)",
        }

    def config(self, host: str) -> dict[str, Any]:
        """What decides sharing, without ports (the config digest's part)."""
        return {
            "mode": self.mode,
            "version": self.version,
            "connector": self.connector_config(host, None),
            "env": self.replica_env(host, None),
            "chunk_size": self.chunk_size,
            "allocator": self.allocator_record(),
        }


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
