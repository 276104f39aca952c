"""UUIDv7 ids and RFC 3339 timestamps."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from datetime import UTC, datetime

_lock = threading.Lock()
_last_ms = 0
_counter = 0

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


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
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand
    return str(uuid.UUID(int=value))


def is_uuid(text: str) -> bool:
    """True if ``text`` is a canonical (lower-case, hyphenated) UUID string."""
    try:
        return str(uuid.UUID(text)) == text
    except (ValueError, AttributeError, TypeError):
        return False


def utc_now() -> str:
    """Current UTC time, RFC 3339 with microseconds and ``Z``."""
    return format_ts(datetime.now(UTC))


def format_ts(moment: datetime) -> str:
    """Format an aware datetime as RFC 3339 UTC with microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def is_rfc3339(text: str) -> bool:
    """True if ``text`` is in the ledger's timestamp form."""
    return isinstance(text, str) and bool(_RFC3339.match(text))
