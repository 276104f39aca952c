"""Every failure the client can meet, against the real sim (its injected faults) over both transports.

Each case checks that ``send_request`` returns (never raises), that the
outcome and the ``response.received`` event carry the same short reason, and
that what did arrive is kept (status, first-token time, text so far).
"""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import orjson
import pytest
from aiohttp import web

from collectors import DEFAULT_TTFT_METHOD, Outcome, send_request
from experiments.targets.sim import SimDeployment
from tests.collectors.helpers import TIME_SCALE, VALUES, LedgerSink, client, needle_prompt, serve, spec


def _send(
    url: str, sink: LedgerSink, via: str, *, times: int = 1, timeout_s: float = 10.0, **kw: object
) -> list[Outcome]:
    async def go() -> list[Outcome]:
        async with client(via) as c:
            return [
                await send_request(
                    c, spec(url, needle_prompt(), f"ns-{via}", **kw), sink, timeout_s=timeout_s, method=via
                )
                for _ in range(times)
            ]

    return asyncio.run(go())


def _recorded(sink: LedgerSink, o: Outcome) -> dict[str, object]:
    got = next(e.data for e in sink.events("response.received") if e.data["request_id"] == o.request_id)
    assert got["error"] == o.error and got["status"] == o.status and got["ok"] == o.ok
    return got


def test_the_method_is_chosen_not_inferred_from_the_client(sink: LedgerSink) -> None:
    """``httpx-read`` honours the client's configuration; the raw methods use only its pool."""
    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("x-client-setting"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"text":"a"}]}\n\ndata: [DONE]\n\n')
        await resp.write_eof()
        return resp

    async def go() -> list[Outcome]:
        async with serve(handler) as url, httpx.AsyncClient(headers={"x-client-setting": "kept"}) as c:
            return [
                await send_request(c, spec(url, "p", "ns"), sink, method=m)
                for m in ("httpx-read", "socket-read", DEFAULT_TTFT_METHOD)
            ]

    outcomes = asyncio.run(go())
    assert all(o.status == 200 and o.ttft_s is not None for o in outcomes), [o.error for o in outcomes]
    assert seen == ["kept", None, None]
    assert [_recorded(sink, o)["ttft_method"] for o in outcomes] == [
        "httpx-read",
        "socket-read",
        DEFAULT_TTFT_METHOD,
    ]
    with pytest.raises(ValueError, match="unknown TTFT method 'guess'"):
        asyncio.run(
            send_request(httpx.AsyncClient(), spec("http://127.0.0.1:1", "p", "ns"), sink, method="guess")
        )
    assert len(sink.events("request.sent")) == 3  # refused before anything was recorded


def test_a_raw_method_on_https_is_a_recorded_client_error(sink: LedgerSink) -> None:
    async def go() -> Outcome:
        async with httpx.AsyncClient() as c:
            return await send_request(c, spec("https://127.0.0.1:1", "p", "ns"), sink, method="socket-read")

    o = asyncio.run(go())
    assert not o.ok and o.error is not None and "unsupported URL for this transport" in o.error
    assert _recorded(sink, o)["ttft_method"] == "socket-read"


def test_sim_http_errors_fault_is_recorded(sink: LedgerSink, via: str) -> None:
    with SimDeployment(1, time_scale=TIME_SCALE, fault="http-errors:every=2:status=503") as d:
        ok, failed = _send(d.replica_urls[0], sink, via, times=2)
    assert ok.ok and orjson.loads(ok.text) == VALUES
    assert not failed.ok and failed.status == 503 and failed.ttft_s is None
    assert failed.error and failed.error.startswith("http 503: ") and "http-errors fault" in failed.error
    assert _recorded(sink, failed)["text_sha256"] is None


@pytest.mark.parametrize("chat", [False, True])
def test_sim_truncated_stream_fault_is_recorded(sink: LedgerSink, via: str, chat: bool) -> None:
    with SimDeployment(1, time_scale=TIME_SCALE, fault="truncated-stream:after=3") as d:
        (o,) = _send(d.replica_urls[0], sink, via, chat=chat)
    assert not o.ok and o.status == 200 and o.error == "truncated stream: no [DONE]"
    assert o.content_chunks == 3 and o.ttft_s is not None and o.t_last is not None
    assert o.output_tokens is None and o.finish_reason is None  # no usage chunk came
    assert _recorded(sink, o)["text_sha256"] == hashlib.sha256(o.text.encode()).hexdigest()


def test_sim_dead_replica_after_truncation(sink: LedgerSink, via: str) -> None:
    with SimDeployment(1, time_scale=TIME_SCALE, fault="truncated-stream:after=1:die=1") as d:
        cut, dead = _send(d.replica_urls[0], sink, via, times=2)
    assert cut.error == "truncated stream: no [DONE]"
    assert dead.status == 503 and dead.error and dead.error.startswith("http 503")


