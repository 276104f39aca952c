"""The envelope: events as frozen dataclasses, their digests and the hash chain."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ._canonical import canonical_json, parse_json, sha256_hex
from ._errors import EventError
from ._ids import is_rfc3339, is_uuid, new_id, utc_now
from ._vocabulary import validate

GENESIS = "0" * 64


@dataclass(frozen=True)
class NewEvent:
    """An event as a producer makes it, before the ledger assigns ``seq`` and ``chain``."""

    kind: str
    data: dict[str, Any]
    run_id: str | None = None
    block_id: str | None = None
    id: str = field(default_factory=new_id)
    ts: str = field(default_factory=utc_now)


@dataclass(frozen=True)
class Event:
    """A recorded event: the envelope of DESIGN.md."""

    seq: int
    id: str
    ts: str
    kind: str
    run_id: str | None
    block_id: str | None
    data: dict[str, Any]
    digest: str
    chain: str

    def envelope(self) -> dict[str, Any]:
        """The whole envelope as a JSON-able dict (the export form)."""
        return {
            "seq": self.seq,
            "id": self.id,
            "ts": self.ts,
            "kind": self.kind,
            "run_id": self.run_id,
            "block_id": self.block_id,
            "data": self.data,
            "digest": self.digest,
            "chain": self.chain,
        }


@dataclass(frozen=True)
class Head:
    """The last event of the ledger: its ``seq`` and ``chain``."""

    seq: int
    chain: str


@dataclass(frozen=True)
class Sealed:
    """A validated new event with its canonical data text and digest, ready to insert."""

    id: str
    ts: str
    kind: str
    run_id: str | None
    block_id: str | None
    data_json: str
    digest: str


def _json_str(value: str | None) -> bytes:
    return orjson.dumps(value)


def envelope_bytes(
    id: str, ts: str, kind: str, run_id: str | None, block_id: str | None, data_json: bytes
) -> bytes:
    """Canonical JSON of ``{id, ts, kind, run_id, block_id, data}`` given canonical data.

    Assembled in sorted key order so the data is encoded once, not twice.
    """
    return b"".join(
        (
            b'{"block_id":',
            _json_str(block_id),
            b',"data":',
            data_json,
            b',"id":',
            _json_str(id),
            b',"kind":',
            _json_str(kind),
            b',"run_id":',
            _json_str(run_id),
            b',"ts":',
            _json_str(ts),
            b"}",
        )
    )


def event_digest(
    id: str, ts: str, kind: str, run_id: str | None, block_id: str | None, data_json: bytes
) -> str:
    """SHA-256 hex of the canonical envelope."""
    return sha256_hex(envelope_bytes(id, ts, kind, run_id, block_id, data_json))


def next_chain(previous: str, digest: str) -> str:
    """Chain hash: SHA-256 of the ASCII text ``previous + digest``."""
    return sha256_hex((previous + digest).encode("ascii"))


def _check_envelope(event: NewEvent) -> None:
    if not is_uuid(event.id):
        raise EventError(f"not a canonical UUID string: {event.id!r}", "id")
    if not is_rfc3339(event.ts):
        raise EventError(f"not RFC 3339 UTC with microseconds: {event.ts!r}", "ts")
    for name in ("run_id", "block_id"):
        value = getattr(event, name)
        if value is not None and not (isinstance(value, str) and value):
            raise EventError("must be a non-empty string or null", name)
    if not isinstance(event.data, dict):
        raise EventError("must be a JSON object", "data")


def seal(event: NewEvent) -> Sealed:
    """Validate ``event`` against the envelope and vocabulary and compute its digest."""
    _check_envelope(event)
    validate(event.kind, event.data)
    data_json = canonical_json(event.data)
    digest = event_digest(event.id, event.ts, event.kind, event.run_id, event.block_id, data_json)
    return Sealed(
        event.id, event.ts, event.kind, event.run_id, event.block_id, data_json.decode(), digest
    )


def event_from_row(row: tuple[Any, ...]) -> Event:
    """Build an :class:`Event` from ``(seq, id, ts, kind, run_id, block_id, data, digest, chain)``."""
    seq, id_, ts, kind, run_id, block_id, data, digest, chain = row
    return Event(int(seq), id_, ts, kind, run_id, block_id, parse_json(data), digest, chain)
