"""A simulated replicated deployment: N replicas and one shared tier on loopback."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from dataclasses import asdict
from types import TracebackType
from typing import Any

from aiohttp import web

from ._arrival import StampingListener
from ._config import VLLM_VERSION, SimConfig
from ._faults import Fault, FaultSet, parse_faults
from ._latency import LatencyModel
from ._replica import SimReplica
from ._tier import LMCACHE_VERSION, SharedTier

__all__ = ["SimDeployment"]

FaultSpec = str | Fault | Iterable[Fault | str] | None
# In-flight requests get this long to finish when a server stops; a restart
# is meant to look like a killed process, so it is short.
_SHUTDOWN_S = 0.25


class SimDeployment:
    """Replicas of a simulated vLLM 0.33 and an LMCache-like shared tier.

    Use it from async code (``async with SimDeployment() as dep``), from sync
    code on a background event loop (``dep.start_in_thread()`` ... ``dep.stop()``,
    or ``with SimDeployment() as dep``), or as a process
    (``python -m experiments.targets.sim``).
    """

    def __init__(
        self,
        replicas: int = 2,
        *,
        shared: bool = True,
        fault: FaultSpec = None,
        time_scale: float = 1.0,
        latency: LatencyModel | None = None,
        block_size: int = 16,
        chunk_size: int = 256,
        capacity_blocks: int = 65_536,
        tier_capacity_chunks: int = 1 << 20,
        base_port: int = 0,
        host: str = "127.0.0.1",
        model_name: str = "sim-27b",
        max_model_len: int = 270_336,
        config: SimConfig | None = None,
    ) -> None:
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        self.config = config or SimConfig(
            model_name=model_name,
            max_model_len=max_model_len,
            block_size=block_size,
            chunk_size=chunk_size,
            capacity_blocks=capacity_blocks,
            tier_capacity_chunks=tier_capacity_chunks,
            time_scale=time_scale,
            latency=latency or LatencyModel(),
        )
        self.n_replicas = replicas
        self.shared = shared
        self.host = host
        self.faults = FaultSet(fault)
        self.tier = SharedTier(
            chunk_size=self.config.chunk_size,
            capacity_chunks=self.config.tier_capacity_chunks,
            faults=self.faults,
        )
        self.replicas: list[SimReplica] = []
        self._base_port = base_port
        self._ports = [base_port + i if base_port else 0 for i in range(replicas + 1)]
        self._runners: list[web.AppRunner] = []
        self._tier_runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # --- addresses -------------------------------------------------------

    @property
    def replica_urls(self) -> list[str]:
        """Base URL of each replica, index order (``http://127.0.0.1:PORT``)."""
        self._require_started()
        return [f"http://{self.host}:{p}" for p in self._ports[: self.n_replicas]]

    @property
    def shared_url(self) -> str:
        """Base URL of the shared tier's HTTP service (served ON or OFF)."""
        self._require_started()
        return f"http://{self.host}:{self._ports[-1]}"

    @property
    def started(self) -> bool:
        return self._tier_runner is not None

    def _require_started(self) -> None:
        if not self.started:
            raise RuntimeError("the deployment is not started")

    # --- async life cycle ------------------------------------------------

    async def astart(self) -> SimDeployment:
        """Start the tier and the replicas on loopback."""
        if self.started:
            raise RuntimeError("the deployment is already started")
        app = self.tier.make_app()
        self._add_control_routes(app)
        self._tier_runner = await self._serve(app, len(self._ports) - 1)
        await self._start_replicas()
        return self

    async def aclose(self) -> None:
        """Stop every server; a later ``astart`` starts afresh."""
        await self._stop_replicas()
        if self._tier_runner is not None:
            await self._tier_runner.cleanup()
            self._tier_runner = None

    async def arestart(self, *, shared: bool | None = None, fault: FaultSpec | str = "keep") -> None:
        """Restart like a fresh launch: caches emptied, counters at zero, same ports."""
        await self._stop_replicas()
        if shared is not None:
            self.shared = shared
        if fault != "keep":
            self.set_fault(fault)
        self.tier.reset()
        await self._start_replicas()

    async def __aenter__(self) -> SimDeployment:
        return await self.astart()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _serve(self, app: web.Application, slot: int) -> web.AppRunner:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_S)
        await runner.setup()
        # Connections accepted here date each request by its bytes' arrival (_arrival.py).
        try:
            listener = StampingListener.open(self.host, self._ports[slot])
        except BaseException:
            await runner.cleanup()
            raise
        try:
            site = web.SockSite(runner, listener)
            await site.start()
        except BaseException:
            listener.close()
            await runner.cleanup()
            raise
        # Keep an OS-chosen port, so restarts come back at the same address.
        self._ports[slot] = int(runner.addresses[0][1])
        return runner

    async def _start_replicas(self) -> None:
        self.replicas = [
            SimReplica(i, self.config, self.tier, self.faults, self.shared) for i in range(self.n_replicas)
        ]
        self._runners = [await self._serve(r.make_app(), r.index) for r in self.replicas]

    async def _stop_replicas(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()

    # --- settings --------------------------------------------------------

    def set_shared(self, on: bool) -> None:
        """Attach (ON) or detach (OFF) every replica's connector to the tier."""
        self.shared = on
        for replica in self.replicas:
            replica.engine.shared = on

    def set_fault(self, fault: FaultSpec) -> None:
        """Replace the active faults (replicas and tier see the change at once)."""
        self.faults.faults = parse_faults(fault)

    def describe(self) -> dict[str, Any]:
        """What was launched, in the terms of the launch events (docs/design.md)."""
        c = self.config
        return {
            "engine": "sim",
            "engine_version": VLLM_VERSION,
            "model": c.model_name,
            "replicas": [{"replica": i, "endpoint": url} for i, url in enumerate(self.replica_urls)],
            "shared": {
                "endpoint": self.shared_url,
                "service": "sim-lmcache",
                "version": LMCACHE_VERSION,
                "on": self.shared,
            },
            "kv_connector": "SimLMCacheConnector" if self.shared else None,
            "faults": self.faults.spec(),
            "command": self.command(),
            "config": {
                "block_size": c.block_size,
                "chunk_size": c.chunk_size,
                "capacity_blocks": c.capacity_blocks,
                "tier_capacity_chunks": c.tier_capacity_chunks,
                "max_model_len": c.max_model_len,
                "time_scale": c.time_scale,
                "latency": asdict(c.latency),
                "cache_dtype": c.cache_dtype,
            },
        }

    def command(self) -> list[str]:
        """An equivalent ``python -m`` command line (block/chunk sizes included)."""
        c = self.config
        return [
            "python",
            "-m",
            "experiments.targets.sim",
            "--replicas",
            str(self.n_replicas),
            "--base-port",
            str(self._base_port),
            "--shared",
            "on" if self.shared else "off",
            "--fault",
            self.faults.spec(),
            "--time-scale",
            repr(c.time_scale),
            "--block-size",
            str(c.block_size),
            "--chunk-size",
            str(c.chunk_size),
            "--host",
            self.host,
        ]

    # --- control over HTTP (for subprocess use) ---------------------------

    def _add_control_routes(self, app: web.Application) -> None:
        app.router.add_get("/sim/deployment", self._h_describe)
        app.router.add_post("/sim/restart", self._h_restart)
        app.router.add_post("/sim/shared", self._h_shared)
        app.router.add_post("/sim/fault", self._h_fault)

    async def _h_describe(self, _: web.Request) -> web.Response:
        return web.json_response(self.describe())

    async def _h_restart(self, request: web.Request) -> web.Response:
        body = await _body(request)
        shared = body.get("shared")
        await self.arestart(shared=None if shared is None else bool(shared), fault=body.get("fault", "keep"))
        return web.json_response(self.describe())

    async def _h_shared(self, request: web.Request) -> web.Response:
        self.set_shared(bool((await _body(request)).get("on", True)))
        return web.json_response(self.describe())

    async def _h_fault(self, request: web.Request) -> web.Response:
        try:
            self.set_fault((await _body(request)).get("spec"))
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response(self.describe())

    # --- sync life cycle on a background loop -----------------------------

    def start_in_thread(self, timeout: float = 30.0) -> SimDeployment:
        """Serve from a daemon thread with its own event loop; returns when ready."""
        if self._thread is not None:
            raise RuntimeError("the deployment already runs in a thread")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="sim-deployment", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            asyncio.run_coroutine_threadsafe(self.astart(), loop).result(timeout)
        except BaseException:
            self._stop_loop()
            raise
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop a deployment started with ``start_in_thread``."""
        if self._loop is None:
            raise RuntimeError("stop() is for start_in_thread(); use 'await aclose()' in async code")
        try:
            asyncio.run_coroutine_threadsafe(self.aclose(), self._loop).result(timeout)
        finally:
            self._stop_loop()

    def restart(
        self, *, shared: bool | None = None, fault: FaultSpec | str = "keep", timeout: float = 30.0
    ) -> None:
        """Sync ``arestart`` for a deployment started with ``start_in_thread``."""
        if self._loop is None:
            raise RuntimeError("restart() is for start_in_thread(); use 'await arestart()'")
        coro = self.arestart(shared=shared, fault=fault)
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join()
        if loop is not None:
            loop.close()

    def __enter__(self) -> SimDeployment:
        return self.start_in_thread()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    body = await request.json()
    return body if isinstance(body, dict) else {}
