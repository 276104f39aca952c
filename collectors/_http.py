"""A minimal HTTP/1.1 client for the streaming path: its own non-blocking sockets, keep-alive pool.

Why not httpx here: its per-read cost (httpcore, h11, anyio, three async
generator layers) is paid on the event loop between every SSE chunk, and
with 64 streams in flight a first token waits behind other streams' chunks.
This transport reads each socket itself (``loop.add_reader``) and does the
whole response synchronously per read: it stamps the read, decodes the
framing (chunked, Content-Length or until close) and hands the body bytes to
a callback. The waiting coroutine wakes once, when the response ends (or
fails), not once per chunk.

Stamps: a request that asks for them (``stamps=True``, the ``kernel-stamp``
TTFT method) has every read dated by the kernel's receive timestamp on Linux
(``SO_TIMESTAMPNS``, CLOCK_REALTIME, of the last segment the read consumed),
so a read is dated when its bytes reached this host's socket, not when a
busy loop or a descheduled process got to it; ``Response.stamped`` says
whether the current read's time is the kernel's. The stamp is turned into the
monotonic clock by subtracting its age, measured at the read, from
:func:`time.perf_counter`; a stamp older than 5 s or in the future (a clock
step) is ignored and the read's own time used, as it is where the kernel
gives none. A read that coalesced several segments takes the last one's
time: never earlier than its first byte arrived.

Scope, deliberately small: ``http://`` only, one request at a time per
connection (no pipelining), no redirects, no proxies, no compression
(``Accept-Encoding: identity``), no cookies or auth. :mod:`collectors._client`
uses it for the ``kernel-stamp`` and ``socket-read`` methods, chosen by the
caller; it sends only the request's own headers.

Failures raise httpx's own transport errors (``httpx.ConnectError``,
``ReadError``, ``WriteError``, ``RemoteProtocolError``, ``UnsupportedProtocol``),
so the client handles both transports' failures alike and recorded errors read
the same; the response's status, when its head was in, reached ``on_head``.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from httpx import (
    ConnectError,
    ReadError,
    RemoteProtocolError,
    TransportError,
    UnsupportedProtocol,
    WriteError,
)

from ._stamps import ANC_SIZE as _ANC_SIZE
from ._stamps import SO_TIMESTAMPNS as _SO_TIMESTAMPNS
from ._stamps import stamp_age_ns

__all__ = ["Pool", "Response", "pool_for"]

KEEPALIVE_EXPIRY_S = 4.0
"""Idle connections older than this are closed, not reused (uvicorn closes at 5 s)."""
_MAX_HEAD = 64 * 1024
_MAX_ERROR_BODY = 64 * 1024

BodySink = Callable[["Response", bytes, float, int], bool]
"""``sink(response, body_bytes, perf_counter_at_read, wall_ns_at_read)`` for each read with body bytes;
True stops the response there (the connection is dropped, the request ends normally)."""


class Response:
    """One response's head and framing state, filled by the connection's ``data_received``."""

    __slots__ = (
        "bytes_seen",
        "chunk_left",
        "close",
        "done",
        "framing",
        "head_done",
        "headers",
        "read_wall",
        "remaining",
        "sink",
        "stamped",
        "status",
        "use_stamps",
    )

    def __init__(
        self,
        sink: BodySink,
        head_done: asyncio.Future[None],
        done: asyncio.Future[None],
        use_stamps: bool = False,
    ) -> None:
        self.sink = sink
        self.use_stamps = use_stamps
        """Date reads by the kernel's receive stamp where it gives one."""
        self.stamped = False
        """The current read's time is the kernel's receive stamp (else when the read returned)."""
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.framing = ""  # "chunked" | "length" | "close"
        self.remaining = 0  # Content-Length bytes still due
        self.chunk_left = -1  # bytes left in the current chunk; -1: expecting a size line
        self.close = False  # the connection cannot be reused after this response
        self.bytes_seen = 0
        self.read_wall = 0
        """CLOCK_REALTIME (ns) at which the current read returned, before any kernel-stamp correction."""
        self.head_done = head_done
        self.done = done


def _resolve(fut: asyncio.Future[None], exc: BaseException | None = None) -> None:
    if not fut.done():
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


_READ_SIZE = 256 * 1024


def _kernel_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp each received segment (Linux); False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    _keep_stamping()
    return True


_STAMPING: list[socket.socket] = []


