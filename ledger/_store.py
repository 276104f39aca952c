"""The Ledger: append, read and head over one SQLAlchemy connection pool (``Ledger.database``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from operator import itemgetter
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import URL, Engine

from . import _migrate
from ._backends import Dialect, normalise_url, open_database
from ._errors import ConflictError, EventError, SchemaError
from ._events import (
    GENESIS,
    NATIVE_SQLITE_INSERT,
    Event,
    Head,
    NewEvent,
    Sealed,
    event_from_row,
    insert_sqlite,
    link,
    native_sealing,
    seal_many,
)
from ._ids import utc_now
from ._schema import events as events_table

_COLUMNS = "seq, id, ts, kind, run_id, block_id, data, digest, chain"

# A batch of at least this many events is sealed in parts (of half as many at the least, and at
# most OVERLAP_PARTS), each while the one before is inserted (Ledger._extend_overlapped); below it a
# thread's hand-off costs more than it saves.
OVERLAP_MIN_EVENTS = 256
OVERLAP_PARTS = 4


class Ledger:
    """An append-only, hash-chained event store on SQLite or PostgreSQL.

    :param url: a SQLAlchemy URL (``sqlite:///ledger.db``, ``postgresql://...``).
    :param create: upgrade the schema to head if needed (``ledger init``).
    :param sealer: ``python`` seals and chains in Python; default: natively where built
        (``$KVLEDGER_SEALER``; the results are byte-identical).
    """

    def __init__(self, url: str | URL, *, create: bool = True, sealer: str | None = None) -> None:
        self.native = native_sealing(sealer)
        self.url = normalise_url(url)
        self.database: Engine = open_database(self.url)
        self.dialect = Dialect(self.database.dialect.name)
        # SQLite with the native sealer: chain and insert each batch in C on the pool's own
        # connection (ledger/_cseal.c); the Python sealer keeps link + executemany, the reference.
        self.native_insert = self.native and NATIVE_SQLITE_INSERT and self.dialect.name == "sqlite"
        # (pid, the thread that seals a batch's next part while one is inserted): made on first use.
        self._sealer_pool: tuple[int, ThreadPoolExecutor] | None = None
        if create:
            _migrate.upgrade(self.database)
        elif _migrate.current_revision(self.database) != _migrate.head_revision():
            raise SchemaError("the database has no current ledger schema: run `ledger init`")

    def close(self) -> None:
        """Release every connection (and the thread that seals batches' parts, if any)."""
        held, self._sealer_pool = self._sealer_pool, None
        if held is not None and held[0] == os.getpid():
            held[1].shutdown()
        self.database.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- append -----------------------------------------------------------------

    def append(self, event: NewEvent) -> Event:
        """Append one event; returns it as recorded (the existing one if already there)."""
        return self.append_many([event])[0]

    def append_many(self, events: Sequence[NewEvent]) -> list[Event]:
        """Append a batch atomically: all of it is committed, or none.

        Re-appending an id with the same content is a no-op; with other
        content it raises :class:`ConflictError` naming the id. Returns the
        batch as recorded (an existing event for a known id); :meth:`extend`
        does the same append and returns only the new head.
        """
        sealed = _dedupe(seal_many(events, self.native))
        if not sealed:
            return []
        connection = self.database.raw_connection()
        try:
            return self._append_sealed(connection, sealed)[0]
        finally:
            connection.close()

    def extend(self, events: Sequence[NewEvent]) -> Head | None:
        """:meth:`append_many` for a caller that drops the recorded events (a producer).

        The same validation, atomic transaction, lock, idempotency and errors; it
        returns only the ledger's head after the batch (None for an empty batch on an
        empty ledger), so no :class:`Event` or copy of the data is made per event.
        """
        if self.native_insert and len(events) >= OVERLAP_MIN_EVENTS:
            return self._extend_overlapped(events)
        sealed = _dedupe(seal_many(events, self.native, parsed=False))
        if not sealed:
            return self.head()
        connection = self.database.raw_connection()
        try:
            return self._append_sealed(connection, sealed, recorded=False)[1]
        finally:
            connection.close()

    def _extend_overlapped(self, events: Sequence[NewEvent]) -> Head | None:
        """:meth:`extend` on SQLite with the native sealer, in parts: each part after the first
        sealed on another thread while the part before it is inserted.

        The native insert steps SQLite with the GIL released and sealing holds it, so the two run
        on two cores at once. A part's sealing starts only once the part before is about to be
        inserted: started sooner, it would hold the GIL the insert needs to begin. The batch stays
        one transaction under the append lock: a refused event of any part rolls back what was
        inserted, and nothing is written. A batch that repeats an id, or names one already
        recorded, is appended again by the plain path, which looks ids up (re-appending is
        idempotent, and conflicts are named as ever). Where another writer holds the append lock,
        the batch is sealed whole before waiting for it, as the plain path does: sealing inside the
        lock would hold the other writers up.
        """
        count = min(OVERLAP_PARTS, len(events) // (OVERLAP_MIN_EVENTS // 2))
        bounds = [len(events) * i // count for i in range(count + 1)]
        sealed = seal_many(events[: bounds[1]], self.native, parsed=False)  # the batch's, in order
        integrity_error = self.database.dialect.dbapi.IntegrityError  # type: ignore[union-attr]
        connection = self.database.raw_connection()
        try:
            try:
                with self._write_transaction(connection, wait=False) as cursor:
                    seq, chain = _head_in(cursor)
                    plain = False
                    for part in range(count):
                        following = None
                        if part + 1 < count:
                            rest = events[bounds[part + 1] : bounds[part + 2]]
                            following = self._sealer().submit(seal_many, rest, self.native, parsed=False)
                        try:
                            if not plain:
                                inserted = sealed[bounds[part] : bounds[part + 1]]
                                at = seq + bounds[part]
                                _, chain = insert_sqlite(
                                    connection.dbapi_connection, inserted, at, chain, events=False
                                )
                        except integrity_error:
                            plain = True  # a repeated or recorded id: looked up by the plain path
                        finally:
                            # The next part is sealed (or refused) before anything else happens.
                            if following is not None:
                                _settled(following)
                        if following is not None:
                            sealed += following.result()  # a refused event raises: all rolled back
                    if plain:
                        raise _PlainPath
                    seq += len(events)
                    cursor.execute(self.dialect.insert_head, (seq, chain, utc_now()))
                    self.dialect.commit(connection, cursor)
                    return Head(seq, chain)
            except _PlainPath:
                pass  # rolled back, or the lock was another writer's: nothing of the batch written
            # Where another writer held the lock, the rest is sealed now, before waiting for it, as
            # the plain path does: sealing inside the lock would hold up the other writers.
            sealed += seal_many(events[len(sealed) :], self.native, parsed=False)
            return self._append_sealed(connection, _dedupe(sealed), recorded=False)[1]
        finally:
            connection.close()

    def _sealer(self) -> ThreadPoolExecutor:
        """The thread that seals a batch's parts after the first (one per ledger and process: a
        forked child makes its own, as the parent's thread is not in it)."""
        with _SEALER_LOCK:
            if self._sealer_pool is None or self._sealer_pool[0] != os.getpid():
                self._sealer_pool = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="kvledger-seal"))
            return self._sealer_pool[1]

    def append_sealed(self, sealed: Sequence[Sealed]) -> list[Event]:
        """Append events already validated by :func:`seal` (the import path)."""
        connection = self.database.raw_connection()
        try:
            return self._append_sealed(connection, _dedupe(list(sealed)))[0]
        finally:
            connection.close()

    def _append_sealed(
        self, connection: Any, sealed: list[Sealed], *, recorded: bool = True
    ) -> tuple[list[Event], Head]:
        """The recorded events (empty without ``recorded``) and the head after the batch."""
        # Optimistic: most batches hold only new ids, so insert at once and let the
        # UNIQUE(id) constraint catch the rest; only then look the known ids up.
        integrity_error = self.database.dialect.dbapi.IntegrityError  # type: ignore[union-attr]
        try:
            return self._write(connection, sealed, lookup=False, recorded=recorded)
        except integrity_error:
            return self._write(connection, sealed, lookup=True, recorded=recorded)

    @contextmanager
    def _write_transaction(self, connection: Any, *, wait: bool = True) -> Iterator[Any]:
        """A cursor in a transaction under the append lock, rolled back if the block raises (the
        block commits). Without ``wait`` (SQLite), :class:`_PlainPath` where another writer holds
        the lock."""
        cursor = connection.cursor()
        try:
            if wait:
                self.dialect.begin_write(cursor)
            elif not self.dialect.try_begin_write(cursor):
                raise _PlainPath
            yield cursor
        except BaseException:
            self.dialect.rollback(connection, cursor)
            raise
        finally:
            cursor.close()

    def _write(
        self, connection: Any, sealed: list[Sealed], *, lookup: bool, recorded: bool
    ) -> tuple[list[Event], Head]:
        """One transaction under the append lock; with ``lookup``, known ids are skipped."""
        with self._write_transaction(connection) as cursor:
            known = self._known(cursor, sealed) if lookup else {}
            fresh = [s for s in sealed if s.id not in known] if known else sealed
            events, head = self._insert(connection, cursor, fresh, recorded)
            self.dialect.commit(connection, cursor)
        if not known or not recorded:
            return events, head
        by_id = {e.id: e for e in events}
        by_id.update(known)
        return [by_id[s.id] for s in sealed], head

    def _known(self, cursor: Any, sealed: list[Sealed]) -> dict[str, Event]:
        """Events already recorded under these ids; a differing digest is a conflict."""
        known: dict[str, Event] = {}
        for start in range(0, len(sealed), 500):
            chunk = sealed[start : start + 500]
            marks = self.dialect.placeholders(len(chunk))
            cursor.execute(f"SELECT {_COLUMNS} FROM events WHERE id IN ({marks})", [s.id for s in chunk])
            for row in cursor.fetchall():
                known[row[1]] = event_from_row(row)
        for s in sealed:
            if s.id in known and known[s.id].digest != s.digest:
                raise ConflictError(s.id)
        return known

    def _insert(
        self, connection: Any, cursor: Any, fresh: list[Sealed], recorded: bool
    ) -> tuple[list[Event], Head]:
        """Chain and insert ``fresh`` after the head: its events (none without ``recorded``), the head."""
        seq, chain = _head_in(cursor)
        if not fresh:  # every id known: the head stays
            return [], Head(seq, chain)
        if self.native_insert:
            events, chain = insert_sqlite(connection.dbapi_connection, fresh, seq, chain, events=recorded)
        else:
            rows, events, chain = link(fresh, seq, chain, self.native, events=recorded)
            self.dialect.insert_events(cursor, rows)
        seq += len(fresh)
        cursor.execute(self.dialect.insert_head, (seq, chain, utc_now()))
        return events or [], Head(seq, chain)

    # -- read -------------------------------------------------------------------

    def head(self, at_or_before: int | None = None) -> Head | None:
        """The last event's seq and chain (the last at or before seq ``at_or_before``), or None
        where there is none."""
        bound = "" if at_or_before is None else f"WHERE seq <= {int(at_or_before)} "
        sql = f"SELECT seq, chain FROM events {bound}ORDER BY seq DESC LIMIT 1"
        with self.database.connect() as conn:
            row = conn.exec_driver_sql(sql).first()
        return Head(int(row[0]), row[1]) if row else None

    def count(self) -> int:
        """Number of events recorded."""
        head = self.head()
        return head.seq if head else 0

    def events(
        self,
        *,
        run_id: str | None = None,
        kind: str | Iterable[str] | None = None,
        block_id: str | None = None,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int | None = None,
    ) -> Iterator[Event]:
        """Events in ``seq`` order, filtered by run, kind, block and seq range."""
        query = select(events_table).where(events_table.c.seq > after_seq)
        if until_seq is not None:
            query = query.where(events_table.c.seq <= until_seq)
        if run_id is not None:
            query = query.where(events_table.c.run_id == run_id)
        if block_id is not None:
            query = query.where(events_table.c.block_id == block_id)
        if kind is not None:
            kinds = [kind] if isinstance(kind, str) else list(kind)
            query = query.where(events_table.c.kind.in_(kinds))
        query = query.order_by(events_table.c.seq)
        if limit is not None:
            query = query.limit(limit)
        with self.database.connect() as conn:
            result = conn.execution_options(stream_results=True, yield_per=5000).execute(query)
            for row in result:
                yield event_from_row(tuple(row))

    def get(self, event_id: str) -> Event | None:
        """The event recorded under ``event_id``, if any."""
        query = select(events_table).where(events_table.c.id == event_id)
        with self.database.connect() as conn:
            row = conn.execute(query).first()
        return event_from_row(tuple(row)) if row else None

    def raw_rows(self, after_seq: int = 0, until_seq: int | None = None) -> Iterator[tuple[Any, ...]]:
        """Stored rows as tuples ``(seq, id, ts, kind, run_id, block_id, data, digest, chain)``.

        Data stays canonical JSON text: the fast path for verify and export.
        """
        sql = f"SELECT {_COLUMNS} FROM events WHERE seq > {int(after_seq)}"
        if until_seq is not None:
            sql += f" AND seq <= {int(until_seq)}"
        sql += " ORDER BY seq"
        connection = self.database.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute(sql)
            while batch := cursor.fetchmany(20000):
                yield from batch
            cursor.close()
        finally:
            connection.close()

    def recorded_heads(self) -> list[Head]:
        """Every head recorded at commit, in seq order."""
        with self.database.connect() as conn:
            rows = conn.exec_driver_sql("SELECT seq, chain FROM heads ORDER BY seq").all()
        return [Head(int(r[0]), r[1]) for r in rows]


_sealed_id = itemgetter(0)  # Sealed.id, read without the named tuple's property
_SEALER_LOCK = threading.Lock()


class _PlainPath(Exception):
    """A batch sealed in parts that the plain path appends (its transaction rolled back, or the
    append lock found held by another writer)."""


def _head_in(cursor: Any) -> tuple[int, str]:
    """The last seq and chain as ``cursor``'s transaction sees them (0 and GENESIS if none)."""
    cursor.execute("SELECT seq, chain FROM events ORDER BY seq DESC LIMIT 1")
    row = cursor.fetchone()
    return (int(row[0]), str(row[1])) if row else (0, GENESIS)


def _settled(future: Future[Any]) -> None:
    """Wait for ``future`` to end, whatever it gives (its result is read where it is needed). An
    interrupt while waiting is raised once it has ended, so that nothing of the batch is still at
    work when the caller rolls the transaction back."""
    interrupted: BaseException | None = None
    while not future.done():
        try:
            future.exception()
        except BaseException as exc:  # held until the future's work ends, then raised
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted


def _dedupe(sealed: list[Sealed]) -> list[Sealed]:
    """Drop repeats of one id within a batch; differing content under one id is an error."""
    # The usual batch repeats no id: one pass in C says so, without the loop below.
    if len(dict.fromkeys(map(_sealed_id, sealed))) == len(sealed):
        return sealed
    seen: dict[str, Sealed] = {}
    for s in sealed:
        prior = seen.get(s.id)
        if prior is None:
            seen[s.id] = s
        elif prior.digest != s.digest:
            raise ConflictError(s.id)
    return list(seen.values())


def open_ledger(url: str | URL, *, create: bool = True, sealer: str | None = None) -> Ledger:
    """Open the ledger at ``url``; with ``create`` the schema is upgraded to head.

    ``sealer``: see :class:`Ledger`.
    """
    return Ledger(url, create=create, sealer=sealer)


__all__ = ["EventError", "Ledger", "open_ledger"]
