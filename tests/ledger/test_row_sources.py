"""The checked read's row sources: PostgreSQL's rows, fetched as binary COPY, are checked, split
and parsed by the same native code as an SQLite file's, with the same verdicts as the Python
verifier, and the native check refuses COPY data that is not the nine stored columns."""

from __future__ import annotations

import dataclasses
import io
import os
import struct
import sys
from collections.abc import Iterator
from typing import Any

import duckdb
import orjson
import pytest

from ledger import Ledger, NewEvent, open_ledger, read_jsonl, verify
from ledger._analytics import checked_source, derive_checked, derive_from_rows
from ledger._events import GENESIS
from ledger._jsonl import export_jsonl
from ledger._row_sources import PostgresRows, SqliteRows, row_source
from ledger._verify import _scan_source, conclude, read_heads, verify_ledger
from reports._views import projections
from tests._synthetic import generate

from ._helpers import tamper_postgres

_carrow = pytest.importorskip("ledger._carrow", reason="the native reader is built at install")

# Ids JSON must escape, and non-ASCII text: lengths are counted in bytes, not characters.
ODD = ['run "quoted"', "back\\slash", "blöck-ü", "tab\tand\nnewline", "☃", "ctl\x01\x1f\x7f\b\f\r", "😀 wide"]


def _events(count: int) -> list[NewEvent]:
    return [
        NewEvent(
            "note.added",
            {"text": f"n{i} {ODD[i % len(ODD)]}", "odd": ODD[i % len(ODD)], "i": i},
            run_id=ODD[i % len(ODD)] if i % 7 == 0 else None,
            block_id=ODD[(i + 3) % len(ODD)] if i % 5 == 0 else None,
        )
        for i in range(count)
    ]


@pytest.fixture
def pg(pg_url: str) -> Iterator[Ledger]:
    led = open_ledger(pg_url)
    yield led
    led.close()


@pytest.mark.postgres
def test_postgres_ledgers_are_read_by_copy(pg: Ledger, sqlite_url: str) -> None:
    """The source each backend gets, and the driver path where asked for."""
    assert isinstance(row_source(pg), PostgresRows)
    sqlite = open_ledger(sqlite_url)
    try:
        assert isinstance(row_source(sqlite), SqliteRows)
    finally:
        sqlite.close()


@pytest.mark.postgres
@pytest.mark.parametrize("variable", ["KVLEDGER_READER", "KVLEDGER_VERIFIER"])
def test_python_asked_for_gives_the_driver_path(
    pg: Ledger, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, "python")
    assert row_source(pg) is None
    assert checked_source(pg, projections()) is None


def _copy(rows: list[tuple[Any, ...]], trailer: bool = True) -> bytes:
    """Rows in PostgreSQL's binary COPY format, as the server writes them."""
    out = bytearray(b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0))
    for row in rows:
        out += struct.pack(">hiq", 9, 8, row[0])
        for value in row[1:]:
            if value is None:
                out += struct.pack(">i", -1)
            else:
                encoded = str(value).encode()
                out += struct.pack(">i", len(encoded)) + encoded
    if trailer:
        out += struct.pack(">h", -1)
    return bytes(out)


@pytest.mark.postgres
@pytest.mark.parametrize("native_copy", [True, False], ids=["native-loop", "python-loop"])
def test_copy_rows_are_the_stored_rows(pg: Ledger, native_copy: bool) -> None:
    """The server's binary COPY of a range is those rows, every byte, NULLs where stored, in seq
    order, as this test writes the format from the driver's rows: gathered by libpq's calls in
    C (``_carrow.copy_out``) or by the loop in Python."""
    pg.append_many(_events(60))
    rows = PostgresRows(pg, native_copy=native_copy)
    stored = list(pg.raw_rows(after_seq=10, until_seq=50))
    assert len(stored) == 40
    assert bytes(rows.fetch(10, 50)) == _copy(stored)
    assert bytes(rows.fetch(60, 90)) == _copy([])
    assert rows.scan(0, 60, 1, GENESIS)[0] == _carrow.OK


@pytest.mark.postgres
@pytest.mark.skipif(sys.platform != "linux", reason="the libpq is found through /proc/self/maps")
def test_the_native_loop_runs_on_the_libpq_of_the_connection(pg: Ledger) -> None:
    """Where psycopg runs on one libpq (its own wheel's here), the COPY's rows are gathered in C by
    that library's own PQgetCopyData and PQfreemem: both addresses lie in the one libpq mapped."""
    from ledger._row_sources import _libpq_copy

    pg.append_many(_events(1))  # a connection made: psycopg's libpq is loaded
    found = _libpq_copy()
    assert found is not None

    def owner(address: int) -> str:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                low, high = (int(x, 16) for x in fields[0].split("-"))
                if low <= address < high and len(fields) >= 6:
                    return fields[-1]
        return ""

    owners = {owner(address) for address in found}
    assert len(owners) == 1
    assert os.path.basename(owners.pop()).startswith("libpq")


