"""Kernel receive stamps (Linux ``SO_TIMESTAMPNS``) of socket reads, standard library only:
the client's reads (collectors/_http.py) and the sim's (experiments/targets/sim/_arrival.py)."""

from __future__ import annotations

import socket
import struct
from typing import Final

# Linux's SO_TIMESTAMPNS(_OLD), which the socket module does not name; the cmsg type equals it.
SO_TIMESTAMPNS: Final = 35
_TIMESPEC: Final = struct.Struct("@qq")
ANC_SIZE: Final = socket.CMSG_SPACE(_TIMESPEC.size)  # ancillary room for one stamp
_MAX_AGE_NS: Final = 5_000_000_000


def stamp_age_ns(ancillary: list[tuple[int, int, bytes]], wall_ns: int) -> int | None:
    """How long before ``wall_ns`` (CLOCK_REALTIME) the kernel stamped the bytes of a
    ``recvmsg`` whose ancillary data is ``ancillary``; None without a stamp, or where the stamp
    is in the future or older than 5 s (a clock step: the read's own time stands)."""
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(raw)
            age = wall_ns - (sec * 1_000_000_000 + nsec)
            return age if 0 <= age < _MAX_AGE_NS else None
    return None
