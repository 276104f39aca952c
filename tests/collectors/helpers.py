"""Helpers for the collectors tests: a ledger-backed sink, fixtures in the sim's convention."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from aiohttp import web

from collectors import DEFAULT_TTFT_METHOD, RequestSpec
from ledger import Event, Ledger, NewEvent, new_id

TIME_SCALE = 0.0001
VALUES = {"alpha": 938639, "beta": 412907, "gamma": 775123}
CONFIG = "c" * 64


class LedgerSink:
    """The runner's role: append each emitted event to the ledger under one run/block."""

    def __init__(self, led: Ledger, run_id: str | None = None, block_id: str | None = None) -> None:
        self.led = led
        self.run_id = run_id or new_id()
        self.block_id = block_id or new_id()

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        self.led.append(NewEvent(kind, data, run_id=self.run_id, block_id=self.block_id))

    def events(self, kind: str) -> list[Event]:
        return list(self.led.events(run_id=self.run_id, kind=kind))


def needle_prompt(filler_words: int = 600, tag: str = "") -> str:
    """Three needles (start, middle, end) and the question, per the sim's answer convention."""
    para = f"{tag} lorem ipsum dolor sit amet consectetur. " * (filler_words // 12 + 1)
    a, b, c = VALUES.values()
    return (
        f"# file {tag}\nalpha = {a}\n{para}\nbeta = {b}\n{para}\ngamma = {c}\n"
        "Return the values of alpha, beta and gamma as JSON."
    )


def spec(
    base_url: str,
    prompt: str,
    salt: str,
    *,
    replica: int = 0,
    step: str = "cold",
    chat: bool = False,
    max_tokens: int = 64,
    **body: Any,
) -> RequestSpec:
    """A streaming request with every ``request.sent`` field the ledger requires."""
    payload: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 314159,
        "cache_salt": salt,
        "stream": True,
        "stream_options": {"include_usage": True},
        **body,
    }
    if chat:
        payload["messages"] = [{"role": "user", "content": prompt}]
        payload["chat_template_kwargs"] = {"enable_thinking": False}
    else:
        payload["prompt"] = prompt
    meta = {
        "replica": replica,
        "gpu": None,
        "workload": "micro",
        "step": step,
        "chain": 0,
        "session": None,
        "window": None,
        "turn": None,
        "placement": "fixed",
        "warmup": False,
        "namespace": salt,
        "nominal_tokens": None,
        "fixture_id": None,
    }
    return RequestSpec(
        new_id(), base_url, "/v1/chat/completions" if chat else "/v1/completions", payload, meta
    )


VIAS = (DEFAULT_TTFT_METHOD, "httpx-read")
"""The client's two transports, by the TTFT method that picks each: collectors._http, httpx."""


def client(via: str, **kwargs: Any) -> httpx.AsyncClient:
    """A client for tests over ``via`` (the method passed to ``send_request`` picks the transport)."""
    return httpx.AsyncClient(**kwargs)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[str]:
    """A one-route aiohttp server on loopback answering POST /v1/completions."""
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
