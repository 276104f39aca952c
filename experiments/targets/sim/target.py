"""The ``sim`` target: a thin adapter over the simulated deployment of this package.

The simulated deployment runs as a subprocess (``python -m
experiments.targets.sim``), so on a small machine the server's tokenizing and
hashing run on another core than the runner's client; each block restarts it
over its control route (``POST /sim/restart``): fresh caches, zeroed counters,
the same ports, the shared tier connected (ON) or not (OFF).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from ledger import canonical_json, sha256_hex

from .._base import Launch, LaunchRecord, Replica, TargetError
from .._children import die_with_parent
from ._config import VLLM_VERSION, SimConfig
from ._faults import FaultSet

__all__ = ["SimTarget"]

_REPO_ROOT = Path(__file__).resolve().parents[3]
_START_TIMEOUT_S = 60.0
_CONNECTOR = "SimLMCacheConnector"
_SERVICE = "sim-lmcache"


class SimTarget:
    """Simulated replicas plus a shared tier, restarted for every block."""

    name = "sim"
    restarts_blocks = True
    warmup_every_replica = False
    health_settle_s = 0.0
    answers_meaningful = True
    """The sim answers by its planted assignment: exact values are checked at every size."""
    meaningful_up_to_tokens: int | None = None
    model_card: dict[str, Any] | None = None

    def __init__(
        self,
        *,
        replicas: int = 2,
        time_scale: float = 0.005,
        fault: str | None = None,
        hash_seed: int | None = 0,
        capacity_blocks: int = 65_536,
        device_name: str = "sim",
        meaningful_up_to_tokens: int | None = None,
    ) -> None:
        if replicas < 2:
            raise ValueError("the sim target needs at least two replicas (cross-replica steps)")
        self.replicas = replicas
        self.time_scale = float(time_scale)
        self.hash_seed = hash_seed
        self.fault = FaultSet(fault).spec()  # validates and normalises; "none" when empty
        self.config = SimConfig(time_scale=self.time_scale, capacity_blocks=capacity_blocks)
        self.device_name = device_name
        """The device model the replicas report (the vllm target's GPU name), outside the config."""
        self.meaningful_up_to_tokens = meaningful_up_to_tokens
        """The largest prompt whose answers count as served (a card's limit); None: every size."""
        self._proc: subprocess.Popen[str] | None = None
        self._urls: list[str] = []
        self._tier_url = ""
        self._client = httpx.AsyncClient(timeout=30.0)
        self._arm: str | None = None
        self._stderr: Any = None

    # --- what the runner records ---------------------------------------------

    def _config(self, arm: str) -> dict[str, Any]:
        c = self.config
        return {
            "target": "sim",
            "engine": "sim",
            "engine_version": VLLM_VERSION,
            "model": c.model_name,
            "replicas": self.replicas,
            "block_size": c.block_size,
            "chunk_size": c.chunk_size,
            "capacity_blocks": c.capacity_blocks,
            "tier_capacity_chunks": c.tier_capacity_chunks,
            "cache_dtype": c.cache_dtype,
            "max_model_len": c.max_model_len,
            "kv_connector": _CONNECTOR if arm == "ON" else None,
            "faults": self.fault,
        }

    def config_sha256(self, arm: str) -> str:
        return sha256_hex(canonical_json(self._config(arm)))

    def describe(self) -> dict[str, Any]:
        return {"replicas": self.replicas, "time_scale": self.time_scale, "sim_fault": self.fault}

    @property
    def chunk_size(self) -> int:
        return self.config.chunk_size

    async def prepare_run(self, run_id: str) -> tuple[LaunchRecord, ...]:
        """No checkpoint to audit and nothing bound to the run."""
        return ()

    @property
    def model_name(self) -> str:
        return self.config.model_name

    def _command(self, arm: str) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "experiments.targets.sim",
            "--replicas",
            str(self.replicas),
            "--shared",
            "on" if arm == "ON" else "off",
            "--time-scale",
            repr(self.time_scale),
            "--capacity-blocks",
            str(self.config.capacity_blocks),
        ]
        if self.fault != "none":
            cmd += ["--fault", self.fault]
        return cmd

    # --- life cycle ----------------------------------------------------------

    async def start(self, *, arm: str, gpus: Sequence[int]) -> Launch:
        if arm not in ("ON", "OFF"):
            raise ValueError(f"arm must be ON or OFF, got {arm!r}")
        if self._proc is None or self._proc.poll() is not None:
            # Spawned from the loop's thread: the child's death signal follows this thread.
            proc = self._spawn(arm)
            await asyncio.to_thread(self._await_ready, proc)
        else:
            await self._restart(arm)
        self._arm = arm
        return self._launch(arm, gpus)

    def _spawn(self, arm: str) -> subprocess.Popen[str]:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(_REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        # stderr to a file: an unread pipe would block a chatty server.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
        proc = subprocess.Popen(
            self._command(arm),
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=_REPO_ROOT,
            env=env,
            preexec_fn=die_with_parent,
        )
        self._proc = proc
        return proc

    def _await_ready(self, proc: subprocess.Popen[str]) -> None:
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.strip()
            if line == "READY":
                break
            lines.append(line)
        else:
            self._stderr.seek(0)
            err = self._stderr.read()
            raise TargetError(f"the sim did not start: {err.strip()[-500:]}")
        self._urls, self._tier_url = lines[: self.replicas], lines[self.replicas]

    async def _restart(self, arm: str) -> None:
        body = {"shared": arm == "ON", "fault": None if self.fault == "none" else self.fault}
        try:
            resp = await self._client.post(self._tier_url + "/sim/restart", json=body)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise TargetError(f"sim restart failed: {exc}") from exc

    def _launch(self, arm: str, gpus: Sequence[int]) -> Launch:
        digest = self.config_sha256(arm)
        cmd = self._command(arm)
        device = self.device_name
        replicas = tuple(
            Replica(i, url, {"index": int(gpus[i % len(gpus)]) if gpus else i, "uuid": None, "name": device})
            for i, url in enumerate(self._urls)
        )
        records = [
            LaunchRecord("deployment.launched", self._replica_data(r, arm, digest, cmd)) for r in replicas
        ]
        if arm == "ON":
            records.append(
                LaunchRecord(
                    "service.launched",
                    {
                        "service": _SERVICE,
                        "endpoint": self._tier_url,
                        "command": cmd,
                        "env": {},
                        "version": "0.5.6+sim",
                        "pool_bytes": None,
                        "pinned": None,
                        "config_sha256": digest,
                        "target": "sim",
                    },
                )
            )
        return Launch(replicas, digest, tuple(records), tier_metrics=self._tier_url if arm == "ON" else None)

    def _replica_data(self, r: Replica, arm: str, digest: str, cmd: list[str]) -> dict[str, Any]:
        c = self.config
        return {
            "replica": r.index,
            "gpu": r.gpu,
            "endpoint": r.endpoint,
            "engine": "sim",
            "engine_version": VLLM_VERSION,
            "command": cmd,
            "env": {},
            "model": {"path": None, "served_name": c.model_name, "revision": None},
            "config_sha256": digest,
            "kv_connector": {"kv_connector": _CONNECTOR, "kv_role": "kv_both"} if arm == "ON" else None,
            "target": "sim",
            "transfer_path": "sim",
            "arm": arm,
            "config": self._config(arm),
            "time_scale": self.time_scale,
            "hash_seed": self.hash_seed,
            # What the replica's vllm:cache_config_info says (as the vllm target records it).
            "cache_config": c.cache_info(),
        }

    async def stop(self) -> tuple[LaunchRecord, ...]:
        # The process stays up between blocks; the next start restarts it fresh.
        records = [
            LaunchRecord("deployment.stopped", {"replica": i, "endpoint": url})
            for i, url in enumerate(self._urls)
        ]
        if self._arm == "ON":
            records.append(LaunchRecord("service.stopped", {"service": _SERVICE, "endpoint": self._tier_url}))
        self._arm = None
        return tuple(records)

    async def healthy(self, replica: int) -> bool:
        if self._proc is None or self._proc.poll() is not None:
            return False
        try:
            resp = await self._client.get(self._urls[replica] + "/health", timeout=5.0)
        except (httpx.HTTPError, IndexError):
            return False
        return resp.status_code == 200

    async def close(self) -> None:
        await self._client.aclose()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                await asyncio.to_thread(proc.wait, 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        for stream in (proc.stdout, self._stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