# Each tampering scenario on PostgreSQL (as a superuser bypassing the triggers would), placed on
# the edges of the verification's ranges and of the COPY fetches inside them.
SCENARIOS: dict[str, list[str]] = {
    "clean": [],
    "edited": ["UPDATE events SET data = '{}' WHERE seq = 170"],
    "odd-id-edited": ["UPDATE events SET run_id = 'run \"quoted' WHERE seq = 148"],
    "boundary-deleted": ["DELETE FROM events WHERE seq = 100"],
    "boundary-next-deleted": ["DELETE FROM events WHERE seq = 101"],
    "fetch-edge-deleted": ["DELETE FROM events WHERE seq = 36"],
    "relinked": ["UPDATE events SET chain = digest WHERE seq = 201"],
    "boundary-chain-short": ["UPDATE events SET chain = 'abc' WHERE seq = 100"],
    "digest-upper-case": ["UPDATE events SET digest = upper(digest) WHERE seq = 120"],
    "chain-last-digit": [
        "UPDATE events SET chain = substr(chain, 1, 63) "
        "|| CASE substr(chain, 64) WHEN '0' THEN '1' ELSE '0' END WHERE seq = 240"
    ],
    "reordered": [
        "UPDATE events SET seq = -5 WHERE seq = 5",
        "UPDATE events SET seq = 5 WHERE seq = 9",
        "UPDATE events SET seq = 9 WHERE seq = -5",
    ],
    "below-one": ["UPDATE events SET seq = 0 WHERE seq = 1"],
    "tail": ["DELETE FROM events WHERE seq > 290"],
    "kind-edited": ["UPDATE events SET kind = 'note.forged' WHERE seq = 77"],
}


@pytest.mark.postgres
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_copy_and_python_verifiers_agree(pg: Ledger, pg_url: str, scenario: str) -> None:
    pg.append_many(_events(300))
    try:
        tamper_postgres(pg_url, SCENARIOS[scenario])
    except Exception as exc:  # a scenario the schema itself refuses proves nothing here
        pytest.fail(f"{scenario}: {exc}")
    verdicts = {}
    for workers in (1, 3):
        verdicts["python", workers] = verify_ledger(pg, workers=workers, verifier="python")
        verdicts["copy", workers] = verify_ledger(pg, workers=workers)
        # Fetches of 7 rows: every range is several fetches, and damage falls on their edges.
        source = PostgresRows(pg, scan_rows=7)
        read = read_heads(pg)
        verdicts["copy-7", workers] = conclude(
            _scan_source(source, read.last, workers), read.heads, read.chains_at, None
        )
    for workers in (1, 3):  # the same words for the same split
        assert verdicts["copy", workers] == verdicts["python", workers], scenario
        assert verdicts["copy-7", workers] == verdicts["python", workers], scenario
    assert len({dataclasses.replace(v, problem=None) for v in verdicts.values()}) == 1, verdicts
    assert verdicts["copy", 1].ok == (scenario == "clean")


