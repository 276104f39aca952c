"""What differs between SQLite and PostgreSQL: connection pools, write locks, placeholders."""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine, make_url

from ._errors import BackendError

# Any constant will do: it names the lock that serialises appends on PostgreSQL.
_PG_APPEND_LOCK = 0x6B766C6564676572  # "kvledger"

DEFAULT_URL = "sqlite:///ledger.db"

# Pages of new SQLite ledgers (SQLite's default is 4 KiB). A page size is fixed when the file is
# created; larger pages mean a quarter of the page reads and copies when every row is read
# (verification, the checked read, the snapshot), docs/performance.md "Pages of 16 KiB".
PAGE_SIZE = 16384
# The WAL is checkpointed every 16 MiB (SQLite's default is 1,000 pages): see sqlite_pragmas.
WAL_AUTOCHECKPOINT_BYTES = 16 * 2**20

_PG_COPY_EVENTS = "COPY events (seq, id, ts, kind, run_id, block_id, data, digest, chain) FROM STDIN"


def normalise_url(url: str | URL) -> URL:
    """Parse ``url``, choosing psycopg 3 for plain ``postgresql://`` URLs."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def redact_url(url: str | URL) -> str:
    """The URL with any password hidden, for messages."""
    return make_url(url).render_as_string(hide_password=True)


def sqlite_pragmas(cursor: Any) -> None:
    """The settings of every connection to an SQLite ledger (and of the append benchmark's raw
    baseline, so that it stores its rows as the ledger does)."""
    # Takes effect only on a file with no table yet, and before WAL mode: a new ledger. An existing
    # one keeps the page size it was created with.
    cursor.execute(f"PRAGMA page_size={PAGE_SIZE}")
    cursor.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode survives a killed process; only power loss can drop the last commits.
    cursor.execute("PRAGMA synchronous=NORMAL")
    # Checkpoint every 16 MiB of WAL whatever the page size (4,000 pages at 4 KiB) rather than
    # SQLite's 1,000 pages: a batch rewrites the right-hand pages of the table and its indexes, and
    # a checkpoint copies each page once however often the WAL holds it, so fewer checkpoints copy
    # and fsync less (docs/performance.md).
    ((page_size,),) = cursor.execute("PRAGMA page_size").fetchall()
    cursor.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_BYTES // int(page_size)}")


# How long an SQLite connection of the ledger waits for another writer's lock.
SQLITE_BUSY_TIMEOUT_MS = 120_000


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Autocommit at the driver; the ledger issues BEGIN IMMEDIATE itself for writes.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    sqlite_pragmas(cursor)
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()


def open_database(url: URL) -> Engine:
    """A SQLAlchemy connection pool (an ``Engine``) configured for ledger work on ``url``'s backend."""
    if url.get_backend_name() == "sqlite":
        database = create_engine(url, connect_args={"timeout": 120, "check_same_thread": False})
        event.listen(database, "connect", _sqlite_on_connect)
        return database
    if url.get_backend_name() == "postgresql":
        return create_engine(url, pool_pre_ping=True)
    raise BackendError(f"unsupported database backend {url.get_backend_name()!r}: use sqlite or postgresql")


class Dialect:
    """SQL for the append path, written once per backend."""

    def __init__(self, name: str) -> None:
        self.name = name
        mark = "?" if name == "sqlite" else "%s"
        marks = ", ".join([mark] * 9)
        self.insert_event = (
            f"INSERT INTO events (seq, id, ts, kind, run_id, block_id, data, digest, chain) VALUES ({marks})"
        )
        self.insert_head = f"INSERT INTO heads (seq, chain, ts) VALUES ({mark}, {mark}, {mark})"
        self.mark = mark

    def insert_events(self, cursor: Any, rows: list[Any]) -> None:
        """Insert the batch's rows; on PostgreSQL by ``COPY``, about twice as fast as
        ``executemany`` and taken while the append lock is held, so writers wait less.
        A known id fails the whole statement either way (the UNIQUE constraint holds for COPY)."""
        if self.name == "sqlite":
            cursor.executemany(self.insert_event, rows)
            return
        with cursor.copy(_PG_COPY_EVENTS) as copy:
            for row in rows:
                copy.write_row(row)

    def begin_write(self, cursor: Any) -> None:
        """Start a transaction that holds the ledger's single append lock."""
        if self.name == "sqlite":
            cursor.execute("BEGIN IMMEDIATE")
        else:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_APPEND_LOCK,))

    def try_begin_write(self, cursor: Any) -> bool:
        """:meth:`begin_write` on SQLite without waiting: False, with nothing begun, where another
        writer holds the lock (the caller then does its own work before it waits for it). The
        connection's busy timeout is then set back to what every ledger connection has."""
        assert self.name == "sqlite"
        cursor.execute("PRAGMA busy_timeout = 0")
        try:
            cursor.execute("BEGIN IMMEDIATE")
        except Exception as exc:  # the driver's OperationalError: told apart by SQLite's code
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_BUSY:
                raise
            return False
        finally:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        return True

    def rollback(self, connection: Any, cursor: Any) -> None:
        if self.name == "sqlite":
            if connection.in_transaction:
                cursor.execute("ROLLBACK")
        else:
            connection.rollback()

    def commit(self, connection: Any, cursor: Any) -> None:
        if self.name == "sqlite":
            cursor.execute("COMMIT")
        else:
            connection.commit()

    def placeholders(self, count: int) -> str:
        return ", ".join([self.mark] * count)