def test_sim_slow_start_past_the_timeout_is_recorded(sink: LedgerSink, via: str) -> None:
    # 20,000 simulated seconds at the tests' scale: a 2 s prefill, past a 0.8 s timeout that
    # still leaves the headers (sent before the prefill) time to come on a loaded machine.
    delay_s, timeout_s = 20_000 * TIME_SCALE, 0.8
    with SimDeployment(1, time_scale=TIME_SCALE, fault="slow-start:requests=1:delay=20000") as d:
        (late,) = _send(d.replica_urls[0], sink, via, timeout_s=timeout_s)
        (fine,) = _send(d.replica_urls[0], sink, via)  # queued behind the first's prefill
    assert late.error == "timeout" and not late.ok and late.ttft_s is None
    assert late.status == 200  # the headers came before the prefill, as vLLM sends them
    assert late.e2e_s is not None and 0.9 * timeout_s < late.e2e_s < delay_s
    assert fine.ok, fine.error
    _recorded(sink, late)


def test_connection_reset_mid_stream_is_truncation(sink: LedgerSink, via: str) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"text":"a"}]}\n\n')
        assert request.transport is not None
        request.transport.abort()  # the engine process died mid-write
        return resp

    async def go() -> Outcome:
        async with serve(handler) as url, client(via) as c:
            return await send_request(c, spec(url, "p", "ns"), sink, timeout_s=5, method=via)

    o = asyncio.run(go())
    assert o.status == 200 and o.text == "a" and o.ttft_s is not None
    assert o.error and o.error.startswith("truncated stream: connection lost")
    _recorded(sink, o)


def test_timings_usage_and_cached_tokens_on_a_repeat(sink: LedgerSink, via: str) -> None:
    with SimDeployment(1, time_scale=0.05) as d:  # 1 ms per output token: tokens in separate reads
        cold, warm = _send(d.replica_urls[0], sink, via, times=2)
    for o in (cold, warm):
        assert o.ok and orjson.loads(o.text) == VALUES and o.output_tokens
        assert o.ttft_s is not None and o.t_first is not None and o.t_last is not None and o.e2e_s
        assert 0 < o.ttft_s == o.t_first <= o.t_last <= o.e2e_s
        assert o.decode_rate == pytest.approx((o.output_tokens - 1) / (o.t_last - o.t_first))
        assert o.text_sha256 == hashlib.sha256(o.text.encode()).hexdigest()
    assert cold.cached_tokens == 0
    assert warm.cached_tokens and warm.prompt_tokens and warm.cached_tokens >= warm.prompt_tokens - 16


def test_keepalive_survives_a_sim_restart(sink: LedgerSink, via: str) -> None:
    with SimDeployment(1, time_scale=TIME_SCALE) as d:
        url = d.replica_urls[0]

        async def go() -> list[Outcome]:
            async with client(via) as c:
                first = await send_request(c, spec(url, needle_prompt(), "ns"), sink, method=via)
                await asyncio.to_thread(d.restart)  # the server drops its keep-alive connections
                second = await send_request(c, spec(url, needle_prompt(), "ns"), sink, method=via)
                return [first, second]

        outs = asyncio.run(go())
    assert all(o.ok for o in outs), [o.error for o in outs]
    assert outs[1].cached_tokens == 0  # a fresh launch: empty cache


def _raw_server_run(reply: bytes, sink: LedgerSink, via: str) -> Outcome:
    """A bare TCP server that reads the request head and answers ``reply`` then closes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = next(int(ln.split(b":")[1]) for ln in lines if ln.startswith(b"content-length"))
        await reader.readexactly(length)
        writer.write(reply)
        await writer.drain()
        writer.close()

    async def go() -> Outcome:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with client(via) as c:
                return await send_request(
                    c, spec(f"http://127.0.0.1:{port}", "p", "ns"), sink, timeout_s=5, method=via
                )
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(go())


_EVENTS = (
    b'data: {"choices":[{"index":0,"text":"a"}]}\n\ndata: {"choices":[{"index":0,"text":"b",'
    b'"finish_reason":"stop"}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":1,'
    b'"completion_tokens":2}}\n\ndata: [DONE]\n\n'
)


def test_body_delimited_by_close_is_complete(sink: LedgerSink, via: str) -> None:
    o = _raw_server_run(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + _EVENTS,
        sink,
        via,
    )
    assert o.ok and o.text == "ab" and o.output_tokens == 2, o.error


def test_content_length_stream_cut_short_is_truncation(sink: LedgerSink, via: str) -> None:
    length = len(_EVENTS) + 50  # announced, never sent
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % length
    o = _raw_server_run(head + _EVENTS, sink, via)
    assert o.status == 200 and o.text == "ab" and not o.ok
    assert o.error and o.error.startswith("truncated stream: connection lost"), o.error


def test_garbage_instead_of_http_is_a_connection_error(sink: LedgerSink, via: str) -> None:
    o = _raw_server_run(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", sink, via)
    assert o.status is None and not o.ok
    assert o.error and o.error.startswith("connection error: RemoteProtocolError"), o.error
    _recorded(sink, o)