def _tables(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    return {name: con.execute(f'SELECT * FROM "{name}" ORDER BY seq').fetchall() for name in projections()}


@pytest.mark.postgres
def test_checked_read_on_postgres_gives_the_sqlite_tables(pg: Ledger, sqlite_url: str) -> None:
    """A synthetic screening appended to both databases: the tables derived from PostgreSQL's rows,
    checked as they arrive, are those derived from the SQLite file's, and those DuckDB derives
    alone from the driver's rows."""
    events, _ = generate()
    sqlite = open_ledger(sqlite_url)
    try:
        for led in (pg, sqlite):
            led.append_sealed(read_jsonl(iter(orjson.dumps(e) for e in events)))
        head = pg.head()
        assert head is not None
        got = {}
        for name, led in (("pg", pg), ("sqlite", sqlite)):
            source = checked_source(led, projections())
            assert source is not None
            con = duckdb.connect(":memory:")
            done = derive_checked(con, source, projections(), head.seq)
            assert done is not None
            derived, checked = done
            assert (checked.last_seq, checked.last_chain) == (head.seq, head.chain)
            assert derived.rows == head.seq
            for name_held, table in derived.held.items():
                con.register(name_held, table)
            got[name] = _tables(con)
            con.close()
        plain = duckdb.connect(":memory:")
        derive_from_rows(plain, pg, projections(), head.seq)
        assert got["pg"] == got["sqlite"] == _tables(plain)
        assert verify(pg).ok and verify(pg).head_chain == head.chain
    finally:
        sqlite.close()


@pytest.mark.postgres
def test_a_tampered_postgres_row_fails_the_checked_read(pg: Ledger, pg_url: str) -> None:
    pg.append_many(_events(50))
    tamper_postgres(pg_url, ['UPDATE events SET data = \'{"text":"forged"}\' WHERE seq = 33'])
    source = checked_source(pg, projections())
    assert source is not None
    assert derive_checked(duckdb.connect(":memory:"), source, projections(), 50) is None
    result = verify(pg)
    assert (result.ok, result.first_bad_seq) == (False, 33)


_ROW = (1, "id", "ts", "kind", None, None, "{}", "0" * 64, "0" * 64)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "no signature"),
        (b"PGCOPY\n\xff\r\n\x01" + bytes(8) + struct.pack(">h", -1), "no signature"),
        (_copy([])[:15] + struct.pack(">i", 99), "extension passes the end"),
        (_copy([_ROW], trailer=False), "ends before its trailer"),
        (_copy([_ROW])[:-20], "passes the end of the data"),
        (_copy([]) + b"x", "data after the trailer"),
        (_copy([])[:-2] + struct.pack(">h", 8) + _copy([_ROW])[21:], "nine columns"),
        (_copy([])[:-2] + struct.pack(">hi", 9, 4) + bytes(4) + _copy([_ROW])[31:], "not an int8"),
        (_copy([])[:-2] + struct.pack(">hiq", 9, 8, 1) + struct.pack(">i", -7), "passes the end"),
    ],
)
def test_copy_data_that_is_not_the_nine_columns_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _carrow.check_copy(data, 1, GENESIS)


def test_copy_data_is_checked_as_the_file_is(sqlite_url: str) -> None:
    """The same rows handed over as COPY data get the SQLite read's groups and check, byte for
    byte, clean and tampered."""
    led = open_ledger(sqlite_url)
    try:
        led.append_many(_events(40))
        rows = list(led.raw_rows())
    finally:
        led.close()
    path = sqlite_url.removeprefix("sqlite:///")

    def plain(result: Any) -> Any:
        count, groups, check, unsure = result
        return (
            count,
            [
                (
                    kind,
                    n,
                    bytes(s),
                    [(None if v is None else bytes(v), z, bytes(o), bytes(d)) for v, z, o, d in cols],
                )
                for kind, n, s, cols, *_ in groups
            ],
            check,
            unsure,
        )

    from_file = _carrow.read_checked_by_kind(path, -(2**63), len(rows), 1, GENESIS)
    assert from_file[2][0] == _carrow.OK
    assert plain(_carrow.check_copy(_copy(rows), 1, GENESIS)) == plain(from_file)
    # Only some columns copied out; every row still checked.
    assert plain(_carrow.check_copy(_copy(rows), 1, GENESIS, 0b1100)) == plain(
        _carrow.read_checked_by_kind(path, -(2**63), len(rows), 1, GENESIS, 0b1100)
    )
    edited = [r if r[0] != 17 else (*r[:6], '{"text":"forged"}', *r[7:]) for r in rows]
    assert _carrow.check_copy(_copy(edited), 1, GENESIS)[2][:2] == (_carrow.EDITED, 17)


