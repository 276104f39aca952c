"""Canonical JSON and SHA-256 digests.

Canonical form: UTF-8, keys sorted, no insignificant white space, no NaN or
Infinity, floats in shortest round-trip form (orjson's Ryu output).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import orjson

from ._errors import EventError

_OPTIONS = orjson.OPT_SORT_KEYS


def _check_finite(value: Any, path: str) -> None:
    # orjson writes NaN and Infinity as null, silently; refuse them instead.
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EventError("NaN and Infinity are not allowed", f"data.{path}" if path else "data")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise EventError(f"object keys must be strings, got {key!r}", f"data.{path}" if path else "data")
            _check_finite(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_finite(item, f"{path}[{index}]")


def canonical_json(value: Any) -> bytes:
    """Encode ``value`` as canonical JSON bytes."""
    _check_finite(value, "")
    try:
        return orjson.dumps(value, option=_OPTIONS)
    except TypeError as exc:
        raise EventError(f"not JSON-encodable: {exc}", "data") from exc


def sha256_hex(payload: bytes) -> str:
    """Lower-case hex SHA-256 of ``payload``."""
    return hashlib.sha256(payload).hexdigest()


def parse_json(text: str | bytes) -> Any:
    """Parse JSON, refusing NaN/Infinity literals like the canonical form does."""
    return orjson.loads(text)
