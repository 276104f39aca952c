"""Serve a deployment in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from ._deployment import SimDeployment

__all__ = ["serve_forever"]


async def _serve(dep: SimDeployment, on_ready: Callable[[SimDeployment], None]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with dep:
        on_ready(dep)
        await stop.wait()


def serve_forever(dep: SimDeployment, on_ready: Callable[[SimDeployment], None]) -> None:
    """Start ``dep``, call ``on_ready``, serve until interrupted, then stop cleanly."""
    asyncio.run(_serve(dep, on_ready))
