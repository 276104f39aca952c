"""The streaming client over real loopback HTTP: sim replicas and small purpose-built servers."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import socket
import sys
import weakref

import httpx
import orjson
import pytest
from aiohttp import web

from collectors import RequestSpec, _http, payload_digest, run_concurrently, send_request
from experiments.targets.sim import SimDeployment
from ledger import Ledger, canonical_json, sha256_hex, verify
from tests.collectors.helpers import VALUES, Handler, LedgerSink, client, needle_prompt, serve, spec


def test_completion_stream_records_both_events(
    dep: SimDeployment, sink: LedgerSink, led: Ledger, via: str
) -> None:
    s = spec(dep.replica_urls[0], needle_prompt(), "ns-a")

    async def go() -> None:
        async with client(via) as c:
            o = await send_request(c, s, sink, method=via)
        assert o.ok and o.status == 200 and o.error is None
        assert orjson.loads(o.text) == VALUES
        assert o.prompt_tokens and o.prompt_tokens > 800
        assert o.output_tokens == o.content_chunks > 2
        assert o.cached_tokens == 0 and o.finish_reason == "stop"
        assert o.t_first is not None and o.t_last is not None and o.e2e_s is not None and o.ttft_s
        assert 0 < o.t_first == o.ttft_s <= o.t_last <= o.e2e_s
        assert o.sent_wall_ns and o.first_wall_ns and o.first_wall_ns > o.sent_wall_ns

    asyncio.run(go())
    sent = sink.events("request.sent")[0].data
    got = sink.events("response.received")[0].data
    assert sent["request_id"] == got["request_id"] == s.request_id
    assert sent["payload_sha256"] == sha256_hex(canonical_json(dict(s.body)))
    assert "prompt" not in sent["params"] and sent["params"]["cache_salt"] == "ns-a"
    assert got["text_sha256"] == hashlib.sha256(json.dumps(VALUES).encode()).hexdigest()
    assert got["error"] is None and got["status"] == 200 and got["output_text_prefix"].startswith("{")
    assert verify(led).ok


def test_chat_stream_counts_content_not_role_chunk(dep: SimDeployment, sink: LedgerSink, via: str) -> None:
    s = spec(dep.replica_urls[1], needle_prompt(), "ns-chat", replica=1, chat=True)

    async def go() -> None:
        async with client(via) as c:
            o = await send_request(c, s, sink, method=via)
        assert o.ok, o.error
        assert orjson.loads(o.text) == VALUES
        assert o.content_chunks == o.output_tokens

    asyncio.run(go())


def test_server_records_first_emit_under_our_request_id(
    dep: SimDeployment, sink: LedgerSink, via: str
) -> None:
    s = spec(dep.replica_urls[0], needle_prompt(), "ns-log")

    async def go() -> None:
        async with client(via) as c:
            o = await send_request(c, s, sink, method=via)
            log = (await c.get(dep.replica_urls[0] + "/sim/requests")).json()
        entry = next(e for e in log if e["request_id"] == s.request_id)
        assert o.first_wall_ns is not None and o.first_read_wall_ns is not None
        lag = o.first_wall_ns / 1e9 - entry["t_first_emit_unix"]
        assert 0 <= lag < 1.0  # arrival is never dated before the server wrote the token
        assert o.first_read_wall_ns >= o.first_wall_ns  # the read returns at or after arrival
        assert o.ttft_method == via  # on loopback under Linux the kernel stamps every read
        assert sink.events("response.received")[0].data["ttft_method"] == via

    asyncio.run(go())


def test_socket_read_dates_by_the_read_not_the_kernel(dep: SimDeployment, sink: LedgerSink) -> None:
    s = spec(dep.replica_urls[0], needle_prompt(), "ns-user")

    async def go() -> None:
        async with httpx.AsyncClient() as c:
            o = await send_request(c, s, sink, method="socket-read")
        assert o.ok and o.ttft_method == "socket-read"
        assert o.first_wall_ns == o.first_read_wall_ns  # no kernel correction applied

    asyncio.run(go())
    assert sink.events("response.received")[0].data["ttft_method"] == "socket-read"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux's")
def test_raw_transport_asks_for_kernel_receive_stamps() -> None:
    with socket.socket() as sock:
        assert _http._kernel_stamps(sock)
        assert sock.getsockopt(socket.SOL_SOCKET, _http._SO_TIMESTAMPNS) == 1
    # ... and keeps host-wide stamping on after that connection closed (the kernel turns it off,
    # by deferred work, when the last stamping socket closes, and new connections' first reads
    # would then go unstamped).
    (keeper,) = _http._STAMPING
    assert keeper.fileno() >= 0 and keeper.getsockopt(socket.SOL_SOCKET, _http._SO_TIMESTAMPNS) == 1


def test_one_client_across_event_loops_drops_the_earlier_loops_pool(
    dep: SimDeployment, sink: LedgerSink
) -> None:
    """A client reused by successive ``asyncio.run`` calls keeps no pool of a finished loop."""
    c = httpx.AsyncClient()  # a default client: the raw transport's pool
    pools: list[_http.Pool] = []

    async def go(salt: str) -> None:
        o = await send_request(c, spec(dep.replica_urls[0], needle_prompt(), salt), sink)
        assert o.ok, o.error
        pools.append(_http.pool_for(c, None))

    try:
        asyncio.run(go("ns-loop-1"))
        first = pools[0]
        socks = [conn.sock for stack in first.idle.values() for conn in stack]
        assert socks and all(s.fileno() >= 0 for s in socks)  # kept alive for reuse on that loop
        assert first.loop.is_closed()
        for n in (2, 3):
            asyncio.run(go(f"ns-loop-{n}"))
            assert pools[-1] is not pools[-2] and pools[-1].loop is not pools[-2].loop
            assert list(_http._POOLS[c].values()) == [pools[-1]]  # only the latest loop's pool
        assert all(s.fileno() == -1 for s in socks)  # the first loop's sockets were closed
        assert not first.idle
        gone = [weakref.ref(pools[0]), weakref.ref(pools[0].loop)]
        pools[:2] = []
        first = None
        gc.collect()
        assert [r() for r in gone] == [None, None]  # nothing holds the first loop or its pool
    finally:
        asyncio.run(c.aclose())


def test_payload_digest_is_replayable() -> None:
    body = {"prompt": "x", "max_tokens": 3, "cache_salt": "s", "stream": True}
    a, da = payload_digest(body)
    b, db = payload_digest(dict(reversed(list(body.items()))))
    assert a == b and da == db == hashlib.sha256(a).hexdigest()


def test_connection_refused_is_recorded_not_raised(sink: LedgerSink, via: str) -> None:
    s = spec("http://127.0.0.1:9", "hello", "ns")

    async def go() -> None:
        async with client(via) as c:
            o = await send_request(c, s, sink, timeout_s=5, method=via)
        assert not o.ok and o.status is None and o.error and o.error.startswith("connection error")

    asyncio.run(go())
    assert sink.events("response.received")[0].data["error"].startswith("connection error")


def raw_stream(*events: bytes) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
        await resp.write_eof()
        return resp

    return handler


def _chunk(text: str, finish: str | None = None) -> bytes:
    return (
        b"data: " + orjson.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]}) + b"\n\n"
    )


_USAGE = (
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,'
    b'"prompt_tokens_details":{"cached_tokens":2}}}\n\n'
)


def _run(handler: Handler, sink: LedgerSink, via: str, timeout_s: float = 5.0) -> list[str | None]:
    async def go() -> list[str | None]:
        async with serve(handler) as url, client(via) as c:
            o = await send_request(c, spec(url, "p", "ns"), sink, timeout_s=timeout_s, method=via)
        return [o.error, str(o.output_tokens), str(o.cached_tokens), o.text]

    return asyncio.run(go())


def test_split_frames_crlf_and_empty_first_chunk_are_handled(sink: LedgerSink, via: str) -> None:
    body = _chunk("") + _chunk("a") + _chunk("b") + _chunk("c", "stop") + _USAGE + b"data: [DONE]\n\n"
    crlf = body.replace(b"\n", b"\r\n")
    pieces = [crlf[i : i + 7] for i in range(0, len(crlf), 7)]  # frames split mid-line
    assert _run(raw_stream(*pieces), sink, via) == [None, "3", "2", "abc"]
    got = sink.events("response.received")[0].data
    assert got["decode_rate"] is None or got["decode_rate"] > 0
    assert got["finish_reason"] == "stop"


def _logprob_chunk(text: str, tops: list[list[float]], chat: bool) -> bytes:
    if chat:
        content = [
            {
                "token": text,
                "logprob": t[0],
                "top_logprobs": [{"token": str(i), "logprob": v} for i, v in enumerate(t)],
            }
            for t in tops
        ]
        choice: dict[str, object] = {
            "index": 0,
            "delta": {"content": text},
            "logprobs": {"content": content},
            "finish_reason": None,
        }
    else:
        choice = {
            "index": 0,
            "text": text,
            "finish_reason": None,
            "logprobs": {"top_logprobs": [{str(i): v for i, v in enumerate(t)} for t in tops]},
        }
    return b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n"


@pytest.mark.parametrize("chat", [True, False])
def test_top_logprob_margins_are_recorded_as_the_smallest_over_the_output(
    sink: LedgerSink, via: str, chat: bool
) -> None:
    body = (
        _logprob_chunk("a", [[-0.01, -6.5]], chat)
        + _logprob_chunk("b", [[-0.2, -1.95, -3.0]], chat)
        + _logprob_chunk("c", [[-0.5]], chat)
        + _chunk("", "stop")
        + _USAGE
        + b"data: [DONE]\n\n"
    )
    assert _run(raw_stream(body), sink, via)[0] is None
    got = sink.events("response.received")[0].data
    assert got["min_logprob_margin"] == pytest.approx(1.75)  # b's top two; c has one, no margin


def test_no_logprobs_asked_no_margin_field(sink: LedgerSink, via: str) -> None:
    _run(raw_stream(_chunk("a", "stop") + _USAGE + b"data: [DONE]\n\n"), sink, via)
    assert "min_logprob_margin" not in sink.events("response.received")[0].data


def test_malformed_chunk_is_recorded(sink: LedgerSink, via: str) -> None:
    err = _run(raw_stream(_chunk("a"), b"data: {not json\n\n", b"data: [DONE]\n\n"), sink, via)[0]
    assert err and err.startswith("malformed chunk")


def test_error_object_in_stream_is_recorded(sink: LedgerSink, via: str) -> None:
    error = b'data: {"error": {"message": "boom", "code": 500}}\n\n'
    err = _run(raw_stream(_chunk("a"), error), sink, via)[0]
    assert err == "stream error: boom"


def test_missing_done_and_missing_usage_are_truncation(sink: LedgerSink, via: str) -> None:
    assert _run(raw_stream(_chunk("a"), _USAGE), sink, via)[0] == "truncated stream: no [DONE]"
    no_usage = _run(raw_stream(_chunk("a"), b"data: [DONE]\n\n"), sink, via)[0]
    assert no_usage == "truncated stream: no usage chunk"


def test_http_error_keeps_body_snippet(sink: LedgerSink, via: str) -> None:
    async def fail(_: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "nope"}}, status=503)

    err = _run(fail, sink, via)[0]
    assert err and err.startswith("http 503: ") and "nope" in err


def test_timeout_is_recorded(sink: LedgerSink, via: str) -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_chunk("a"))
        await asyncio.sleep(2)
        return resp

    assert _run(slow, sink, via, timeout_s=0.3)[0] == "timeout"


def test_run_concurrently_respects_the_limit(sink: LedgerSink, via: str) -> None:
    state = {"now": 0, "peak": 0}

    async def handler(request: web.Request) -> web.StreamResponse:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.02)
        state["now"] -= 1
        return await raw_stream(_chunk("a"), _chunk("b"), _USAGE, b"data: [DONE]\n\n")(request)

    async def go() -> None:
        async with serve(handler) as url, client(via) as c:
            specs: list[RequestSpec] = [spec(url, f"p{i}", "ns") for i in range(12)]
            outs = await run_concurrently(c, specs, sink, limit=3, method=via)
        assert [o.request_id for o in outs] == [s.request_id for s in specs]
        assert all(o.ok for o in outs)

    asyncio.run(go())
    assert state["peak"] == 3


@pytest.mark.parametrize("chat", [True, False])
def test_each_token_is_kept_with_its_margin_for_divergence_triage(chat: bool) -> None:
    from collectors._client import _margins

    chunk = orjson.loads(_logprob_chunk("a", [[-0.01, -6.5], [-0.5]], chat)[6:])
    if not chat:  # completions name their tokens in a list beside the candidates
        chunk["choices"][0]["logprobs"]["tokens"] = ["a", "b"]
    (first, margin), (second, none) = _margins(chunk)
    assert (first, second) == ("a", "a" if chat else "b")
    assert margin == pytest.approx(6.49) and none is None  # one candidate: no margin