@pytest.mark.postgres
def test_snapshot_segments_of_postgres_are_read_checked(pg: Ledger, pg_url: str, sqlite_url: str) -> None:
    """A segment's rows read from PostgreSQL and checked in the same pass are the SQLite file's
    rows, with the same fields and check; a row edited on the server is named."""
    from ledger._snapshot_rows import read_checked

    sqlite = open_ledger(sqlite_url)
    try:
        pg.append_many(_events(90))
        # The same events, ids and digests in both databases.
        buffer = io.BytesIO()
        export_jsonl(pg, buffer)
        sqlite.append_sealed(read_jsonl(iter(buffer.getvalue().splitlines())))
        source = row_source(pg)
        assert isinstance(source, PostgresRows)
        for after, threads in ((0, 1), (0, 3), (30, 2)):
            previous = GENESIS if after == 0 else source.stored_chains([after])[after]
            got = read_checked(source, after, 90, previous, threads=threads)
            want = read_checked(sqlite_url.removeprefix("sqlite:///"), after, 90, previous, threads=threads)
            assert got.table.equals(want.table)
            assert (got.checked, got.fields) == (want.checked, want.fields)
            assert got.checked.bad_seq is None and got.checked.last_seq == 90
    finally:
        sqlite.close()
    tamper_postgres(pg_url, ['UPDATE events SET data = \'{"text":"forged"}\' WHERE seq = 61'])
    found = read_checked(source, 0, 90, GENESIS, threads=2).checked
    assert (found.bad_seq, found.last_seq) == (61, 60)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "sql",
    [
        "COPY (SELECT no_such_column FROM events) TO STDOUT (FORMAT binary)",  # refused at once
        "COPY (SELECT 1 / (g - 3) FROM generate_series(1, 5) AS g) TO STDOUT (FORMAT binary)",  # midway
    ],
)
@pytest.mark.parametrize("native", [True, False], ids=["native-loop", "python-loop"])
def test_a_failed_copy_is_an_error_and_the_connection_goes_on(pg: Ledger, sql: str, native: bool) -> None:
    import psycopg

    from ledger._row_sources import _copy_rows

    pg.append_many(_events(3))
    connection = pg.database.raw_connection()
    try:
        driver = connection.driver_connection
        with pytest.raises(psycopg.OperationalError, match="COPY of the ledger's rows failed"):
            _copy_rows(driver, sql, native)
        connection.rollback()
        data = _copy_rows(
            driver,
            "COPY (SELECT seq, id, ts, kind, run_id, block_id, data, digest, chain "
            "FROM events ORDER BY seq) TO STDOUT (FORMAT binary)",
            native,
        )
        assert bytes(data) == _copy(list(pg.raw_rows()))
    finally:
        connection.close()


@pytest.mark.postgres
def test_a_read_waiting_on_the_server_lets_other_threads_run(pg: Ledger) -> None:
    """The COPY is read without blocking in libpq (whose blocking calls keep the GIL): while the
    server takes two seconds, this thread keeps running."""
    import threading
    import time

    from ledger._row_sources import _copy_rows

    connection = pg.database.raw_connection()
    data: list[bytes] = []
    slow = "COPY (SELECT pg_sleep(2), 1) TO STDOUT (FORMAT binary)"
    driver = connection.driver_connection
    reader = threading.Thread(target=lambda: data.append(bytes(_copy_rows(driver, slow))))
    try:
        last = time.perf_counter()
        longest = 0.0
        reader.start()
        while reader.is_alive():
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
        reader.join()
    finally:
        connection.close()
    assert data[0].startswith(b"PGCOPY\n\xff\r\n\x00")
    assert longest < 1.0, f"this thread stalled {longest:.2f} s while the read waited on the server"


def test_a_scope_of_many_runs_keeps_exactly_their_rows(sqlite_url: str) -> None:
    """The native read keeps a scoped kind's row where its run is one of the scope's, however many
    runs it names and in whatever order (looked up by bisection over them sorted): ids that begin
    one another, non-ASCII ones, and rows without a run (always kept)."""
    import random

    runs = [f"run-{i}" for i in range(150)] + ["run", "run-1x", "é-run", "z", "run-10-"]
    led = open_ledger(sqlite_url)
    try:
        led.append_many(
            [
                NewEvent(
                    "note.added", {"text": f"n{i}"}, run_id=None if i % 9 == 0 else runs[(i * 7) % len(runs)]
                )
                for i in range(1200)
            ]
            + [
                NewEvent("run.finished", {"status": "completed", "error": None}, run_id=runs[i % len(runs)])
                for i in range(60)
            ]
        )
        rows = list(led.raw_rows())
    finally:
        led.close()
    path = sqlite_url.removeprefix("sqlite:///")
    picked = random.Random(7).sample(runs, 70)
    kinds = {str(r[3]): [] for r in rows}
    for seq, _, _, kind, run, *_ in rows:
        if kind != "note.added" or run is None or run in picked:
            kinds[str(kind)].append(int(seq))
    for order in (picked, sorted(picked), sorted(picked, reverse=True)):
        count, groups, check, _ = _carrow.read_checked_by_kind(
            path, -(2**63), len(rows), 1, GENESIS, 0, None, (("note.added",), tuple(order))
        )
        assert check[0] == _carrow.OK and count == len(rows)
        kept = {str(kind): list(struct.unpack(f"<{n}q", bytes(seqs))) for kind, n, seqs, *_ in groups}
        assert kept == kinds
    assert 0 < len(kinds["note.added"]) < 1200  # some kept, some not
