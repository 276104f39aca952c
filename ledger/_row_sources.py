"""Where the checked read takes a ledger's rows from: an SQLite file, or PostgreSQL's binary COPY.

A verified report (reports/_source.py) derives its tables from rows that are checked link by
link as they are read (ledger/_analytics.py ``derive_checked``), and ``ledger verify`` checks
every row the same way. On SQLite ``ledger/_carrow.c`` steps the file itself. On PostgreSQL,
through the driver, each row became a tuple of nine Python objects, converted again into
Arrow and checked in Python. Here a seq range arrives as one ``COPY ... TO STDOUT (FORMAT
binary)`` stream, gathered into one buffer, and ``_carrow.check_copy`` walks its tuples with
the same code that checks, splits and parses the SQLite file's rows. The rows' order is the
order the server sent them in, and the check itself proves it: a seq out of place fails the
check, and the caller then verifies on the driver path, which names the first bad seq as it
always did.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ._store import Ledger
from ._verify import native_path

try:
    from . import _carrow, _cverify
except ImportError:  # installed without a C compiler or headers: the driver path serves
    _carrow = _cverify = None  # type: ignore[assignment]

# (outcome, bad_seq, found_seq, last_good_seq, last_good_chain), as _carrow and _cverify give it.
Check = tuple[int, int, int, int, str]
# (kinds, runs): rows of those kinds kept only where their run is one of runs, or none.
Scope = tuple[tuple[str, ...], tuple[str, ...]]

TEXT_COLUMNS = ("id", "ts", "kind", "run_id", "block_id", "data", "digest", "chain")


class RowSource(Protocol):
    """A ledger's rows as the native check reads them."""

    def by_kind(
        self,
        after: int,
        until: int,
        expected: int,
        previous: str,
        mask: int,
        typed: dict[str, Any] | None,
        scope: Scope | None = None,
    ) -> tuple[Any, ...]:
        """Rows ``after < seq <= until`` checked from ``expected`` on ``previous`` and split by kind
        (of ``scope``'s kinds, only its runs' rows): what ``_carrow.read_checked_by_kind`` returns."""
        ...

    def scan(self, after: int, until: int, expected: int, previous: str) -> Check:
        """Check rows ``after < seq <= until`` only (nothing copied out)."""
        ...

    def rows(
        self, after: int, until: int, expected: int, previous: str, typed: dict[str, Any] | None = None
    ) -> tuple[Any, ...]:
        """Rows ``after < seq <= until`` checked from ``expected`` on ``previous``, all columns in seq
        order with their data's fields (and, given ``typed``, the kinds it names parsed into their
        typed fields in the same pass): what ``_carrow.read_checked`` returns."""
        ...

    def stored_chains(self, seqs: list[int]) -> dict[int, str]:
        """The chains stored at ``seqs`` (those present)."""
        ...


@dataclass(frozen=True)
class SqliteRows:
    """An SQLite file's rows, stepped natively."""

    path: str

    def by_kind(
        self,
        after: int,
        until: int,
        expected: int,
        previous: str,
        mask: int,
        typed: dict[str, Any] | None,
        scope: Scope | None = None,
    ) -> tuple[Any, ...]:
        assert _carrow is not None
        # Only the arguments given: a build older than typed fields takes six.
        extra = (typed, scope) if scope is not None else (typed,) if typed is not None else ()
        return tuple(_carrow.read_checked_by_kind(self.path, after, until, expected, previous, mask, *extra))

    def scan(self, after: int, until: int, expected: int, previous: str) -> Check:
        assert _cverify is not None
        return _cverify.scan(self.path, after, until, expected, previous)

    def rows(
        self, after: int, until: int, expected: int, previous: str, typed: dict[str, Any] | None = None
    ) -> tuple[Any, ...]:
        assert _carrow is not None
        extra = () if typed is None else (typed,)
        return tuple(_carrow.read_checked(self.path, after, until, expected, previous, *extra))

    def stored_chains(self, seqs: list[int]) -> dict[int, str]:
        if not seqs:
            return {}
        with contextlib.closing(sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)) as con:
            marks = ", ".join("?" for _ in seqs)
            rows = con.execute(f"SELECT seq, chain FROM events WHERE seq IN ({marks})", seqs).fetchall()
        return {int(seq): str(chain) for seq, chain in rows}