def _keep_stamping() -> None:
    """Hold one unconnected socket with stamps on for the rest of the process.

    Linux turns receive stamping on for the whole host when the first socket
    asks for it and off when the last such socket closes, both through
    deferred work: with connections opened and closed between requests, the
    first segments on a new connection could arrive before it is back on and
    carry no stamp (seen here: about 1 response in 30 with a fresh client per
    request). Holding one socket keeps it on from the first request that
    asks; reads that still get no stamp are dated by the read and recorded as
    ``socket-read``.
    """
    if _STAMPING:
        return
    keeper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        keeper.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        keeper.close()
        return
    _STAMPING.append(keeper)


class _Connection:
    """One keep-alive HTTP/1.1 connection on a non-blocking socket it reads itself.

    Reading the socket here (``loop.add_reader``) rather than through an
    asyncio transport lets each read carry the kernel's receive timestamp
    (``SO_TIMESTAMPNS``): the time the bytes reached this host's socket, not
    the later time at which a busy event loop, or a descheduled process, got
    round to reading them. The response state machine runs in
    :meth:`data_received`, synchronously, for every read.
    """

    def __init__(self, pool: Pool, key: tuple[str, int], sock: socket.socket) -> None:
        self.pool = pool
        self.key = key
        self.sock = sock
        self.fd = sock.fileno()
        self.stamps = False  # SO_TIMESTAMPNS is set on the first request that asks for stamps
        self.resp: Response | None = None
        self.buf = b""
        self.alive = True
        self.closed = False
        self.idle_since = 0.0
        self.idle_timer: asyncio.TimerHandle | None = None
        self.pending: memoryview | None = None  # request bytes the socket has not taken yet
        pool.loop.add_reader(self.fd, self._readable)

    # --- socket I/O -----------------------------------------------------------

    def _readable(self) -> None:
        try:
            if self.stamps:
                data, anc, _, _ = self.sock.recvmsg(_READ_SIZE, _ANC_SIZE)
            else:
                data, anc = self.sock.recv(_READ_SIZE), []
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        now, wall = time.perf_counter(), time.time_ns()
        if not data:
            self._lost(None)
            return
        resp = self.resp
        if resp is not None:
            resp.read_wall = wall
            resp.stamped = False
            age = stamp_age_ns(anc, wall) if resp.use_stamps else None
            if age is not None:
                now, wall = now - age / 1e9, wall - age
                resp.stamped = True
        self.data_received(data, now, wall)

    def write(self, message: bytes) -> None:
        """Send ``message``; what the socket does not take now goes when it is writable."""
        try:
            sent = self.sock.send(message)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._fail(WriteError(f"{type(exc).__name__}: {exc}"))
            return
        if sent < len(message):
            self.pending = memoryview(message)[sent:]
            self.pool.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        if self.pending is None or self.closed:
            return
        try:
            sent = self.sock.send(self.pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(WriteError(f"{type(exc).__name__}: {exc}"))
            return
        self.pending = self.pending[sent:] if sent < len(self.pending) else None
        if self.pending is None:
            self.pool.loop.remove_writer(self.fd)

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self.alive = False
        if self.closed:
            return
        self.closed = True
        self.pending = None
        if not self.pool.loop.is_closed():
            self.pool.loop.remove_reader(self.fd)
            self.pool.loop.remove_writer(self.fd)
        self.sock.close()

    # --- the response -----------------------------------------------------------

    def data_received(self, data: bytes, now: float, wall: int) -> None:
        """One read that arrived at ``now`` (perf_counter) / ``wall`` (ns since the epoch)."""
        resp = self.resp
        if resp is None:  # bytes on an idle connection: it is not ours to reuse
            self._fail(RemoteProtocolError("unexpected bytes on an idle connection"))
            return
        resp.bytes_seen += len(data)
        try:
            if resp.status is None:
                data = self.buf + data if self.buf else data
                end = data.find(b"\r\n\r\n")
                if end < 0:
                    if len(data) > _MAX_HEAD:
                        raise RemoteProtocolError("response head too large")
                    self.buf = data
                    return
                self.buf = b""
                self._head(resp, data[:end])
                _resolve(resp.head_done)
                data = data[end + 4 :]
                if not data and resp.framing != "length":
                    return
            self._body(resp, data, now, wall)
        except RemoteProtocolError as exc:
            self._fail(exc)

    # --- parsing ------------------------------------------------------------

    @staticmethod
    def _head(resp: Response, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise RemoteProtocolError(f"bad status line: {lines[0][:80]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise RemoteProtocolError(f"bad status line: {lines[0][:80]!r}") from None
        headers = resp.headers
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise RemoteProtocolError(f"bad header line: {line[:80]!r}")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        conn = headers.get("connection", "").lower()
        resp.close = "close" in conn or (parts[0] == b"HTTP/1.0" and "keep-alive" not in conn)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            resp.framing = "chunked"
        elif "content-length" in headers:
            try:
                resp.remaining = int(headers["content-length"])
            except ValueError:
                raise RemoteProtocolError("bad Content-Length") from None
            resp.framing = "length"
        elif status in (204, 304) or 100 <= status < 200:
            resp.framing, resp.remaining = "length", 0
        else:
            resp.framing, resp.close = "close", True
        resp.status = status

    def _body(self, resp: Response, data: bytes, now: float, wall: int) -> None:
        if resp.framing == "chunked":
            out = self._dechunk(resp, data)
            if out and resp.sink(resp, out, now, wall):
                self._stop(resp)
            elif resp.chunk_left == -2:
                self._complete(resp)
        elif resp.framing == "length":
            take = data[: resp.remaining]
            resp.remaining -= len(take)
            if take and resp.sink(resp, take, now, wall):
                self._stop(resp)
            elif resp.remaining == 0:
                if len(data) > len(take):
                    resp.close = True  # more than announced: do not reuse
                self._complete(resp)
        elif data and resp.sink(resp, data, now, wall):
            self._stop(resp)

    def _stop(self, resp: Response) -> None:
        """The reader has seen enough (e.g. a malformed chunk): end here, drop the connection."""
        resp.close = True
        self._complete(resp)

    def _dechunk(self, resp: Response, data: bytes) -> bytes:
        """Decode chunked framing; ``chunk_left`` -2 once the last chunk and trailers are in."""
        if self.buf:
            data, self.buf = self.buf + data, b""
        out: list[bytes] = []
        pos, n = 0, len(data)
        while pos < n:
            left = resp.chunk_left
            if left > 0:
                piece = data[pos : pos + left]
                out.append(piece)
                pos += len(piece)
                resp.chunk_left = left - len(piece)
                if resp.chunk_left == 0:
                    resp.chunk_left = -3  # the CRLF after the data is due
                continue
            if left == -3:
                if n - pos < 2:
                    self.buf = data[pos:]
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise RemoteProtocolError("chunk data not followed by CRLF")
                pos += 2
                resp.chunk_left = -1
                continue
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                self.buf = data[pos:]
                if n - pos > 4096:
                    raise RemoteProtocolError("chunk size line too long")
                break
            line = data[pos:eol]
            pos = eol + 2
            if left == -4:  # trailers: up to an empty line
                if not line:
                    resp.chunk_left = -2
                    if pos < n:
                        resp.close = True
                    break
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise RemoteProtocolError(f"bad chunk size line: {line[:40]!r}") from None
            resp.chunk_left = size if size > 0 else -4
        return b"".join(out) if len(out) != 1 else out[0]

    # --- endings --------------------------------------------------------------

    def _complete(self, resp: Response) -> None:
        self.resp = None
        if resp.close or self.pending is not None:  # answered before our body was all sent: not reusable
            self.close()
        _resolve(resp.done)

    def _fail(self, exc: BaseException) -> None:
        resp, self.resp = self.resp, None
        self.close()
        if resp is None:
            return
        if not resp.head_done.done():
            resp.head_done.set_exception(exc)
            resp.done.cancel()  # never awaited: no "exception never retrieved"
        else:
            _resolve(resp.done, exc)

    def _lost(self, exc: Exception | None) -> None:
        """The peer closed (``exc`` None) or the connection failed."""
        resp = self.resp
        if resp is None:
            self.close()
            return
        if exc is None and resp.status is not None and resp.framing == "close":
            self.close()
            self._complete(resp)
            return
        if exc is not None:
            err: TransportError = ReadError(f"{type(exc).__name__}: {exc}")
        elif resp.status is None:
            err = RemoteProtocolError("Server disconnected without sending a response.")
        else:
            err = RemoteProtocolError("peer closed connection without sending complete message body")
        self._fail(err)

    def abort(self) -> None:
        """Drop the connection (a cancelled or failed request, or idle too long)."""
        self.resp = None
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        self.close()


class Pool:
    """Keep-alive connections per (host, port), at most ``max_connections`` open at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_connections: int | None) -> None:
        self.loop = loop
        self.idle: dict[tuple[str, int], list[_Connection]] = {}
        self.gate = asyncio.Semaphore(max_connections) if max_connections else None

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        try:
            infos = await self.loop.getaddrinfo(key[0], key[1], type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ConnectError(str(exc) or type(exc).__name__) from exc
        error: OSError = OSError(f"no address for {key[0]}")
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await self.loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            return _Connection(self, key, sock)
        raise ConnectError(str(error) or type(error).__name__) from error

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        stack = self.idle.get(key)
        expiry = time.monotonic() - KEEPALIVE_EXPIRY_S
        while stack:
            conn = stack.pop()
            if conn.idle_timer is not None:
                conn.idle_timer.cancel()
                conn.idle_timer = None
            if conn.alive and not conn.closed and conn.idle_since >= expiry:
                return conn
            conn.abort()
        return None

    def _release(self, conn: _Connection) -> None:
        if conn.alive and conn.resp is None and not conn.closed:
            conn.idle_since = time.monotonic()
            self.idle.setdefault(conn.key, []).append(conn)
            # An idle connection is closed when it expires, so none outlives its use for long.
            conn.idle_timer = self.loop.call_later(KEEPALIVE_EXPIRY_S, self._expire, conn)
        else:
            conn.abort()

    def _expire(self, conn: _Connection) -> None:
        conn.idle_timer = None
        stack = self.idle.get(conn.key, [])
        if conn in stack:
            stack.remove(conn)
        conn.abort()

    def close(self) -> None:
        """Close every idle connection."""
        for stack in self.idle.values():
            for conn in stack:
                conn.abort()
        self.idle.clear()

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        sink: BodySink,
        on_head: Callable[[Response], None] | None = None,
        stamps: bool = False,
    ) -> Response:
        """Send one request and read the whole response through ``sink``.

        ``on_head`` is called once the status line and headers are in.
        ``stamps``: date reads by the kernel's receive stamps where it gives
        them (Linux); ``Response.stamped`` then says which reads were.
        A reused keep-alive connection that the server closed before answering
        is retried once on a fresh one. Cancellation (a timeout around this
        call) drops the connection.
        """
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise UnsupportedProtocol(f"unsupported URL for this transport: {url!r}")
        key = (parts.hostname, parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rsplit("@", 1)[-1]
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        message = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

        if self.gate is not None:
            await self.gate.acquire()
        try:
            for attempt in (0, 1):
                conn = self._take_idle(key) if attempt == 0 else None
                reused = conn is not None
                if conn is None:
                    conn = await self._connect(key)
                if stamps and not conn.stamps:
                    conn.stamps = _kernel_stamps(conn.sock)
                resp = Response(sink, self.loop.create_future(), self.loop.create_future(), stamps)
                conn.resp = resp
                try:
                    conn.write(message)
                    await resp.head_done
                    if on_head is not None:
                        on_head(resp)
                    await resp.done
                except (RemoteProtocolError, WriteError):
                    if reused and resp.bytes_seen == 0:
                        continue  # the server had closed this idle connection: once more, fresh
                    raise
                except BaseException:
                    conn.abort()
                    raise
                self._release(conn)
                return resp
            raise AssertionError("unreachable")
        finally:
            if self.gate is not None:
                self.gate.release()


_POOLS: weakref.WeakKeyDictionary[Any, dict[asyncio.AbstractEventLoop, Pool]] = weakref.WeakKeyDictionary()
"""Per owner (an httpx client), its pools by event loop; a pool serves one loop only."""


def _close_pools(pools: dict[asyncio.AbstractEventLoop, Pool]) -> None:
    for pool in pools.values():
        pool.close()
    pools.clear()


def pool_for(owner: Any, max_connections: int | None) -> Pool:
    """The pool tied to ``owner`` (an httpx client) on the running loop.

    A client used across several ``asyncio.run`` calls gets a pool per loop.
    When a new one is made, the pools of the owner's other loops that are
    closed (or not running) are dropped and their idle connections closed, so
    no earlier loop, its pool or its sockets stay alive until the client is
    garbage-collected. Pools of loops still running (another thread) are kept.
    """
    loop = asyncio.get_running_loop()
    pools = _POOLS.get(owner)
    if pools is None:
        pools = _POOLS[owner] = {}
        # Holds the pools, not the owner: the owner's collection closes what is left.
        weakref.finalize(owner, _close_pools, pools)
    pool = pools.get(loop)
    if pool is None:
        for other in [p for lp, p in pools.items() if lp.is_closed() or not lp.is_running()]:
            del pools[other.loop]
            other.close()  # safe on a closed loop: only the sockets are closed
        pool = pools[loop] = Pool(loop, max_connections)
    return pool
