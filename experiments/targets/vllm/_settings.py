"""The vllm target's options (``--param``), checked and resolved once per run.

Everything a launch depends on is read here from the run's params, so the
launcher and the records see one frozen :class:`Settings`. Secrets never go
through params (params are recorded verbatim in ``run.started``): name them in
``pass_env`` and they are copied from the caller's environment at launch, then
redacted in the launch records.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors._secrets import is_secret_name, redact_command, redact_value

from ..._params import ParamError

__all__ = ["PARAMS", "Settings", "parse_attach", "parse_gpus", "parse_hash_seed"]

PARAMS: dict[str, Any] = {
    "replicas": 2,
    # checkpoint directory; None: the committed needle model; "needle-exact": the constructed one
    # (experiments/needle/construct.py); "tiny": the engines' tiny model
    "model": None,
    "revision": None,  # None: needle-<manifest hash>, the tiny model's build key, or the HF snapshot's name
    "manifest": None,  # expected hashes (JSON name -> sha256); None: the needle or tiny model's manifest
    "served_name": None,  # None: "needle", "tiny", or (attach) the first name the endpoint serves
    "max_model_len": 4096,
    "dtype": "bfloat16",
    "block_size": None,  # None: the engine's default (128 on CPU), recorded from cache_config_info
    "chunk_size": 256,  # LMCache chunk: cross-replica hits are whole chunks
    "enforce_eager": True,
    "gpus": None,  # "0,1" / [0,1]: physical GPUs; None: NVML's GPUs when present, else CPU
    "kv_cache_gb": 1,  # VLLM_CPU_KVCACHE_SPACE on CPU hosts
    # CPU hosts: the model runs in the engine core's process, as vLLM runs it on one GPU
    # (VLLM_ENABLE_V1_MULTIPROCESSING=0); false: vLLM's CPU default, a worker process of its own
    # with OpenMP threads bound to cores (one more interpreter to start per replica)
    "cpu_worker_in_engine": True,
    "gpu_memory_utilization": None,
    "lmcache_l1_gb": 1,  # the service's L1 (mp), or each replica's local CPU cache (remote)
    "lmcache_mode": None,  # "mp" / "remote"; None: by the installed LMCache (mp from 0.5.3)
    "lmcache_allocator": None,  # "mixed" / "lazy"; None: LMCache's default (recorded either way)
    "hash_seed": None,  # PYTHONHASHSEED of every replica; None: 0 (managed) / unknown (attach); "unset"
    "replica_command": None,  # argv template; None: python -m vllm.entrypoints.openai.api_server ...
    "service_command": None,  # argv template; None: python -m lmcache.cli.main server ...
    "extra_args": [],  # appended to every replica's argv (recorded, part of the config digest)
    "vllm_python": None,  # None: the engines' vllm environment
    "lmcache_python": None,  # None: the engines' lmcache environment
    "engine_version": None,  # None: read from the vllm environment's installed distribution
    "service_version": None,  # None: read from the lmcache environment
    "env": {},  # extra, non-secret environment for replicas and service (recorded)
    "pass_env": [],  # names copied from the caller's environment (secrets: values redacted)
    "host": "127.0.0.1",
    "startup_timeout_s": 300.0,
    "stop_grace_s": 15.0,
    "logs_dir": None,  # None: ${KVLEDGER_CACHE:-~/.cache/kvledger}/runs/<run_id>/
    "answers_meaningful": None,  # None: false for the tiny model; needle: per size, by its card; else true
    "attach": None,  # "URL1,URL2[,service=URL][,service_metrics=URL]": endpoints someone else started
}


def parse_gpus(value: Any) -> tuple[int, ...] | None:
    """``"0,1"``, ``0``, ``[0, 1]`` → (0, 1); None stays None (auto)."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else [value]
    try:
        gpus = tuple(int(str(g).strip()) for g in items if str(g).strip() != "")
    except ValueError as exc:
        raise ParamError(f"gpus must be integers like 0,1, got {value!r}") from exc
    if not gpus or any(g < 0 for g in gpus):
        raise ParamError(f"gpus must list GPU indices, got {value!r}")
    return gpus


