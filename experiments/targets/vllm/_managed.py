"""The managed ``vllm`` target: launches replicas (and, for ON, the LMCache service) per block.

Every block starts a fresh deployment: ON blocks start the LMCache server
first and give each replica its connector (``LMCacheMPConnector`` to the
multiprocess service, or ``LMCacheConnectorV1`` to an ``lm://`` server, by the
installed LMCache: ``_lmcache``); OFF blocks run the replicas without a
connector and no server at all. Every replica gets the same
``PYTHONHASHSEED`` (recorded). Each replica's GPU is read from the engine's
own processes (NVML's compute processes of the replica's process session),
falling back to its ``CUDA_VISIBLE_DEVICES``; a CPU build records ``cpu``. Start-up has a deadline;
stop is SIGTERM to each process group, then SIGKILL (a misconfigured replica
ignores SIGTERM). Each process logs to files under the run's directory, and
the stop records carry those files' SHA-256, so the record names the exact logs.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from collectors import gpu_inventory
from collectors._host import gpu_processes, session_id
from collectors._secrets import redact_command, redact_env
from collectors.probes._lmcache import OPS_STATE_SCRIPT
from ledger import canonical_json, new_id, sha256_hex

from .._base import Launch, LaunchRecord, Replica, TargetError
from . import _argv_templates as cmds
from ._lmcache import Generation, choose_mode
from ._observe import Observed, observe
from ._process import Process, start, wait_tcp
from ._records import stopped_data
from ._resolve import Resolved
from ._settings import Settings

__all__ = ["VllmTarget"]

# Variables a replica needs from the caller to run at all; everything else is explicit.
_INHERITED = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR", "HF_HOME", "HF_HUB_CACHE")
_SERVICE = "lmcache"
_OPS_TIMEOUT_S = 180.0  # importing torch and LMCache on a busy 2-core machine


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def engine_gpus(pid: int, processes: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The GPUs on which any process of ``pid``'s session computes (the engine's own devices)."""
    seen: dict[str, dict[str, Any]] = {}
    for p, gpus in processes.items():
        if p == pid or session_id(p) == pid:
            for g in gpus:
                seen.setdefault(str(g.get("uuid") or g.get("index")), dict(g))
    return sorted(seen.values(), key=lambda g: int(g.get("index") or 0))


