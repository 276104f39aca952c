"""The streaming OpenAI-compatible client: one request in, two events out.

Timing rules (the seed's Section 4.3):

- ``t0`` is taken on the monotonic clock (:func:`time.perf_counter`) just
  before the request is handed to the transport, after ``request.sent`` is emitted.
- Every read from the socket is stamped on arrival, *before* its bytes are
  split into SSE lines or parsed as JSON; a content chunk takes the stamp of
  the read that delivered it. So parsing cost never shifts ``t_first``.
- How a read is stamped is the caller's explicit choice, ``method`` (one of
  :data:`TTFT_METHODS`, default :data:`DEFAULT_TTFT_METHOD`), and every
  ``response.received`` records, as ``ttft_method``, the one that dated its
  first content chunk: ``kernel-stamp`` (the raw transport,
  :mod:`collectors._http`; the kernel's receive time of the read's bytes,
  ``SO_TIMESTAMPNS``, so neither a busy event loop nor a descheduled client
  process delays it), ``socket-read`` (the raw transport; when the client's
  read returned: asked for, or the kernel gave no usable stamp for that read),
  ``httpx-read`` (through httpx, honouring the client's whole configuration;
  when httpx handed the read over). A response without content records the
  method it was sent with.
- ``t_first`` / ``ttft_s``: arrival of the first chunk whose text
  (``choices[0].text``, completions) or ``choices[0].delta.content`` (chat)
  is non-empty. Role-only, empty and usage chunks do not count, nor does
  ``reasoning_content``.
- ``t_last``: arrival of the last content chunk; ``e2e_s``: end of the stream.
- ``decode_rate`` = (N_out - 1) / (t_last - t_first), N_out the usage's
  ``completion_tokens``; null when N_out < 2 or t_last == t_first.

Failures are recorded in ``response.received.error`` and in the returned
:class:`Outcome`, never raised: ``http N: body...``, ``timeout``,
``connection error: ...``, ``malformed chunk: ...``, ``stream error: ...``
(an error object inside the stream, as vLLM sends them),
``truncated stream: no [DONE]`` / ``truncated stream: no usage chunk`` /
``truncated stream: connection lost (...)``.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import orjson

from ledger import canonical_json, sha256_hex

from . import _http

__all__ = [
    "DEFAULT_TTFT_METHOD",
    "TTFT_METHODS",
    "EventSink",
    "Outcome",
    "RequestSpec",
    "payload_digest",
    "request_params",
    "response_data",
    "run_concurrently",
    "send_request",
]

DEFAULT_TIMEOUT_S = 600.0
TTFT_METHODS: dict[str, str] = {
    "kernel-stamp": "kernel receive timestamp of the read (SO_TIMESTAMPNS), raw socket transport",
    "socket-read": "user-space time the read returned, raw socket transport",
    "httpx-read": "user-space time httpx handed the read over, httpx transport",
}
"""Which transport and clock date ``t_first``/``t_last`` (``response.received.ttft_method``)."""
DEFAULT_TTFT_METHOD = "kernel-stamp" if sys.platform.startswith("linux") else "socket-read"
"""The kernel's stamp where there is one: it dates the bytes' arrival at this host, so the
client's own load (many streams, a busy event loop, descheduling) does not enter TTFT."""
_PROMPT_FIELDS = ("prompt", "messages")
_ERROR_SNIPPET = 200
_TEXT_PREFIX = 200
_HEADERS = {"content-type": "application/json", "accept": "text/event-stream"}


