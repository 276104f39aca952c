"""Command templates for replicas and the LMCache service, and their rendering.

A template is an argv list whose items may hold ``{placeholders}``:
``{python} {model} {served_name} {host} {port} {dtype} {max_model_len}
{block_size}`` for replicas (ON blocks append ``--kv-transfer-config``), ``{python} {host} {port}
{metrics_port} {http_port} {chunk_size} {l1_size_gb}`` for the service. Items are rendered
one by one (no shell), so a path with spaces stays one argument.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..._params import ParamError

__all__ = [
    "CONNECTOR",
    "REMOTE_SERVER_TEMPLATE",
    "REPLICA_FIELDS",
    "SERVICE_FIELDS",
    "SERVICE_TEMPLATE",
    "kv_transfer_config",
    "render",
    "replica_template",
    "with_connector",
]

_REPLICA_BASE = [
    "{python}",
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "{model}",
    "--served-model-name",
    "{served_name}",
    "--host",
    "{host}",
    "--port",
    "{port}",
    "--dtype",
    "{dtype}",
    "--max-model-len",
    "{max_model_len}",
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
]

SERVICE_TEMPLATE = [
    # The cache server without its HTTP front end: that front end (``lmcache server``) turns off
    # LMCache's Prometheus server and serves no /metrics in its place (0.5.3 to 0.5.6), so the
    # service's own counters (lookups, by cache_salt) could never be recorded. Ready when its
    # port accepts (it binds once the engine is built).
    "{python}",
    "-m",
    "lmcache.v1.multiprocess.server",
    "--host",
    "{host}",
    "--port",
    "{port}",
    "--l1-size-gb",
    "{l1_size_gb}",
    "--eviction-policy",
    "LRU",
    "--chunk-size",
    "{chunk_size}",
    # Without it vLLM hangs at start-up and ignores SIGTERM.
    "--supported-transfer-mode",
    "auto",
    "--prometheus-port",
    "{metrics_port}",
]

# LMCache before 0.5.6 (remote mode): a bare TCP server holding the shared chunks.
REMOTE_SERVER_TEMPLATE = ["{python}", "-m", "lmcache.v1.server", "{host}", "{port}"]

CONNECTOR = "LMCacheMPConnector"
REPLICA_FIELDS = ("python", "model", "served_name", "host", "port", "dtype", "max_model_len", "block_size")
SERVICE_FIELDS = ("python", "host", "port", "metrics_port", "http_port", "chunk_size", "l1_size_gb")


def replica_template(
    *, enforce_eager: bool, block_size: int | None, gpu_memory_utilization: float | None
) -> list[str]:
    """The default replica argv template for these options (``extra_args`` go after rendering)."""
    argv = list(_REPLICA_BASE)
    if enforce_eager:  # 27 s to ready instead of 74 s on CPU (no torch.compile warm-up)
        argv.append("--enforce-eager")
    if block_size is not None:
        argv += ["--block-size", "{block_size}"]
    if gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    return argv


def kv_transfer_config(host: str, port: int | None) -> dict[str, Any]:
    """The ``--kv-transfer-config`` of an ON replica: the multiprocess connector to the service."""
    extra = {"lmcache.mp.host": f"tcp://{host}", "lmcache.mp.port": port}
    return {"kv_connector": CONNECTOR, "kv_role": "kv_both", "kv_connector_extra_config": extra}


def render(template: Sequence[str], values: Mapping[str, Any]) -> list[str]:
    """Fill ``{name}`` placeholders of each item; an unknown name is a usage error."""
    out = []
    for item in template:
        try:
            out.append(item.format_map({k: "" if v is None else v for k, v in values.items()}))
        except (KeyError, IndexError, ValueError) as exc:
            raise ParamError(f"command template item {item!r}: unknown placeholder {exc}") from exc
    return out


def with_connector(argv: list[str], config: Mapping[str, Any]) -> list[str]:
    """An ON replica's argv: the connector config appended as one JSON argument."""
    return [*argv, "--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