def gpu_facts(physical: Sequence[int], inventory: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """Index, UUID and name of each of ``physical`` from ``inventory`` (:func:`gpu_inventory`)."""
    by_index = {int(g["index"]): g for g in inventory}
    return {
        i: {"index": i, "uuid": by_index.get(i, {}).get("uuid"), "name": by_index.get(i, {}).get("name")}
        for i in physical
    }


def _seed_of(env: Mapping[str, str]) -> int | str | None:
    """The replica's PYTHONHASHSEED as launched (what the audit compares across replicas)."""
    value = env.get("PYTHONHASHSEED")
    if value is None:
        return None
    return int(value) if value.isdigit() else value


class VllmTarget:
    """Real vLLM replicas (+ LMCache service for ON), restarted for every block."""

    name = "vllm"
    restarts_blocks = True
    warmup_every_replica = True
    """A fresh replica whose first request was an external hit was seen to die (NOTES.md)."""
    health_settle_s = 1.0
    """After a failed request, a second health look this much later (an engine can end the
    stream before its API server reports the death)."""

    def __init__(self, settings: Settings, resolved: Resolved) -> None:
        self.s = settings
        self.r = resolved
        if resolved.engine_device == "cpu" and settings.gpu_list:
            raise TargetError(
                f"gpus={settings.gpus} given, but {resolved.vllm_python} has a CPU build "
                "of vLLM: it would use no GPU"
            )
        # A CPU build uses no GPU, whatever NVML sees on the host.
        inventory = gpu_inventory() if resolved.engine_device != "cpu" else []
        self.physical_gpus: tuple[int, ...] | None = settings.gpu_list or (
            tuple(int(g["index"]) for g in inventory) or None
        )
        self._gpu = gpu_facts(self.physical_gpus or (), inventory)
        self.transfer_path = "gpu" if self.physical_gpus else "cpu"
        self.hash_seed = settings.managed_hash_seed
        self.lmcache = Generation(
            mode=choose_mode(resolved.lmcache_version, settings.lmcache_mode),
            version=resolved.lmcache_version,
            chunk_size=int(settings.chunk_size),
            cpu_gb=float(settings.lmcache_l1_gb),
            allocator=settings.lmcache_allocator,
        )
        self.logs_root = settings.logs_root(new_id())  # replaced by prepare_run's run id
        self._block = 0
        self._procs: dict[int, Process] = {}
        self._urls: dict[int, str] = {}
        self._service: Process | None = None
        self._service_url: str | None = None
        self._tier_metrics: str | None = None
        self._ops_seen: dict[tuple[str, bytes], dict[str, Any]] = {}
        self._client = httpx.AsyncClient(timeout=10.0)

    # --- what the runner records -----------------------------------------------

    @property
    def chunk_size(self) -> int:
        return int(self.s.chunk_size)

    @property
    def model_name(self) -> str:
        return str(self.s.served_name or self.r.default_name)

    @property
    def answers_meaningful(self) -> bool:
        """Random weights answer deterministically but meaninglessly: no exact-value checks."""
        given = self.s.answers_meaningful
        return (not self.r.tiny) if given is None else bool(given)

    @property
    def meaningful_up_to_tokens(self) -> int | None:
        """The needle model's card: exact-value checks apply up to the largest size it serves."""
        if self.s.answers_meaningful is not None or self.r.card is None:
            return None
        return self.r.card.served_max_tokens

    @property
    def model_card(self) -> dict[str, Any] | None:
        return self.r.card.summary() if self.r.card is not None else None

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return self.physical_gpus or ()

    @property
    def cpu_worker_in_engine(self) -> bool | None:
        """Whether a CPU engine runs its model in the engine core's process (None: not a CPU
        engine, where the setting means nothing)."""
        return bool(self.s.cpu_worker_in_engine) if self.r.engine_device == "cpu" else None

    def _service_config(self) -> dict[str, Any]:
        if self.lmcache.mode == "remote":
            return {
                "service": _SERVICE,
                "mode": "remote",
                "version": self.r.service_version,
                "storage": "cpu",
                "command": self.s.service_command,
            }
        return {
            "service": _SERVICE,
            "mode": "mp",
            "version": self.r.service_version,
            "chunk_size": self.chunk_size,
            "l1_size_gb": self.s.lmcache_l1_gb,
            "eviction_policy": "LRU",
            "transfer_mode": "auto",
            "command": self.s.service_command,
        }

    def config(self, arm: str) -> dict[str, Any]:
        """What decides correctness: same settings → same digest on any run (no ports, no pids)."""
        on = arm == "ON"
        return {
            "target": "vllm",
            "engine": "vllm",
            "engine_version": self.r.engine_version,
            "model": {
                "path": str(self.r.model_dir),
                "checkpoint_sha256": self.r.checkpoint_sha256,
                "revision": self.r.revision,
            },
            "served_name": self.model_name,
            "dtype": self.s.dtype,
            "max_model_len": self.s.max_model_len,
            "enable_prefix_caching": True,
            "block_size": self.s.block_size,
            "enforce_eager": self.s.enforce_eager,
            "cpu_worker_in_engine": self.cpu_worker_in_engine,
            "replicas": self.s.replicas,
            "transfer_path": self.transfer_path,
            "extra_args": self.s.extra_args,
            # Variables can change what is computed (allocator, attention backend, LMCACHE_*):
            # the explicit ones by value, passed-through ones (possibly secret) by name only.
            "env": self.s.env,
            "pass_env": sorted(self.s.pass_env),
            "replica_command": self.s.replica_command,
            "engine_device": self.r.engine_device,
            # Replicas hash chunks with it: a different seed per replica shares nothing.
            "hash_seed": self.hash_seed,
            "kv_connector": self.lmcache.connector_config(self.s.host, None) if on else None,
            "lmcache": self.lmcache.config(self.s.host) if on else None,
            "service": self._service_config() if on else None,
        }

    def config_sha256(self, arm: str) -> str:
        return sha256_hex(canonical_json(self.config(arm)))

    def describe(self) -> dict[str, Any]:
        return {
            "mode": "managed",
            "engine_version": self.r.engine_version,
            "model": str(self.r.model_dir),
            "revision": self.r.revision,
            "gpus": list(self.physical_gpus or []),
            "transfer_path": self.transfer_path,
            "answers_meaningful": self.answers_meaningful,
            "meaningful_up_to_tokens": self.meaningful_up_to_tokens,
            "restarts_blocks": True,
        }

    async def prepare_run(self, run_id: str) -> tuple[LaunchRecord, ...]:
        """Bind the run (logs under its id) and record which checkpoint it uses."""
        self.logs_root = self.s.logs_root(run_id)
        return (LaunchRecord("checkpoint.audited", self.r.audit.data()),)

    # --- launching -----------------------------------------------------------------

    def _env(self, gpu: int | None) -> dict[str, str]:
        from .engines import cache_root

        runtime = cache_root() / "runtime"
        env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
        env.update(
            {
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                "PYTHONUNBUFFERED": "1",
                "VLLM_CACHE_ROOT": str(runtime / "vllm"),
                "TORCHINDUCTOR_CACHE_DIR": str(runtime / "inductor"),
            }
        )
        if gpu is None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.s.kv_cache_gb)
            if self.cpu_worker_in_engine:
                # vLLM's CPU platform starts the model in a worker process of its own unless this
                # is 0: with it, one interpreter fewer per replica (about half the start-up).
                env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        else:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        if self.hash_seed is not None:
            env["PYTHONHASHSEED"] = str(self.hash_seed)
        return {**env, **self.s.env, **self.s.passed_env()}

    def _replica_argv(self, port: int, on: bool, service_port: int | None) -> list[str]:
        template = self.s.replica_command or cmds.replica_template(
            enforce_eager=self.s.enforce_eager,
            block_size=self.s.block_size,
            gpu_memory_utilization=self.s.gpu_memory_utilization,
        )
        argv = cmds.render(
            template,
            {
                "python": self.r.vllm_python,
                "model": self.r.model_dir,
                "served_name": self.model_name,
                "host": self.s.host,
                "port": port,
                "dtype": self.s.dtype,
                "max_model_len": self.s.max_model_len,
                "block_size": self.s.block_size,
            },
        )
        argv += list(self.s.extra_args)  # verbatim: JSON braces are no placeholders
        if on and service_port is not None:
            argv = cmds.with_connector(argv, self.lmcache.connector_config(self.s.host, service_port))
        return argv

    def _block_dir(self, arm: str) -> Path:
        self._block += 1
        return self.logs_root / f"b{self._block:02d}-{arm}"

    async def _wait(self, proc: Process, url: str) -> None:
        # A StartupError is a TargetError naming the process: the block fails with it as it is.
        await asyncio.to_thread(proc.wait_http, url, float(self.s.startup_timeout_s))

    async def _start_service(self, logs: Path, digest: str) -> tuple[int, LaunchRecord, dict[str, Any]]:
        """Start the LMCache service of an ON block whose config digest is ``digest``."""
        # A fresh port for every server (a reused one fails with "Address already in use").
        port, http_port, metrics_port = (free_port(self.s.host) for _ in range(3))
        template = self.s.service_command
        argv = self.lmcache.service_argv(
            template,
            {
                "python": self.r.lmcache_python,
                "host": self.s.host,
                "port": port,
                "metrics_port": metrics_port,
                "http_port": http_port,
                "chunk_size": self.chunk_size,
                "l1_size_gb": self.s.lmcache_l1_gb,
            },
        )
        env = self._env(None)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        # The multiprocess service moves the KV: its compiled ops decide the copy path. In-process,
        # the replicas' LMCache does (same Python and packages as theirs).
        if self.lmcache.mode == "mp":
            ops = await self._observe_ops(self.r.lmcache_python, env, "the LMCache service's")
        else:
            replica_env = {**self._env(self._gpu_of(0)[0]), **self.lmcache.replica_env(self.s.host, port)}
            ops = await self._observe_ops(self.r.vllm_python, replica_env, "the replicas'")
        proc = start(argv, name=_SERVICE, log_dir=logs, env=env, die_with_parent=True)
        self._service = proc
        self._service_url = f"{'tcp' if self.lmcache.mode == 'mp' else 'lm'}://{self.s.host}:{port}"
        # A template of one's own serves the counters only where it names their port.
        serves = self.lmcache.serves_metrics and (
            template is None or any("{metrics_port}" in str(item) for item in template)
        )
        self._tier_metrics = f"http://{self.s.host}:{metrics_port}" if serves else None
        # Either server binds its port once its engine is built (the HTTP front end, where a
        # template starts it, inside its start-up): accepting is ready.
        await asyncio.to_thread(wait_tcp, self.s.host, port, float(self.s.startup_timeout_s), process=proc)
        return (
            port,
            LaunchRecord(
                "service.launched",
                {
                    "service": _SERVICE,
                    "endpoint": self._service_url,
                    "metrics_endpoint": self._tier_metrics,
                    "port": port,
                    "mode": self.lmcache.mode,
                    "command": redact_command(argv),
                    "env": redact_env(env),
                    "version": self.r.service_version,
                    "pool_bytes": int(float(self.s.lmcache_l1_gb) * 2**30),
                    "pinned": None,
                    "chunk_size": self.chunk_size,
                    "config_sha256": digest,
                    "target": "vllm",
                    "allocator": self.lmcache.allocator_record(),
                    **ops,
                    "hash_seed": self.hash_seed,
                    "pid": proc.pid,
                    "ready_s": proc.ready_seconds,
                    "restarted": True,
                },
            ),
            ops,
        )

    def _gpu_of(self, slot: int) -> tuple[int | None, dict[str, Any] | None]:
        if not self.physical_gpus:
            return None, None
        physical = self.physical_gpus[slot % len(self.physical_gpus)]
        return physical, self._gpu[physical]

    async def start(self, *, arm: str, gpus: Sequence[int]) -> Launch:
        if arm not in ("ON", "OFF"):
            raise ValueError(f"arm must be ON or OFF, got {arm!r}")
        if self._procs or self._service is not None:
            await self.stop()  # a block's leftovers never serve the next block
        logs, on = self._block_dir(arm), arm == "ON"
        # The block's config and digest, once: every record of the block carries the same ones.
        config = self.config(arm)
        digest = sha256_hex(canonical_json(config))
        records: list[LaunchRecord] = []
        service_port = None
        ops: dict[str, Any] = {}  # LMCache's copy path, observed as an ON block's service starts
        if on:
            service_port, record, ops = await self._start_service(logs, digest)
            records.append(record)
        launched = []
        started_on: set[int] = set()
        for i in range(int(self.s.replicas)):
            physical, gpu = self._gpu_of(gpus[i] if i < len(gpus) else i)
            if physical is not None and physical in started_on:
                # vLLM sizes its KV cache from the memory its start-up profile saw used: a neighbour
                # on the same GPU allocating meanwhile counts as its own, and leaves it none.
                await self._wait_all()
            port, env = free_port(self.s.host), self._env(physical)
            if on and service_port is not None:
                env.update(self.lmcache.replica_env(self.s.host, service_port))
            argv = self._replica_argv(port, on, service_port)
            # Started from the loop's thread (die_with_parent follows the starting thread).
            proc = start(argv, name=f"replica-{i}", log_dir=logs, env=env, die_with_parent=True)
            self._procs[i], self._urls[i] = proc, f"http://{self.s.host}:{port}"
            launched.append((i, gpu, argv, env))
            if physical is not None:
                started_on.add(physical)
        # On separate GPUs (or CPUs) started together, waited together: start-up is mostly waiting.
        await self._wait_all()
        observed = await asyncio.gather(
            *(asyncio.to_thread(self._observe, self._urls[i]) for i in self._procs)
        )
        processes = await asyncio.to_thread(gpu_processes) if self.physical_gpus else {}
        replicas = []
        for (i, assigned, argv, env), obs in zip(launched, observed, strict=True):
            self._check_version(obs)
            gpu = self._engine_gpu(i, assigned, processes)
            replicas.append(Replica(i, self._urls[i], gpu))
            data = self._replica_data(i, gpu, arm, argv, env, obs, service_port, config, digest, ops)
            data["assigned_gpu"] = assigned
            records.append(LaunchRecord("deployment.launched", data))
        tier = self._tier_metrics if on else None
        return Launch(tuple(replicas), digest, tuple(records), tier_metrics=tier)

    async def _observe_ops(self, python: str, env: Mapping[str, str], where: str) -> dict[str, Any]:
        """Whether LMCache's compiled ops load where its copies run: LMCache falls back to a raw
        cudaMemcpy on no stream without them, the path the helper probes found wrong when the
        producer stream is late, and its pinned pool then rounds up to a power of two. Observed
        once per Python and environment (an import there, ``ops`` None where that cannot say)."""
        key = (python, canonical_json(dict(env)))
        if key not in self._ops_seen:
            self._ops_seen[key] = await asyncio.to_thread(_import_ops, python, dict(env), where)
        return self._ops_seen[key]

    async def _wait_all(self) -> None:
        """Until every replica started so far answers its health check."""
        await asyncio.gather(*(self._wait(self._procs[i], self._urls[i] + "/health") for i in self._procs))

    def _engine_gpu(
        self, i: int, assigned: dict[str, Any] | None, processes: Mapping[int, Sequence[Mapping[str, Any]]]
    ) -> dict[str, Any] | None:
        """The GPU replica ``i``'s engine computes on, as NVML sees its processes; else its assignment."""
        if assigned is None:
            return None  # a CPU engine: no GPU, whatever the host has
        found = engine_gpus(self._procs[i].pid, processes)
        if len(found) == 1:
            return {**found[0], "source": "nvml-process"}
        if len(found) > 1:
            uuids = ", ".join(str(g.get("uuid")) for g in found)
            raise TargetError(f"replica {i} computes on {len(found)} GPUs ({uuids}); one was assigned")
        return {**assigned, "source": "cuda-visible-devices"}

    @staticmethod
    def _observe(url: str) -> Observed:
        with httpx.Client() as client:
            return observe(client, url)

    def _check_version(self, obs: Observed) -> None:
        # The config digest named a version before start; a different one serving would make it lie.
        if obs.version != self.r.engine_version:
            raise TargetError(
                f"{obs.endpoint} serves vLLM {obs.version}, the config names {self.r.engine_version}"
            )

    def _replica_data(
        self,
        i: int,
        gpu: dict[str, Any] | None,
        arm: str,
        argv: list[str],
        env: dict[str, str],
        obs: Observed,
        service_port: int | None,
        config: dict[str, Any],
        digest: str,
        ops: dict[str, Any],
    ) -> dict[str, Any]:
        proc = self._procs[i]
        on = arm == "ON" and service_port is not None
        lm = self.lmcache
        lmcache = (
            {**lm.config(self.s.host), "env": lm.replica_env(self.s.host, service_port), **ops}
            if on
            else None
        )
        return {
            "replica": i,
            "gpu": gpu,
            "endpoint": self._urls[i],
            "engine": "vllm",
            "engine_version": obs.version,
            "server_info": obs.server_info,
            "server_info_status": obs.server_info_status,
            "command": redact_command(argv),
            "env": redact_env(env),
            "model": {
                "path": str(self.r.model_dir),
                "served_name": self.model_name,
                "revision": self.r.revision,
                "checkpoint_sha256": self.r.checkpoint_sha256,
            },
            "config_sha256": digest,
            "kv_connector": self.lmcache.connector_config(self.s.host, service_port) if on else None,
            "lmcache": lmcache,
            "hash_seed": _seed_of(env),
            "device": "cuda" if gpu is not None else "cpu",
            "packages": self.r.packages,
            "target": "vllm",
            "transfer_path": self.transfer_path,
            "arm": arm,
            "config": config,
            "restarted": True,
            "attached": False,
            "pid": proc.pid,
            "ready_s": proc.ready_seconds,
            "served_names": obs.served_names,
            "cache_config": obs.cache_config,
            "logs": [str(proc.stdout_path), str(proc.stderr_path)],
        }

    # --- stopping ------------------------------------------------------------------

    async def _health(self, url: str) -> int | None:
        try:
            return (await self._client.get(url, timeout=3.0)).status_code
        except httpx.HTTPError:
            return None

    async def _stop_one(self, proc: Process, health_url: str | None) -> dict[str, Any]:
        health = None if health_url is None else await self._health(health_url)
        exited = not proc.alive()
        await asyncio.to_thread(proc.terminate, float(self.s.stop_grace_s))
        return stopped_data(proc, health, exited_before_stop=exited)

    async def stop(self) -> tuple[LaunchRecord, ...]:
        procs, urls, self._procs, self._urls = self._procs, self._urls, {}, {}
        done = await asyncio.gather(*(self._stop_one(p, urls[i] + "/health") for i, p in procs.items()))
        records = [
            LaunchRecord("deployment.stopped", {"replica": i, "endpoint": urls[i], **data})
            for i, data in zip(procs, done, strict=True)
        ]
        service, url, self._service, self._service_url = self._service, self._service_url, None, None
        metrics, self._tier_metrics = self._tier_metrics, None
        if service is not None:  # after the replicas: their connectors talk to it until they exit
            # Its health: whether its metrics answer (the bare lm:// server has no HTTP at all).
            data = await self._stop_one(service, f"{metrics}/metrics" if metrics else None)
            records.append(LaunchRecord("service.stopped", {"service": _SERVICE, "endpoint": url, **data}))
        return tuple(records)

    async def healthy(self, replica: int) -> bool:
        proc = self._procs.get(replica)
        if proc is None or not proc.alive():
            return False
        return await self._health(self._urls[replica] + "/health") == 200

    async def close(self) -> None:
        try:
            await self.stop()
        finally:
            await self._client.aclose()

    # --- for fault-injection tests ---------------------------------------------------

    def process(self, replica: int) -> Process:
        """The running replica's launcher handle (pid, logs) — tests inject faults through it."""
        return self._procs[replica]

    def endpoint(self, replica: int) -> str:
        return self._urls[replica]


def _import_ops(python: str, env: dict[str, str], where: str) -> dict[str, Any]:
    """``{"ops": True|False|None, "ops_observed": ...}``: LMCache imported in ``python`` with
    ``env``, and whether its device ops bound the compiled extension (the rule the helper and
    pool probes record as ``with_ops``); None where that could not be told."""
    how = f"LMCache's device ops resolved in {where} Python and environment"
    try:
        done = subprocess.run(
            [python, "-c", OPS_STATE_SCRIPT], env=env, capture_output=True, text=True, timeout=_OPS_TIMEOUT_S
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
            return {"ops": None, "ops_observed": f"{how}: failed ({last})"}
        state = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return {"ops": None, "ops_observed": f"{how}: could not run ({type(exc).__name__})"}
    return {
        "ops": bool(state["with_ops"]),
        "ops_observed": f"{how}: {state['device_ops']} on {state['device_type']}",
    }