class EventSink(Protocol):
    """Where collectors put events; the runner binds run_id/block_id."""

    def emit(self, kind: str, data: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class RequestSpec:
    """One request: the exact JSON body and the ``request.sent`` metadata."""

    request_id: str
    base_url: str
    path: str
    body: Mapping[str, Any]
    meta: Mapping[str, Any] = field(default_factory=dict)
    text_chars: int = _TEXT_PREFIX
    """How much of the answer ``response.received.output_text_prefix`` keeps: a checked answer
    longer than the default (an every-line one) is kept whole, so the audit reads it itself."""


@dataclass(frozen=True)
class Outcome:
    """What came back. Times are seconds relative to the send (monotonic)."""

    request_id: str
    status: int | None
    text: str
    ttft_s: float | None
    t_first: float | None
    t_last: float | None
    e2e_s: float | None
    prompt_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    finish_reason: str | None
    error: str | None
    ok: bool
    decode_rate: float | None = None
    text_sha256: str | None = None
    usage: Mapping[str, Any] | None = None
    content_chunks: int = 0
    sent_wall_ns: int | None = None
    """CLOCK_REALTIME at the send (time.time_ns), for cross-process comparisons."""
    first_wall_ns: int | None = None
    """CLOCK_REALTIME at which the first content chunk arrived (the kernel's receive stamp
    on the raw transport under Linux, else when the read returned)."""
    first_read_wall_ns: int | None = None
    """CLOCK_REALTIME when the client's read of that chunk returned (>= ``first_wall_ns``)."""
    ttft_method: str = DEFAULT_TTFT_METHOD
    """What dated ``t_first`` (one of :data:`TTFT_METHODS`)."""
    min_logprob_margin: float | None = None
    """With ``top_logprobs`` >= 2 asked: the smallest top-1 minus top-2 logprob over the output
    tokens (how near a tie the closest greedy choice was); None when not asked."""
    token_margins: tuple[tuple[str | None, float | None], ...] = ()
    """With logprobs asked: each output token as served and its top-1 minus top-2 logprob
    (None with fewer than two candidates); where an answer first diverges, and how near a tie
    that token was (the runner's divergence triage). Not recorded in ``response.received``."""


def request_params(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body without its prompt/messages (``request.sent.params``)."""
    return {k: v for k, v in body.items() if k not in _PROMPT_FIELDS}


def payload_digest(body: Mapping[str, Any]) -> tuple[bytes, str]:
    """Canonical JSON bytes of ``body`` (what is sent) and their SHA-256."""
    payload = canonical_json(dict(body))
    return payload, sha256_hex(payload)


def _content(obj: Any) -> tuple[str | None, str | None]:
    """(content text, finish_reason) of a parsed chunk's first choice."""
    choices = obj.get("choices")
    if not choices:
        return None, None
    choice = choices[0]
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta")
        if delta:
            text = delta.get("content")
    return text, choice.get("finish_reason")


def _margins(obj: Any) -> list[tuple[str | None, float | None]]:
    """Each token of a chunk whose first choice has logprobs, with its top-1 minus top-2 logprob
    (chat: ``content[].token`` and ``top_logprobs[]``; completions: ``tokens[]`` and
    ``top_logprobs[]`` as token → logprob); the margin None with fewer than two candidates."""
    choices = obj.get("choices")
    logprobs = choices[0].get("logprobs") if choices else None
    if not isinstance(logprobs, dict):
        return []
    tokens: list[Any]
    if isinstance(logprobs.get("content"), list):
        items = [item for item in logprobs["content"] if isinstance(item, dict)]
        tokens = [item.get("token") for item in items]
        tops = [[t.get("logprob") for t in (item.get("top_logprobs") or [])] for item in items]
    else:
        tops = [list(d.values()) for d in logprobs.get("top_logprobs") or [] if isinstance(d, dict)]
        tokens = list(logprobs.get("tokens") or [None] * len(tops))
    out: list[tuple[str | None, float | None]] = []
    for token, values in zip(tokens, tops, strict=False):
        ranked = sorted((v for v in values if isinstance(v, int | float)), reverse=True)
        margin = float(ranked[0] - ranked[1]) if len(ranked) >= 2 else None
        out.append((token if isinstance(token, str) else None, margin))
    return out


class _Stream:
    """Incremental SSE parser state for one response (kept small: it is per chunk)."""

    __slots__ = (
        "buf",
        "done",
        "error",
        "finish",
        "first",
        "first_method",
        "first_read_wall",
        "first_wall",
        "last",
        "margin",
        "margins",
        "method",
        "n_content",
        "pieces",
        "read_wall",
        "usage",
        "wall",
    )

    def __init__(self, method: str) -> None:
        self.buf = b""
        self.method = method  # what dated the current read, kept until the first content
        self.first_method = method
        self.pieces: list[str] = []
        self.first: float | None = None
        self.first_wall: int | None = None
        self.wall = 0  # CLOCK_REALTIME of the current read's arrival, kept until the first content
        self.read_wall = 0  # ... and of its return to the client (no kernel stamp)
        self.first_read_wall: int | None = None
        self.last: float | None = None
        self.usage: dict[str, Any] | None = None
        self.finish: str | None = None
        self.done = False
        self.error: str | None = None
        self.n_content = 0
        self.margin: float | None = None
        self.margins: list[tuple[str | None, float | None]] = []

    def feed(self, raw: bytes, now: float) -> None:
        """Consume one socket read that arrived at ``now`` (perf_counter)."""
        data = self.buf + raw if self.buf else raw
        lines = data.split(b"\n")
        self.buf = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event:/id: fields
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            if self.done or self.error is not None:
                continue
            self._event(payload, now)

    def _event(self, payload: bytes, now: float) -> None:
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            self.error = f"malformed chunk: {exc}"[:_ERROR_SNIPPET]
            return
        if not isinstance(obj, dict):
            self.error = f"malformed chunk: not an object: {payload[:80]!r}"
            return
        if "error" in obj and "choices" not in obj:
            err = obj["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            self.error = f"stream error: {msg}"[:_ERROR_SNIPPET]
            return
        text, finish = _content(obj)
        if text:
            if self.first is None:
                self.first = now
                self.first_wall = self.wall
                self.first_read_wall = self.read_wall or self.wall
                self.first_method = self.method
            self.last = now
            self.n_content += 1
            self.pieces.append(text)
        if finish is not None:
            self.finish = finish
        if b'"logprobs"' in payload:  # only when asked for: the common path stays one lookup
            for token_margin in _margins(obj):
                self.margins.append(token_margin)
                m = token_margin[1]
                if m is not None:
                    self.margin = m if self.margin is None else min(self.margin, m)
        usage = obj.get("usage")
        if usage:
            self.usage = usage

    def end(self, now: float) -> None:
        """The stream closed (last read at ``now``): a trailing unterminated line is still an event."""
        if self.buf.strip():
            tail, self.buf = self.buf, b""
            self.feed(tail + b"\n", now)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _decode_rate(n_out: int | None, t_first: float | None, t_last: float | None) -> float | None:
    if n_out is None or n_out < 2 or t_first is None or t_last is None or t_last <= t_first:
        return None
    return (n_out - 1) / (t_last - t_first)


async def _error_body(resp: httpx.Response) -> bytes:
    try:
        return await resp.aread()
    except httpx.HTTPError:
        return b""


def _http_error(status: int | None, body: bytes | bytearray) -> str:
    """``http <status>: <start of the body>``, the error recorded for a non-200 answer."""
    snippet = bytes(body[:_ERROR_SNIPPET]).decode("utf-8", "replace").strip()
    return f"http {status}: {snippet}".rstrip(": ")


@dataclass
class _Exchange:
    """What one transport call found out, besides the stream itself."""

    status: int | None = None
    error: str | None = None


def _transport_error(ex: _Exchange, kind: str, detail: str) -> None:
    reason = f"{kind}: {detail}"
    if ex.status == 200:
        ex.error = f"truncated stream: connection lost ({reason})"
    else:
        ex.error = f"connection error: {reason}"


async def _via_httpx(
    client: httpx.AsyncClient,
    url: str,
    payload: bytes,
    headers: dict[str, str],
    st: _Stream,
    ex: _Exchange,
    timeout_s: float,
) -> None:
    request = client.build_request("POST", url, content=payload, headers=headers, timeout=timeout_s)
    try:
        resp = await client.send(request, stream=True)
    except httpx.TimeoutException:
        raise TimeoutError from None
    except httpx.TransportError as exc:
        _transport_error(ex, type(exc).__name__, str(exc))
        return
    try:
        ex.status = resp.status_code
        if ex.status != 200:
            ex.error = _http_error(ex.status, await _error_body(resp))
            return
        perf, wall, now = time.perf_counter, time.time_ns, time.perf_counter()
        async for raw in resp.aiter_raw():
            now = perf()
            if st.first is None:
                st.wall = wall()
            st.feed(raw, now)
            if st.error is not None:
                break
        st.end(now)
    except httpx.TimeoutException:
        raise TimeoutError from None
    except httpx.TransportError as exc:
        _transport_error(ex, type(exc).__name__, str(exc))
    finally:
        await resp.aclose()


async def _via_raw(
    pool: _http.Pool,
    url: str,
    payload: bytes,
    headers: dict[str, str],
    st: _Stream,
    ex: _Exchange,
    stamps: bool,
) -> None:
    """The same exchange on the raw transport: SSE parsed inside ``data_received``."""
    error_body = bytearray()
    last = [0.0]

    def body(resp: _http.Response, data: bytes, now: float, wall: int) -> bool:
        if resp.status != 200:
            if len(error_body) < _ERROR_SNIPPET:
                error_body.extend(data[:_ERROR_SNIPPET])
            return False
        if st.first is None:
            st.wall, st.read_wall = wall, resp.read_wall
            st.method = "kernel-stamp" if resp.stamped else "socket-read"
        last[0] = now
        st.feed(data, now)
        return st.error is not None

    try:
        resp = await pool.request(
            "POST",
            url,
            {**headers, "accept-encoding": "identity"},
            payload,
            body,
            on_head=lambda r: setattr(ex, "status", r.status),
            stamps=stamps,
        )
    except httpx.TransportError as exc:
        if ex.status is not None and ex.status != 200:  # on_head saw the status
            ex.error = _http_error(ex.status, error_body)
        else:
            _transport_error(ex, type(exc).__name__, str(exc))
        return
    ex.status = resp.status
    if ex.status != 200:
        ex.error = _http_error(ex.status, error_body)
        return
    st.end(last[0])


async def send_request(
    client: httpx.AsyncClient,
    spec: RequestSpec,
    sink: EventSink,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    method: str = DEFAULT_TTFT_METHOD,
    max_connections: int | None = None,
) -> Outcome:
    """Send ``spec`` streaming, emit ``request.sent`` / ``response.received``.

    Never raises for server or network faults; they are recorded in the
    outcome's ``error`` (see the module doc). ``timeout_s`` bounds the whole
    request. ``method`` (see :data:`TTFT_METHODS`) picks the transport and
    clock: ``kernel-stamp`` and ``socket-read`` go over :mod:`collectors._http`
    (``http://`` only; ``client`` only owns the connection pool, at most
    ``max_connections`` open, and none of its settings apply), ``httpx-read``
    goes through ``client`` with all its settings. Raises ValueError for an
    unknown method.
    """
    if method not in TTFT_METHODS:
        raise ValueError(f"unknown TTFT method {method!r}; one of {', '.join(TTFT_METHODS)}")
    payload, digest = payload_digest(spec.body)
    wants_usage = bool((spec.body.get("stream_options") or {}).get("include_usage"))
    sent = {
        **spec.meta,
        "request_id": spec.request_id,
        "payload_sha256": digest,
        "params": request_params(spec.body),
    }
    url = spec.base_url.rstrip("/") + spec.path
    headers = {**_HEADERS, "x-request-id": spec.request_id}
    pool = None if method == "httpx-read" else _http.pool_for(client, max_connections)
    st, ex = _Stream(method), _Exchange()
    sink.emit("request.sent", sent)

    sent_wall = time.time_ns()
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            if pool is not None:
                await _via_raw(pool, url, payload, headers, st, ex, method == "kernel-stamp")
            else:
                await _via_httpx(client, url, payload, headers, st, ex, timeout_s)
    except TimeoutError:
        ex.error = "timeout"
    except httpx.HTTPError as exc:  # e.g. an invalid URL
        ex.error = f"client error: {type(exc).__name__}: {exc}"
    t_end = time.perf_counter()
    return _finish(spec, sink, st, ex, wants_usage, t0, t_end, sent_wall)


def _finish(
    spec: RequestSpec,
    sink: EventSink,
    st: _Stream,
    ex: _Exchange,
    wants_usage: bool,
    t0: float,
    t_end: float,
    sent_wall: int,
) -> Outcome:
    """Judge the stream, build the outcome and emit ``response.received``."""
    status, error = ex.status, ex.error
    if error is None and status == 200:
        if st.error is not None:
            error = st.error
        elif not st.done:
            error = "truncated stream: no [DONE]"
        elif wants_usage and st.usage is None:
            error = "truncated stream: no usage chunk"
    error = error[:_ERROR_SNIPPET] if error else None

    usage = st.usage or {}
    details = usage.get("prompt_tokens_details") or {}
    prompt_tokens = _int(usage.get("prompt_tokens"))
    output_tokens = _int(usage.get("completion_tokens"))
    cached_tokens = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    text = "".join(st.pieces)
    text_sha = hashlib.sha256(text.encode()).hexdigest() if status == 200 else None
    t_first = None if st.first is None else st.first - t0
    t_last = None if st.last is None else st.last - t0
    outcome = Outcome(
        request_id=spec.request_id,
        status=status,
        text=text,
        ttft_s=t_first,
        t_first=t_first,
        t_last=t_last,
        e2e_s=t_end - t0,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        cached_tokens=cached_tokens,
        finish_reason=st.finish,
        error=error,
        ok=status == 200 and error is None,
        decode_rate=_decode_rate(output_tokens, t_first, t_last),
        text_sha256=text_sha,
        usage=st.usage,
        content_chunks=st.n_content,
        sent_wall_ns=sent_wall,
        first_wall_ns=st.first_wall,
        first_read_wall_ns=st.first_read_wall,
        ttft_method=st.first_method,
        min_logprob_margin=st.margin,
        token_margins=tuple(st.margins),
    )
    sink.emit("response.received", response_data(outcome, spec.text_chars))
    return outcome


def response_data(outcome: Outcome, text_chars: int = _TEXT_PREFIX) -> dict[str, Any]:
    """The ``response.received`` data of an outcome: the text's first ``text_chars`` characters
    and its digest (a fixture's answer is kept whole, a long generation is not);
    ``min_logprob_margin`` only when the request asked for top logprobs."""
    data = {
        "request_id": outcome.request_id,
        "status": outcome.status,
        "ttft_s": outcome.ttft_s,
        "t_first": outcome.t_first,
        "t_last": outcome.t_last,
        "e2e_s": outcome.e2e_s,
        "prompt_tokens": outcome.prompt_tokens,
        "output_tokens": outcome.output_tokens,
        "cached_tokens": outcome.cached_tokens,
        "decode_rate": outcome.decode_rate,
        "text_sha256": outcome.text_sha256,
        "finish_reason": outcome.finish_reason,
        "error": outcome.error,
        "output_text_prefix": outcome.text[:text_chars],
        "content_chunks": outcome.content_chunks,
        "ok": outcome.ok,
        "ttft_method": outcome.ttft_method,
    }
    if outcome.min_logprob_margin is not None:
        data["min_logprob_margin"] = outcome.min_logprob_margin
    return data


async def run_concurrently(
    client: httpx.AsyncClient,
    specs: Iterable[RequestSpec],
    sink: EventSink,
    limit: int,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    method: str = DEFAULT_TTFT_METHOD,
) -> list[Outcome]:
    """Send every spec with at most ``limit`` in flight; outcomes in spec order (``method``: see
    :func:`send_request`)."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    gate = asyncio.Semaphore(limit)

    async def one(spec: RequestSpec) -> Outcome:
        async with gate:
            return await send_request(client, spec, sink, timeout_s, method=method, max_connections=limit)

    return list(await asyncio.gather(*(one(s) for s in specs)))
