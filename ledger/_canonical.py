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
_SCALARS = (str, int, bool, type(None))


def _where(path: str) -> str:
    return f"data.{path}" if path else "data"


def _child_path(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _check_finite(value: Any, path: str) -> None:
    """Raise naming the first NaN/Infinity or non-string key under ``value``."""
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise EventError(f"object keys must be strings, got {key!r}", _where(path))
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        if isinstance(value, float) and not math.isfinite(value):
            raise EventError("NaN and Infinity are not allowed", _where(path))
        return
    for key, item in items:
        kind = type(item)
        if kind is float:
            # Inline for the common case: x - x is 0.0 for every finite float.
            if item - item != 0.0:
                raise EventError("NaN and Infinity are not allowed", _where(_child_path(path, key)))
        elif kind not in _SCALARS:
            _check_finite(item, _child_path(path, key))


def canonical_json(value: Any) -> bytes:
    """Encode ``value`` as canonical JSON bytes."""
    try:
        encoded = orjson.dumps(value, option=_OPTIONS)
    except TypeError as exc:
        _check_finite(value, "")  # names the path of a non-string key, if that was it
        raise EventError(f"not JSON-encodable: {exc}", "data") from exc
    # orjson writes NaN and Infinity as null, silently. Without a null in the
    # output there can have been none; otherwise walk the value to refuse them.
    if b"null" in encoded:
        _check_finite(value, "")
    return encoded


def canonical_and_parsed(value: Any) -> tuple[bytes, Any]:
    """Canonical JSON of ``value`` and those bytes parsed back (the append path).

    The parse is needed anyway for the recorded event, and it doubles as the
    NaN check: orjson writes NaN and Infinity as null, which parses back as
    None and so differs from ``value``. Only then (or for values JSON does not
    hold exactly, such as tuples) is ``value`` walked to name the culprit.
    """
    try:
        encoded = orjson.dumps(value, option=_OPTIONS)
    except TypeError as exc:
        _check_finite(value, "")
        raise EventError(f"not JSON-encodable: {exc}", "data") from exc
    parsed = orjson.loads(encoded)
    if parsed != value:
        _check_finite(value, "")
    return encoded, parsed


def sha256_hex(payload: bytes) -> str:
    """Lower-case hex SHA-256 of ``payload``."""
    return hashlib.sha256(payload).hexdigest()


def parse_json(text: str | bytes) -> Any:
    """Parse JSON, refusing NaN/Infinity literals like the canonical form does."""
    return orjson.loads(text)