# The rows of a range as PostgreSQL's binary COPY: no text formatting on the server, and a few
# bytes of framing per field for the native check to walk.
_COPY_SQL = (
    "COPY (SELECT seq, id, ts, kind, run_id, block_id, data, digest, chain FROM events "
    "WHERE seq > {after} AND seq <= {until} ORDER BY seq) TO STDOUT (FORMAT binary)"
)

# Rows fetched at a time by ``scan``.
_SCAN_ROWS = 125_000


def _read_input(pgconn: Any) -> None:
    """What the server has sent next, once it is there: waiting on the socket, which releases the
    GIL (libpq's own blocking calls, through psycopg's wrappers, hold it: a reader blocked on the
    server stalled every other thread of the process)."""
    select.select([pgconn.socket], [], [])
    pgconn.consume_input()


def _wait(pgconn: Any) -> None:
    """Until libpq's next result is in (:func:`_read_input` until then)."""
    while pgconn.is_busy():
        _read_input(pgconn)


@functools.cache
def _libpq_copy() -> tuple[int, int] | None:
    """The addresses of PQgetCopyData and PQfreemem in the libpq psycopg's connections run on, for
    ``_carrow.copy_out``, or None (then the rows are gathered by a loop in Python). The library
    is the one already in this process (never another copy: a connection is the libpq's that made
    it), found as psycopg's ctypes binding or as the one libpq mapped, and its version must be the
    one psycopg reports. Looked for once per process."""
    found: tuple[int, int] | None = None
    try:
        import ctypes

        from psycopg import pq

        if pq.__impl__ == "python":
            from psycopg.pq import _pq_ctypes

            library: Any = _pq_ctypes.pq  # type: ignore[attr-defined]
        else:
            with open("/proc/self/maps") as maps:  # (no /proc: OSError, the loop in Python)
                paths = {fields[-1] for fields in map(str.split, maps) if len(fields) >= 6}
            mapped = sorted(p for p in paths if os.path.basename(p).startswith("libpq"))
            if len(mapped) != 1:
                raise OSError(f"not one libpq mapped: {mapped}")
            library = ctypes.CDLL(mapped[0], mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        if library.PQlibVersion() == pq.version() and hasattr(_carrow, "copy_out"):
            get_copy_data = ctypes.cast(library.PQgetCopyData, ctypes.c_void_p).value
            free_mem = ctypes.cast(library.PQfreemem, ctypes.c_void_p).value
            if get_copy_data and free_mem:
                found = (get_copy_data, free_mem)
    except (ImportError, OSError, AttributeError):
        found = None
    return found


def _copy_rows(connection: Any, sql: str, native: bool = True) -> Any:
    """The rows of ``sql`` (a ``COPY ... TO STDOUT``) as one buffer, through libpq directly:
    psycopg's ``Copy`` iterator costs about a third more CPU per row, and a list of a Python object
    per row kept the garbage collector walking them (twice the client's time). The rows are
    gathered natively where the libpq is found (``_carrow.copy_out``: no Python call per row, the
    GIL left to the other reader), else (or where ``native`` is false) by a loop here."""
    from psycopg import OperationalError, pq

    pgconn = connection.pgconn
    pgconn.send_query(sql.encode())
    _wait(pgconn)
    result = pgconn.get_result()
    if result is None or result.status != pq.ExecStatus.COPY_OUT:
        message = "no result" if result is None else result.get_error_message()
        _drain(pgconn)
        raise OperationalError(f"COPY of the ledger's rows failed: {message}")
    libpq = _libpq_copy() if native else None
    data: Any
    if libpq is not None:
        data, size = _carrow.copy_out(*libpq, pgconn.pgconn_ptr)
    else:
        data = bytearray()
        while True:
            size, chunk = pgconn.get_copy_data(1)  # without blocking: 0 while nothing has arrived
            if size > 0:
                data += chunk
            elif size == 0:
                _read_input(pgconn)
            else:
                break
    failed = size == -2
    _wait(pgconn)
    final = pgconn.get_result()
    _drain(pgconn)
    if failed or final is None or final.status != pq.ExecStatus.COMMAND_OK:
        message = pgconn.get_error_message() if final is None else final.get_error_message()
        raise OperationalError(f"COPY of the ledger's rows failed: {message}")
    return data


def _drain(pgconn: Any) -> None:
    """The results left of the query, read and dropped, so the connection can take the next."""
    while True:
        _wait(pgconn)
        if pgconn.get_result() is None:
            return


class PostgresRows:
    """A PostgreSQL ledger's rows, a range at a time in binary COPY (see the module's doc)."""

    def __init__(self, ledger: Ledger, scan_rows: int = _SCAN_ROWS, native_copy: bool = True) -> None:
        self.ledger = ledger
        self.scan_rows = scan_rows  # rows fetched at a time by scan
        self.native_copy = native_copy  # the COPY's rows gathered by _carrow.copy_out where it can

    def __repr__(self) -> str:
        return f"PostgresRows({self.ledger.url.render_as_string(hide_password=True)!r})"

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[Any]:
        # A connection of the ledger's pool per call: the two readers of a checked read fetch
        # their ranges side by side.
        connection = self.ledger.database.raw_connection()
        try:
            cursor = connection.driver_connection.cursor()  # type: ignore[union-attr]
            try:
                yield cursor
            finally:
                cursor.close()
        finally:
            connection.rollback()
            connection.close()

    def fetch(self, after: int, until: int) -> Any:
        """Rows ``after < seq <= until`` in seq order, as PostgreSQL's binary COPY of the nine
        stored columns (a bytes-like buffer)."""
        with self._cursor() as cursor:
            # The primary key's index gives the range in seq order: no sort (which a planner
            # without statistics, on a freshly filled table, chose and spilled to disk).
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            cursor.execute("SET LOCAL enable_seqscan = off")
            sql = _COPY_SQL.format(after=int(after), until=int(until))
            return _copy_rows(cursor.connection, sql, self.native_copy)

    def by_kind(
        self,
        after: int,
        until: int,
        expected: int,
        previous: str,
        mask: int,
        typed: dict[str, Any] | None,
        scope: Scope | None = None,
    ) -> tuple[Any, ...]:
        assert _carrow is not None
        return tuple(_carrow.check_copy(self.fetch(after, until), expected, previous, mask, typed, scope))

    def rows(
        self, after: int, until: int, expected: int, previous: str, typed: dict[str, Any] | None = None
    ) -> tuple[Any, ...]:
        assert _carrow is not None
        extra = () if typed is None else (typed,)
        return tuple(_carrow.check_copy_rows(self.fetch(after, until), expected, previous, *extra))

    def scan(self, after: int, until: int, expected: int, previous: str) -> Check:
        assert _carrow is not None
        # A range at a time, each from where the one before stopped (the first may start far below
        # ``expected``: no lower bound); rows missing inside one put the next one's first out of
        # place, and a range's outcome other than OK ends the scan.
        lower = after
        while True:
            stop = min(until, max(lower, expected - 1) + self.scan_rows)
            check: Check = _carrow.check_copy(self.fetch(lower, stop), expected, previous, 0)[2]
            if check[0] != _carrow.OK or stop >= until:
                return check
            lower, expected, previous = stop, check[3] + 1, check[4]

    def stored_chains(self, seqs: list[int]) -> dict[int, str]:
        if not seqs:
            return {}
        with self._cursor() as cursor:
            cursor.execute("SELECT seq, chain FROM events WHERE seq = ANY(%s)", (seqs,))
            rows = cursor.fetchall()
        return {int(seq): str(chain) for seq, chain in rows}


def row_source(ledger: Ledger) -> RowSource | None:
    """Where the native check reads ``ledger``'s rows, or None for the driver path: the native
    parts are missing, ``KVLEDGER_READER`` or ``KVLEDGER_VERIFIER`` is ``python``, or the database
    is neither an SQLite file nor PostgreSQL through psycopg 3."""
    if _carrow is None or _cverify is None or not hasattr(_carrow, "check_copy_rows"):
        return None
    if "python" in (os.environ.get("KVLEDGER_READER", "auto"), os.environ.get("KVLEDGER_VERIFIER", "auto")):
        return None
    path = native_path(ledger)
    if path is not None:
        return SqliteRows(path)
    if ledger.url.get_backend_name() == "postgresql" and ledger.url.get_driver_name() == "psycopg":
        return PostgresRows(ledger)  # libpq's COPY stream through psycopg 3 (the default driver)
    return None
