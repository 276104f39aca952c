"""When a request reached a replica: the kernel's receive time of its first bytes.

The latency model counts from a request's arrival. Taken when its handler
starts, arrival would come after however long the sim's own process took to
be scheduled and read the socket: on a busy machine, milliseconds that a
client sees added to the modelled time instead of spent inside it, as the
sim's other work is. So each accepted connection is read with ``recvmsg``
and ``SO_TIMESTAMPNS`` (Linux), as the collectors' client reads its side, and
a request's arrival is the stamp of the read that brought its first bytes.
Where the kernel gives no stamp, it is the time of that read.

A connection's stamp is taken by the request it belongs to and cleared when
that request's handling ends (:func:`arrival_middleware`), so the next
request on a keep-alive connection is dated by its own bytes, never earlier.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from collectors._stamps import ANC_SIZE, SO_TIMESTAMPNS, stamp_age_ns

__all__ = ["StampingListener", "arrival", "arrival_middleware"]

# Kernel stamps where the platform gives them (Linux); the client's reads use the same.
_SO_TIMESTAMPNS: int | None = SO_TIMESTAMPNS if sys.platform.startswith("linux") else None

# Open stamped connections by file descriptor (unique among open sockets), for the handler.
_OPEN: weakref.WeakValueDictionary[int, _StampedConnection] = weakref.WeakValueDictionary()


class _StampedConnection(socket.socket):
    """An accepted connection whose reads note when the current request's first bytes came."""

    arrived: float | None = None
    """Monotonic time of the first read since the last request ended; None before it."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if _SO_TIMESTAMPNS is None:
            data = super().recv(bufsize, flags)
            if data and self.arrived is None:
                self.arrived = time.monotonic()
            return data
        data, ancillary, _, _ = self.recvmsg(bufsize, ANC_SIZE, flags)
        if data and self.arrived is None:
            self.arrived = _monotonic_stamp(ancillary)
        return data


def _monotonic_stamp(ancillary: list[tuple[int, int, bytes]]) -> float:
    """The read's kernel receive time on the monotonic clock (now, where it carries none)."""
    mono = time.monotonic()
    age = stamp_age_ns(ancillary, time.time_ns())
    return mono if age is None else mono - age / 1e9


class StampingListener(socket.socket):
    """A listening socket (for ``web.SockSite``) whose accepted connections are stamped."""

    @classmethod
    def open(cls, host: str, port: int) -> StampingListener:
        """Bound to ``host``:``port`` (0: any free port), listening, non-blocking."""
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = cls(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if _SO_TIMESTAMPNS is not None:
                # Set here, not on each accepted socket: a connection inherits it from its
                # listener, so the request bytes that arrive before the accept are stamped too.
                with contextlib.suppress(OSError):  # no stamps: the read's own time
                    listener.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            listener.bind(address)
            listener.listen(128)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        return listener

    def accept(self) -> tuple[socket.socket, Any]:
        plain, address = super().accept()
        conn = _StampedConnection(plain.family, plain.type, plain.proto, fileno=plain.detach())
        _OPEN[conn.fileno()] = conn
        return conn, address


def _connection(request: web.BaseRequest) -> _StampedConnection | None:
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    return _OPEN.get(sock.fileno()) if sock is not None else None


def arrival(request: web.BaseRequest) -> float:
    """When ``request`` arrived (monotonic): its first bytes' receive time, at the latest now."""
    now = time.monotonic()
    conn = _connection(request)
    stamp = conn.arrived if conn is not None else None
    return now if stamp is None else min(stamp, now)


@web.middleware
async def arrival_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Clear the connection's stamp once a request is handled, its body read to the end first
    (bytes of this request read later must not date the next one)."""
    try:
        return await handler(request)
    finally:
        with contextlib.suppress(Exception):  # a connection already lost has no next request
            await request.release()
        conn = _connection(request)
        if conn is not None:
            conn.arrived = None
