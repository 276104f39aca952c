"""The envelope: events as frozen dataclasses, their digests and the hash chain."""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, NamedTuple

import orjson

from ._canonical import canonical_and_parsed, parse_json, sha256_hex
from ._errors import EventError
from ._ids import RFC3339_PATTERN, UUID_PATTERN, is_rfc3339, is_uuid, new_id, utc_now
from ._vocabulary import native_spec, validate

_cseal: ModuleType | None
try:
    from . import _cseal
except ImportError:  # installed without a C compiler or headers: the Python path serves
    _cseal = None

GENESIS = "0" * 64

# A build of _cseal older than its source (an editable install not rebuilt yet) lacks the calls
# without recorded events: Ledger.extend then has them built and dropped.
_WITHOUT_EVENTS = bool(getattr(_cseal, "WITHOUT_EVENTS", 0))

_uuid_match = UUID_PATTERN.fullmatch
_ts_match = RFC3339_PATTERN.fullmatch
_sha256 = hashlib.sha256


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
    """A recorded event: the envelope of docs/design.md."""

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


class Sealed(NamedTuple):
    """A validated new event with its canonical data text and digest, ready to insert.

    A named tuple, not a dataclass: one is made per appended event, and a
    tuple is built several times faster; it is just as immutable.
    """

    id: str
    ts: str
    kind: str
    run_id: str | None
    block_id: str | None
    data_json: str
    digest: str
    # The canonical data parsed back, what the recorded Event holds (None: parse when needed).
    data: dict[str, Any] | None = None


def _json_str(value: str | None) -> str:
    """JSON text of an envelope string; plain quoting when nothing needs escaping."""
    if value is None:
        return "null"
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return orjson.dumps(value).decode()


def _name_json(value: str, field: str) -> str:
    """:func:`_json_str` of an envelope name (``run_id``, ``block_id``); a string that is not
    Unicode text, such as one with a lone surrogate, has no UTF-8 form to hash or store."""
    try:
        return _json_str(value)
    except TypeError as exc:  # orjson: "str is not valid UTF-8: surrogates not allowed"
        raise EventError(f"not valid Unicode text ({exc})", field) from exc


def envelope_text(
    id: str, ts: str, kind: str, run_id: str | None, block_id: str | None, data_json: str
) -> str:
    """Canonical JSON of ``{id, ts, kind, run_id, block_id, data}`` given canonical data.

    Assembled in sorted key order so the data is encoded once, not twice.
    """
    return (
        f'{{"block_id":{_json_str(block_id)},"data":{data_json},"id":{_json_str(id)},'
        f'"kind":{_json_str(kind)},"run_id":{_json_str(run_id)},"ts":{_json_str(ts)}}}'
    )


def envelope_bytes(
    id: str, ts: str, kind: str, run_id: str | None, block_id: str | None, data_json: bytes
) -> bytes:
    """:func:`envelope_text` as UTF-8 bytes."""
    return envelope_text(id, ts, kind, run_id, block_id, data_json.decode()).encode()


def event_digest(
    id: str, ts: str, kind: str, run_id: str | None, block_id: str | None, data_json: bytes
) -> str:
    """SHA-256 hex of the canonical envelope."""
    return sha256_hex(envelope_bytes(id, ts, kind, run_id, block_id, data_json))


def next_chain(previous: str, digest: str) -> str:
    """Chain hash: SHA-256 of the ASCII text ``previous + digest``."""
    return sha256_hex((previous + digest).encode("ascii"))


def _check_envelope(event: NewEvent) -> None:
    """Raise :class:`EventError` naming the first envelope field that is malformed."""
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
    if not isinstance(event.kind, str):
        raise EventError("must be a string", "kind")


def _envelope_ok(id_: Any, ts: Any, run_id: Any, block_id: Any, data: Any) -> bool:
    """The common case of :func:`_check_envelope`, in one expression (the append hot path)."""
    return (
        type(id_) is str
        and _uuid_match(id_) is not None
        and type(ts) is str
        and _ts_match(ts) is not None
        and (run_id is None or (type(run_id) is str and run_id != ""))
        and (block_id is None or (type(block_id) is str and block_id != ""))
        and type(data) is dict
    )


def seal(event: NewEvent) -> Sealed:
    """Validate ``event`` against the envelope and vocabulary and compute its digest."""
    id_, ts, kind, run_id, block_id, data = (
        event.id,
        event.ts,
        event.kind,
        event.run_id,
        event.block_id,
        event.data,
    )
    if not _envelope_ok(id_, ts, run_id, block_id, data):
        _check_envelope(event)  # names the field; passes for str/dict subclasses
    validate(kind, data)
    encoded, parsed = canonical_and_parsed(data)
    data_json = encoded.decode()
    # id and ts matched their patterns and kind is in the vocabulary: no escaping needed.
    run_text = "null" if run_id is None else _name_json(run_id, "run_id")
    block_text = "null" if block_id is None else _name_json(block_id, "block_id")
    text = (
        f'{{"block_id":{block_text},"data":{data_json},"id":"{id_}",'
        f'"kind":"{kind}","run_id":{run_text},"ts":"{ts}"}}'
    )
    digest = _sha256(text.encode()).hexdigest()
    return Sealed(id_, ts, kind, run_id, block_id, data_json, digest, parsed)


