"""An SQLite ledger's file rewritten: a new page size, no free pages, every row as it was.

New ledgers get 16 KiB pages (``ledger/_backends.py``); a file keeps the page size it was made
with, so a ledger made before reads with four times the page reads. :func:`compact` rewrites the
file with SQLite's ``VACUUM`` at the page size asked for. ``VACUUM`` copies every row as it is
(the ``seq`` of each is its rowid and is kept) inside one transaction: an error leaves the file
as it was. The ledger is verified before (a ledger that does not verify is refused: the file's
free pages may be the only trace of what was done to it) and after, and its head must not move.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from ._backends import PAGE_SIZE, sqlite_pragmas
from ._errors import BackendError, CompactError
from ._store import Ledger
from ._verify import verify_ledger

PAGE_SIZES = tuple(2**n for n in range(12, 17))  # what SQLite allows from 4 KiB: 4 to 64 KiB


@dataclass(frozen=True)
class Compaction:
    """What :func:`compact` did: page sizes and file sizes before and after, the events verified
    before and after, the head they end on, and the seconds it took (both verifications included)."""

    path: str
    page_size_before: int
    page_size_after: int
    bytes_before: int
    bytes_after: int
    events: int
    head_seq: int | None
    head_chain: str | None
    seconds: float


def _file_of(ledger: Ledger) -> Path:
    if ledger.url.get_backend_name() != "sqlite":
        raise BackendError(
            "compact rewrites an SQLite ledger's file; "
            "a PostgreSQL server compacts its own tables (VACUUM FULL)"
        )
    database = ledger.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        raise BackendError(f"compact needs an SQLite ledger in a file, not {database or 'memory'!r}")
    return Path(database)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def compact(ledger: Ledger, page_size: int = PAGE_SIZE) -> Compaction:
    """Rewrite the SQLite file of ``ledger`` with pages of ``page_size`` bytes and no free pages.

    Raises :class:`CompactError`, with the file untouched, where the ledger does not verify or
    another connection has it open (switching out of WAL mode needs the file alone)."""
    if page_size not in PAGE_SIZES:
        raise CompactError(f"page size {page_size}: SQLite's are {', '.join(map(str, PAGE_SIZES))} bytes")
    path = _file_of(ledger)
    started = time.perf_counter()
    before = verify_ledger(ledger)
    if not before.ok:
        raise CompactError(
            f"the ledger does not verify (seq {before.first_bad_seq}: {before.problem}); compact rewrites "
            "only a whole ledger (its free pages may be the only trace of what was done): run `ledger verify`"
        )
    ledger.database.dispose()  # this process's own connections let the file go
    bytes_before = _size(path)
    elsewhere = f"another connection has {path} open; close it and compact again (the file is as it was)"
    con = sqlite3.connect(path, isolation_level=None, timeout=2)
    try:
        ((page_size_before,),) = con.execute("PRAGMA page_size").fetchall()
        ((mode,),) = con.execute("PRAGMA journal_mode=DELETE").fetchall()
        if str(mode).lower() != "delete":
            raise CompactError(elsewhere)  # WAL mode is left only by a file's one connection
        try:
            con.execute(f"PRAGMA page_size={int(page_size)}")
            con.execute("VACUUM")
        finally:
            sqlite_pragmas(con)  # back in WAL mode with the ledger's settings, whatever VACUUM did
        ((page_size_after,),) = con.execute("PRAGMA page_size").fetchall()
    except sqlite3.OperationalError as error:
        # The primary result code (the low byte of an extended one such as SQLITE_BUSY_SNAPSHOT).
        if error.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise CompactError(elsewhere) from error
        raise CompactError(f"{path} could not be compacted: {error}; the file is as it was") from error
    finally:
        with contextlib.suppress(sqlite3.Error):
            con.close()
    after = verify_ledger(ledger)
    if not after.ok or (after.head_seq, after.head_chain) != (before.head_seq, before.head_chain):
        # VACUUM copies rows as they are: this would be SQLite's fault, and is said as it is.
        raise CompactError(f"after compaction the ledger does not verify as before: {after}")
    return Compaction(
        str(path),
        int(page_size_before),
        int(page_size_after),
        bytes_before,
        _size(path),
        after.count,
        after.head_seq,
        after.head_chain,
        time.perf_counter() - started,
    )