def parse_attach(value: Any) -> tuple[tuple[str, ...], str | None, str | None] | None:
    """``"http://a:8000,http://b:8000,service=http://s:8090,service_metrics=http://s:9090"`` →
    (replica URLs, service URL, the URL whose ``/metrics`` serves the service's own counters)."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    urls: list[str] = []
    named: dict[str, str | None] = {"service": None, "service_metrics": None}
    for item in (str(i).strip() for i in items):
        name, sep, url = item.partition("=")
        if sep and name in named:
            named[name] = url.rstrip("/")
        elif item:
            urls.append(item.rstrip("/"))
    service, metrics = named["service"], named["service_metrics"]
    given = [*urls, *(u for u in (service, metrics) if u is not None)]
    if not urls or any(not u.startswith(("http://", "https://")) for u in given):
        raise ParamError(
            f"attach must be URL1,URL2[,service=URL][,service_metrics=URL] with http(s) URLs, got {value!r}"
        )
    return tuple(urls), service, metrics


def _check_env(env: Any, pass_env: Any) -> None:
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ParamError("env must be a JSON object of strings")
    for k, v in env.items():
        # Params are recorded verbatim: a secret given here would be in the ledger.
        if is_secret_name(k) or redact_value(v) != v:
            raise ParamError(f"env {k}: looks secret; name it in pass_env instead (value never recorded)")
    if not isinstance(pass_env, list) or not all(isinstance(n, str) for n in pass_env):
        raise ParamError("pass_env must be a list of variable names")


def _check_template(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, list) or not all(isinstance(a, str) for a in value)):
        raise ParamError(f"{name} must be a list of strings (an argv template)")
    # Recorded verbatim in run.started: refuse secrets here as in env.
    if value and redact_command(value) != list(value):
        raise ParamError(f"{name}: an argument looks secret; pass it through pass_env instead")


def check(params: Mapping[str, Any]) -> None:
    """Refuse bad options before anything is written (ParamError → exit 2)."""
    if not isinstance(params["replicas"], int) or params["replicas"] < 2:
        raise ParamError("replicas must be an integer of at least 2 (cross-replica steps)")
    for name in ("max_model_len", "chunk_size"):
        if not isinstance(params[name], int) or params[name] < 1:
            raise ParamError(f"{name} must be a positive integer")
    gpus = parse_gpus(params["gpus"])
    if gpus is not None and len(gpus) < params["replicas"]:
        raise ParamError(f"gpus lists {len(gpus)} GPU(s) for {params['replicas']} replicas")
    parse_attach(params["attach"])
    if params["attach"] is not None and redact_value(str(params["attach"])) != str(params["attach"]):
        raise ParamError("attach: a URL carries credentials; attach to URLs without them")
    _check_env(params["env"], params["pass_env"])
    _check_template("replica_command", params["replica_command"])
    _check_template("service_command", params["service_command"])
    from ._argv_templates import REPLICA_FIELDS, SERVICE_FIELDS, render

    # An unknown {placeholder} is a usage error now, not a failed block later.
    for name, fields in (("replica_command", REPLICA_FIELDS), ("service_command", SERVICE_FIELDS)):
        if params[name]:
            render(params[name], dict.fromkeys(fields, "x"))
    _check_template("extra_args", params["extra_args"])
    for name in ("startup_timeout_s", "stop_grace_s"):
        if params[name] <= 0:
            raise ParamError(f"{name} must be > 0")
    parse_hash_seed(params["hash_seed"])
    if params["lmcache_mode"] not in (None, "mp", "remote"):
        raise ParamError(f"lmcache_mode must be mp, remote or null, got {params['lmcache_mode']!r}")
    if params["lmcache_allocator"] not in (None, "mixed", "lazy"):
        given = params["lmcache_allocator"]
        raise ParamError(f"lmcache_allocator must be mixed, lazy or null, got {given!r}")
    if "PYTHONHASHSEED" in params["env"]:
        raise ParamError("env PYTHONHASHSEED: give --param hash_seed=N (recorded and checked by the audit)")


def parse_hash_seed(value: Any) -> int | str | None:
    """An integer 0..4294967295, ``"unset"`` (replicas hash with random seeds), or None (the default)."""
    if value is None or value == "unset":
        return value
    try:
        seed = int(value)
    except (TypeError, ValueError):
        seed = -1
    if isinstance(value, bool) or not 0 <= seed <= 4294967295:
        raise ParamError(f'hash_seed must be an integer 0..4294967295 or "unset", got {value!r}')
    return seed


@dataclass(frozen=True)
class Settings:
    """Resolved options of one run (paths still unresolved: see ``_resolve.resolve``)."""

    params: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.params[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def gpu_list(self) -> tuple[int, ...] | None:
        return parse_gpus(self.params["gpus"])

    @property
    def managed_hash_seed(self) -> int | None:
        """The PYTHONHASHSEED a managed target gives every replica (None: left unset)."""
        seed = parse_hash_seed(self.params["hash_seed"])
        return None if seed == "unset" else 0 if seed is None else int(seed)

    @property
    def attach_urls(self) -> tuple[tuple[str, ...], str | None, str | None] | None:
        return parse_attach(self.params["attach"])

    def passed_env(self) -> dict[str, str]:
        """The named variables that exist in the caller's environment."""
        return {n: os.environ[n] for n in self.params["pass_env"] if n in os.environ}

    def logs_root(self, run_id: str) -> Path:
        from .engines import cache_root

        given = self.params["logs_dir"]
        return Path(given).expanduser() if given else cache_root() / "runs" / run_id
