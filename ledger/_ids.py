"""UUIDv7 ids and RFC 3339 timestamps."""

from __future__ import annotations

import os
import re
import threading
import time

_lock = threading.Lock()
_last_ms = 0
_counter = 0

RFC3339_PATTERN = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
# Exactly what ``str(uuid.UUID(text)) == text`` accepts, without building a UUID per check.
UUID_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

# The formatted second of the last timestamp: formatting dominates utc_now's cost.
_second_cache: tuple[int, str] = (-1, "")


def new_id() -> str:
    """A UUIDv7 string: 48-bit Unix milliseconds, then a 12-bit counter and random bits.

    The counter keeps ids made in one millisecond by this process increasing,
    so ids sort in creation order.
    """
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            _counter += 1
            if _counter > 0xFFF:
                ms += 1
                _counter = 0
        else:
            _counter = int.from_bytes(os.urandom(2)) & 0x7FF
        _last_ms = ms
        counter = _counter
    rand = int.from_bytes(os.urandom(8)) & ((1 << 62) - 1)
    h = f"{(ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def is_uuid(text: str) -> bool:
    """True if ``text`` is a canonical (lower-case, hyphenated) UUID string."""
    return isinstance(text, str) and UUID_PATTERN.fullmatch(text) is not None


def utc_now() -> str:
    """Current UTC time, RFC 3339 with microseconds and ``Z``."""
    global _second_cache
    second, nanos = divmod(time.time_ns(), 1_000_000_000)
    cached_second, prefix = _second_cache
    if second != cached_second:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second_cache = (second, prefix)
    return f"{prefix}.{nanos // 1000:06d}Z"


def is_rfc3339(text: str) -> bool:
    """True if ``text`` is in the ledger's timestamp form."""
    return isinstance(text, str) and RFC3339_PATTERN.fullmatch(text) is not None
