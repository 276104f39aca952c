"""A tiny Chrome DevTools Protocol client (aiohttp websockets) to load a page headless.

Returns what the page logged as errors and the rendered size of the elements a
selector matches; no npm, no playwright.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-port=0",
]


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _port(profile: Path, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists() and marker.read_text().strip():
            return int(marker.read_text().splitlines()[0])
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}")
        time.sleep(0.05)
    raise TimeoutError("chromium did not open its DevTools port")


async def _inspect(port: int, url: str, selector: str, expression: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            pages = [p for p in await resp.json() if p.get("type") == "page"]
        async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            errors: list[str] = []
            ids = iter(range(1, 10_000))
            waiting: dict[int, asyncio.Future[Any]] = {}
            loaded = asyncio.get_running_loop().create_future()

            async def reader() -> None:
                async for msg in ws:
                    m = json.loads(msg.data)
                    if "id" in m and m["id"] in waiting:
                        waiting.pop(m["id"]).set_result(m.get("result"))
                    elif m.get("method") == "Page.loadEventFired" and not loaded.done():
                        loaded.set_result(True)
                    elif m.get("method") == "Runtime.exceptionThrown":
                        errors.append(str(m["params"]["exceptionDetails"].get("text")))
                    elif m.get("method") == "Runtime.consoleAPICalled" and m["params"]["type"] == "error":
                        errors.append(json.dumps(m["params"]["args"]))
                    elif m.get("method") == "Log.entryAdded" and m["params"]["entry"]["level"] == "error":
                        errors.append(m["params"]["entry"]["text"])

            async def call(method: str, **params: Any) -> Any:
                n = next(ids)
                waiting[n] = asyncio.get_running_loop().create_future()
                await ws.send_str(json.dumps({"id": n, "method": method, "params": params}))
                return await asyncio.wait_for(waiting[n], 30)

            task = asyncio.create_task(reader())
            for domain in ("Page", "Runtime", "Log"):
                await call(f"{domain}.enable")
            await call("Page.navigate", url=url)
            await asyncio.wait_for(loaded, 60)
            found = f"[...document.querySelectorAll({json.dumps(selector)})]"
            expr = (
                f"JSON.stringify({{title: document.title, value: ({expression}), sizes: {found}"
                ".map(e => {const r = e.getBoundingClientRect(); return [r.width, r.height];})})"
            )
            result = await call("Runtime.evaluate", expression=expr, returnByValue=True)
            await asyncio.sleep(0.2)  # late console messages
            task.cancel()
            return {**json.loads(result["result"]["value"]), "errors": errors}


def inspect_page(path: Path, selector: str, expression: str = "null") -> dict[str, Any]:
    """Load ``path`` in headless chromium: its title, the sizes of ``selector`` matches, error logs,
    and the value of the JavaScript ``expression`` evaluated in the page."""
    binary = chromium_binary()
    assert binary, "chromium is not installed (scripts/ensure-chromium.sh)"
    # Chromium's helper processes can still write to the profile just after the browser
    # exits: the whole process group is killed, and a late write never fails cleanup.
    with tempfile.TemporaryDirectory(prefix="kvledger-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            port = _port(Path(profile), proc)
            return asyncio.run(_inspect(port, path.resolve().as_uri(), selector, expression))
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