def native_sealing(sealer: str | None = None) -> bool:
    """Whether append seals and chains natively (``ledger/_cseal.c``).

    ``sealer``: ``python`` forces the Python path (the reference); anything else
    uses the native one where it is built. Default: ``$KVLEDGER_SEALER``.
    """
    return _cseal is not None and (sealer or os.environ.get("KVLEDGER_SEALER", "auto")) != "python"


def seal_many(events: Sequence[NewEvent], native: bool = True, *, parsed: bool = True) -> list[Sealed]:
    """:func:`seal` for each event, natively where ``native`` and built (same results, same errors).

    Without ``parsed`` the native seal leaves ``Sealed.data`` None (it skips the copy of the
    data that a recorded :class:`Event` would hold); the text and digest are the same.
    """
    if native and _cseal is not None:
        return _cseal.seal_many(events, False) if not parsed and _WITHOUT_EVENTS else _cseal.seal_many(events)
    return [seal(e) for e in events]


Row = tuple[int, str, str, str, str | None, str | None, str, str, str]


def link(
    sealed: list[Sealed], seq: int, chain: str, native: bool = True, *, events: bool = True
) -> tuple[list[Row], list[Event] | None, str]:
    """Number and chain ``sealed`` after ``seq``/``chain``: the rows, the recorded events (None
    without ``events``), the new chain."""
    if native and _cseal is not None:
        if not events and _WITHOUT_EVENTS:
            return _cseal.link(sealed, seq, chain, False)
        native_rows, native_events, chain = _cseal.link(sealed, seq, chain)
        return native_rows, native_events if events else None, chain
    rows: list[Row] = []
    for s in sealed:
        seq += 1
        chain = _sha256((chain + s.digest).encode()).hexdigest()  # next_chain, inlined
        rows.append((seq, s.id, s.ts, s.kind, s.run_id, s.block_id, s.data_json, s.digest, chain))
    if not events:
        return rows, None, chain
    recorded_events = [
        recorded(row, parse_json(row[6]) if s.data is None else s.data)
        for row, s in zip(rows, sealed, strict=True)
    ]
    return rows, recorded_events, chain


_new = object.__new__


def recorded(row: tuple[Any, ...], data: dict[str, Any]) -> Event:
    """An :class:`Event` from a stored row and its parsed data, built for speed.

    Filling ``__dict__`` directly skips the frozen dataclass's per-field
    ``object.__setattr__`` (a third of the cost); the result is the same object.
    """
    event = _new(Event)
    fields = event.__dict__
    (
        fields["seq"],
        fields["id"],
        fields["ts"],
        fields["kind"],
        fields["run_id"],
        fields["block_id"],
        _,
        fields["digest"],
        fields["chain"],
    ) = row
    fields["data"] = data
    return event


def event_from_row(row: tuple[Any, ...]) -> Event:
    """Build an :class:`Event` from ``(seq, id, ts, kind, run_id, block_id, data, digest, chain)``."""
    return recorded(row, parse_json(row[6]))


def _native_sqlite_insert() -> bool:
    """Whether ``_cseal.insert`` may use the handle of Python's sqlite3 connections.

    It may where Python's sqlite3 module calls the same SQLite library as ``_cseal`` and a
    probe connection's handle reads back right (see ledger/_cseal.c); else rows go in
    through ``executemany``.
    """
    # A build of _cseal older than its source (an editable install not rebuilt yet) lacks it.
    if _cseal is None or not hasattr(_cseal, "configure_sqlite"):
        return False
    import sqlite3

    probe = sqlite3.connect(":memory:")
    try:
        probe.execute("CREATE TABLE probe (x)")
        probe.executemany("INSERT INTO probe VALUES (?)", [(1,), (2,), (3,)])
        # The extension module that holds the Connection type (the sqlite3 package wraps it).
        path = getattr(importlib.import_module("_sqlite3"), "__file__", None) or ""
        return bool(
            path
            and _cseal.configure_sqlite(
                sqlite3.Connection, sqlite3.IntegrityError, sqlite3.OperationalError, path, probe
            )
        )
    finally:
        probe.close()


if _cseal is not None:
    _cseal.configure(Sealed, Event, seal, parse_json, native_spec())

NATIVE_SQLITE_INSERT = _native_sqlite_insert()


def insert_sqlite(
    connection: Any, sealed: list[Sealed], seq: int, chain: str, *, events: bool = True
) -> tuple[list[Event] | None, str]:
    """Chain ``sealed`` after ``seq``/``chain`` and insert its rows natively on ``connection``
    (a ``sqlite3.Connection`` inside ``BEGIN IMMEDIATE``): the recorded events (None without
    ``events``), the new chain.

    The same rows and events as :func:`link` followed by ``executemany``; only where
    :data:`NATIVE_SQLITE_INSERT`.
    """
    assert _cseal is not None and NATIVE_SQLITE_INSERT
    if not events and _WITHOUT_EVENTS:
        return _cseal.insert(connection, sealed, seq, chain, False)
    recorded_events, chain = _cseal.insert(connection, sealed, seq, chain)
    return recorded_events if events else None, chain
