"""Append throughput into SQLite and PostgreSQL, against raw inserts (the limit) and eventsourcing (the peer).

Every contender stores the same 200,000 events (about 300 bytes of data each)
in batches of the same size, one committed transaction per batch; SQLite on a
file in WAL mode. The ledger's figure covers validation, canonical JSON,
digests, chaining and the insert; the events themselves (ids, timestamps) are
made by the producer beforehand, as in real use. The ledger appends as its
producers do, through ``Ledger.extend`` (the experiments' sink, imports, the
fills): the batch's new head comes back, not the recorded events, as the
peer's recorder gives back notification ids. ``append_many``, which also
builds an ``Event`` per event, is measured beside it. The ledger is measured
with native sealing (ledger/_cseal.c) and with the Python reference, side by
side. On SQLite with the native sealer, ``extend`` seals each batch's parts
after the first on a second thread while the part before is inserted: the
``cpu_*`` ratios count the CPU of every thread, so they say what the
throughput ratios cost.

The fair limit is a raw insert of the very rows the ledger stored into a table
with the ledger's indexes (UNIQUE id, run_id, kind): idempotency needs the
UNIQUE id. On PostgreSQL the raw contenders are psycopg ``executemany`` and
``COPY``; the server is ``$KVLEDGER_BENCH_PG_URL`` (default: the test server),
where a database of its own is made and dropped.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from ledger import NewEvent, open_ledger
from ledger._backends import sqlite_pragmas

from ._common import emit, make_events, timed

_PLAIN = (
    "CREATE TABLE plain (seq INTEGER PRIMARY KEY, id TEXT, ts TEXT, kind TEXT, run_id TEXT, "
    "block_id TEXT, data TEXT, digest TEXT, chain TEXT)"
)
_INDEXES = (
    "CREATE UNIQUE INDEX plain_id ON plain (id)",
    "CREATE INDEX plain_run ON plain (run_id)",
    "CREATE INDEX plain_kind ON plain (kind)",
)


PG_URL = os.environ.get("KVLEDGER_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
_PG_PLAIN = (
    "CREATE TABLE plain (seq BIGINT PRIMARY KEY, id VARCHAR(36) NOT NULL UNIQUE, ts VARCHAR(32) NOT NULL, "
    "kind VARCHAR(64) NOT NULL, run_id VARCHAR(64), block_id VARCHAR(64), data TEXT NOT NULL, "
    "digest VARCHAR(64) NOT NULL, chain VARCHAR(64) NOT NULL)"
)
_PG_INDEXES = ("CREATE INDEX plain_run ON plain (run_id)", "CREATE INDEX plain_kind ON plain (kind)")
_COLUMNS = "seq, id, ts, kind, run_id, block_id, data, digest, chain"
WRITERS = 4

# CPU seconds of this process in the last timed block: on a shared machine the wall clock says
# how much CPU a contender got, the CPU time what its work cost (the server's, on PostgreSQL,
# and the writer processes' are not in it).
_last_cpu = [0.0]


@contextmanager
def clocked() -> Iterator[list[float]]:
    """``with clocked() as t: ...`` then ``t[0]`` is the elapsed seconds; ``_last_cpu[0]`` the CPU seconds."""
    cpu = time.process_time()
    with timed() as t:
        yield t
    _last_cpu[0] = time.process_time() - cpu


def bench_ledger(
    url: str, events: list[NewEvent], batch: int, sealer: str = "native", method: str = "extend"
) -> tuple[float, list[tuple[Any, ...]]]:
    """Seconds to append ``events`` through ``method`` (``extend`` or ``append_many``); also the
    stored rows, for the other contenders."""
    ledger = open_ledger(url, sealer=sealer)
    assert ledger.native == (sealer == "native"), "the native sealer is not built (see setup.py)"
    append = getattr(ledger, method)
    with clocked() as t:
        for start in range(0, len(events), batch):
            append(events[start : start + batch])
    rows = list(ledger.raw_rows())
    assert len(rows) == len(events) and ledger.count() == len(events)
    ledger.close()
    return t[0], rows


def _writer(url: str, events: list[NewEvent], batch: int, start: Any) -> None:
    ledger = open_ledger(url, create=False)
    start.wait()
    for offset in range(0, len(events), batch):
        ledger.extend(events[offset : offset + batch])
    ledger.close()


def bench_concurrent(url: str, events: list[NewEvent], batch: int, writers: int) -> float:
    """Seconds for ``writers`` processes to append a share of ``events`` each, at once.

    Sealing runs in each writer; only reading the head, the insert and the commit
    are serialised by the append lock, so several writers should beat one.
    """
    import multiprocessing

    open_ledger(url).close()  # the schema, before the writers race for it
    context = multiprocessing.get_context("fork")
    start = context.Event()
    share = -(-len(events) // writers)
    procs = [
        context.Process(target=_writer, args=(url, events[w * share : (w + 1) * share], batch, start))
        for w in range(writers)
    ]
    for proc in procs:
        proc.start()
    time.sleep(0.5)  # every writer has imported and opened its ledger
    with timed() as t:
        start.set()
        for proc in procs:
            proc.join()
    assert all(proc.exitcode == 0 for proc in procs)
    ledger = open_ledger(url, create=False)
    assert ledger.count() == len(events)
    ledger.close()
    return t[0]


def bench_raw(directory: Path, rows: list[tuple[Any, ...]], batch: int, indexed: bool = False) -> float:
    """Plain ``executemany`` of the very rows the ledger stored, same PRAGMAs and batches.

    ``indexed`` adds the ledger's indexes (UNIQUE id, run_id, kind): context, not the limit.
    """
    con = sqlite3.connect(directory / f"raw{int(indexed)}.db", isolation_level=None)
    sqlite_pragmas(con)  # the ledger's own: page size, WAL, synchronous, checkpoint interval
    con.execute(_PLAIN)
    if indexed:
        for statement in _INDEXES:
            con.execute(statement)
    with clocked() as t:
        for start in range(0, len(rows), batch):
            con.execute("BEGIN IMMEDIATE")
            con.executemany("INSERT INTO plain VALUES (?,?,?,?,?,?,?,?,?)", rows[start : start + batch])
            con.execute("COMMIT")
    con.close()
    return t[0]


def bench_eventsourcing(directory: Path, rows: list[tuple[Any, ...]], batch: int) -> float:
    """eventsourcing's SQLite application recorder alone, given pre-encoded bytes (context).

    This skips what the ledger's figure includes (encoding, validation,
    digests), so it sits near the raw insert: the limit, not the peer's use.
    """
    from eventsourcing.persistence import StoredEvent
    from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

    datastore = SQLiteDatastore(str(directory / "es.db"))
    recorder = SQLiteApplicationRecorder(datastore)
    recorder.create_table()
    # One aggregate per batch: the batch is that aggregate's events, versions 1..n.
    stored = [
        StoredEvent(
            originator_id=uuid.UUID(int=start + 1),
            originator_version=i - start + 1,
            topic=row[3],
            state=row[6].encode(),
        )
        for start in range(0, len(rows), batch)
        for i, row in enumerate(rows[start : start + batch], start=start)
    ]
    with clocked() as t:
        for start in range(0, len(stored), batch):
            recorder.insert_events(stored[start : start + batch])
    datastore.close()
    return t[0]


def bench_eventsourcing_mapped(directory: Path, events: list[NewEvent], batch: int) -> float:
    """The peer as its users store events: domain event → Mapper (JSON transcoder) → recorder.

    Same start and end as the ledger's figure: producer-made event objects
    (ids and timestamps made beforehand) to committed rows, same batches.
    """
    from datetime import datetime

    from eventsourcing.domain import DomainEvent
    from eventsourcing.persistence import DatetimeAsISO, JSONTranscoder, Mapper, UUIDAsHex
    from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

    class Recorded(DomainEvent):  # a frozen dataclass, made so by eventsourcing's metaclass
        kind: str
        data: dict[str, Any]

    transcoder = JSONTranscoder()
    transcoder.register(UUIDAsHex())
    transcoder.register(DatetimeAsISO())
    mapper: Mapper[uuid.UUID] = Mapper(transcoder)
    domain = [
        Recorded(
            originator_id=uuid.UUID(int=start + 1),
            originator_version=i - start + 1,
            timestamp=datetime.fromisoformat(e.ts),
            kind=e.kind,
            data=e.data,
        )  # type: ignore[call-arg]
        for start in range(0, len(events), batch)
        for i, e in enumerate(events[start : start + batch], start=start)
    ]
    datastore = SQLiteDatastore(str(directory / "es-mapped.db"))
    recorder = SQLiteApplicationRecorder(datastore)
    recorder.create_table()
    to_stored = mapper.to_stored_event
    with clocked() as t:
        for start in range(0, len(domain), batch):
            recorder.insert_events([to_stored(d) for d in domain[start : start + batch]])
    datastore.close()
    return t[0]


@contextmanager
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database on the benchmark server, dropped afterwards; yields its URL."""
    import psycopg

    base = make_url(PG_URL)
    name = f"kvledger_bench_{uuid.uuid4().hex[:12]}"
    admin = psycopg.connect(
        host=base.host or "127.0.0.1",
        port=base.port or 5432,
        user=base.username or "postgres",
        password=base.password,
        dbname="postgres",
        autocommit=True,
    )
    try:
        admin.execute(f'CREATE DATABASE "{name}"')
        yield base.set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def bench_pg_raw(url: str, rows: list[tuple[Any, ...]], batch: int, method: str) -> float:
    """psycopg ``executemany`` or ``COPY`` of the ledger's rows into a table with its indexes."""
    import psycopg

    parsed = make_url(url)
    con = psycopg.connect(
        host=parsed.host,
        port=parsed.port,
        user=parsed.username,
        password=parsed.password,
        dbname=parsed.database,
    )
    con.execute("DROP TABLE IF EXISTS plain")
    con.execute(_PG_PLAIN)
    for statement in _PG_INDEXES:
        con.execute(statement)
    con.commit()
    cursor = con.cursor()
    with timed() as t:
        for start in range(0, len(rows), batch):
            if method == "copy":
                with cursor.copy(f"COPY plain ({_COLUMNS}) FROM STDIN") as copy:
                    for row in rows[start : start + batch]:
                        copy.write_row(row)
            else:
                cursor.executemany(
                    "INSERT INTO plain VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    rows[start : start + batch],
                )
            con.commit()
    con.close()
    return t[0]


def bench_postgres(events: list[NewEvent], batch: int) -> dict[str, float]:
    """Seconds for the ledger (both sealers) and the two raw inserts, each in a fresh database."""
    seconds: dict[str, float] = {}
    with pg_database() as url:
        seconds["ledger"], rows = bench_ledger(url, events, batch)
    with pg_database() as url:
        seconds["ledger_python"], _ = bench_ledger(url, events, batch, sealer="python")
    for method in ("executemany", "copy"):
        with pg_database() as url:
            seconds[method] = bench_pg_raw(url, rows, batch, method)
    with pg_database() as url:
        seconds["concurrent"] = bench_concurrent(url, events, batch, WRITERS)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks append")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only (no server at hand).")
    args = parser.parse_args()
    with timed() as made:
        events = make_events(args.events)
    with tempfile.TemporaryDirectory(prefix="kvledger-bench-") as tmp:
        directory = Path(tmp)
        cpu: dict[str, float] = {}
        ledger_s, rows = bench_ledger(f"sqlite:///{directory / 'ledger.db'}", events, args.batch)
        cpu["ledger"] = _last_cpu[0]
        many_s, _ = bench_ledger(
            f"sqlite:///{directory / 'many.db'}", events, args.batch, method="append_many"
        )
        cpu["many"] = _last_cpu[0]
        python_s, _ = bench_ledger(f"sqlite:///{directory / 'python.db'}", events, args.batch, "python")
        cpu["python"] = _last_cpu[0]
        raw_s = bench_raw(directory, rows, args.batch)
        cpu["raw"] = _last_cpu[0]
        indexed_s = bench_raw(directory, rows, args.batch, indexed=True)
        cpu["indexed"] = _last_cpu[0]
        es_s = bench_eventsourcing(directory, rows, args.batch)
        cpu["es"] = _last_cpu[0]
        es_mapped_s = bench_eventsourcing_mapped(directory, events, args.batch)
        cpu["es_mapped"] = _last_cpu[0]
        concurrent_s = bench_concurrent(f"sqlite:///{directory / 'writers.db'}", events, args.batch, WRITERS)
    pg = {} if args.no_postgres else bench_postgres(events, args.batch)
    n = args.events
    size = sum(len(r[6]) for r in rows) / n
    print(
        f"{n:,} events, {size:.0f} bytes of data each, batches of {args.batch:,}; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"  producer: NewEvent creation (ids, timestamps)  {n / made[0]:>12,.0f} events/s (not counted)")

    def us(key: str) -> str:
        return f"{cpu[key] / n * 1e6:6.2f} µs CPU/event"

    print("SQLite")
    print(f"  ledger:   native sealing, chained, committed    {n / ledger_s:>12,.0f} events/s {us('ledger')}")
    print(
        f"  ledger:   the same by append_many (Events back) {n / many_s:>12,.0f} events/s {us('many')} "
        "(context)"
    )
    print(
        f"  ledger:   the same, sealed in Python            {n / python_s:>12,.0f} events/s {us('python')} "
        "(reference)"
    )
    print(f"  raw:      sqlite3 executemany, plain table      {n / raw_s:>12,.0f} events/s {us('raw')}")
    print(
        f"  raw:      same, with the ledger's three indexes {n / indexed_s:>12,.0f} events/s {us('indexed')} "
        "(the limit)"
    )
    print(
        f"  eventsourcing 9: Mapper(JSON) + SQLite recorder {n / es_mapped_s:>12,.0f} events/s "
        f"{us('es_mapped')} (the peer)"
    )
    print(
        f"  eventsourcing 9: recorder alone, bytes given    {n / es_s:>12,.0f} events/s {us('es')} (context)"
    )
    print(f"  ledger:   {WRITERS} writer processes at once            {n / concurrent_s:>12,.0f} events/s")
    print("  ratio_to_eventsourcing compares the same work: event objects in, committed rows out (the")
    print("  ledger's extend gives back its new head, the peer's recorder notification ids); the ledger")
    print("  also validates, digests and chains, which the peer does not.")
    figures: dict[str, Any] = {
        "benchmark": "append",
        "events": n,
        "events_per_s": round(n / ledger_s),
        "python_sealer_events_per_s": round(n / python_s),
        "raw_events_per_s": round(n / raw_s),
        "eventsourcing_events_per_s": round(n / es_mapped_s),
        "eventsourcing_recorder_only_events_per_s": round(n / es_s),
        "raw_indexed_events_per_s": round(n / indexed_s),
        "ratio_to_raw": round(raw_s / ledger_s, 3),
        "ratio_to_raw_indexed": round(indexed_s / ledger_s, 3),
        "ratio_to_eventsourcing": round(es_mapped_s / ledger_s, 3),
        "ratio_to_eventsourcing_recorder_only": round(es_s / ledger_s, 3),
        "ratio_native_to_python_sealer": round(python_s / ledger_s, 3),
        "append_many_events_per_s": round(n / many_s),
        "append_many_cpu_us_per_event": round(cpu["many"] / n * 1e6, 3),
        "append_many_ratio_to_raw_indexed": round(indexed_s / many_s, 3),
        "append_many_ratio_to_eventsourcing": round(es_mapped_s / many_s, 3),
        "append_many_cpu_ratio_to_eventsourcing": round(cpu["es_mapped"] / cpu["many"], 3),
        "cpu_us_per_event": round(cpu["ledger"] / n * 1e6, 3),
        "raw_indexed_cpu_us_per_event": round(cpu["indexed"] / n * 1e6, 3),
        "eventsourcing_cpu_us_per_event": round(cpu["es_mapped"] / n * 1e6, 3),
        "cpu_ratio_to_raw_indexed": round(cpu["indexed"] / cpu["ledger"], 3),
        "cpu_ratio_to_eventsourcing": round(cpu["es_mapped"] / cpu["ledger"], 3),
        "writers": WRITERS,
        "concurrent_events_per_s": round(n / concurrent_s),
        "concurrent_ratio_to_one_writer": round(ledger_s / concurrent_s, 3),
        "load_1m": round(os.getloadavg()[0], 2),
        "unix_time": int(time.time()),
    }
    if pg:
        print("PostgreSQL")
        print(f"  ledger:   native sealing, chained, committed    {n / pg['ledger']:>12,.0f} events/s")
        print(f"  ledger:   the same, sealed in Python            {n / pg['ledger_python']:>12,.0f} events/s")
        print(
            f"  raw:      psycopg executemany, same indexes     {n / pg['executemany']:>12,.0f} events/s "
            "(the limit)"
        )
        print(
            f"  raw:      psycopg COPY, same indexes            {n / pg['copy']:>12,.0f} events/s (context)"
        )
        figures |= {
            "postgres_events_per_s": round(n / pg["ledger"]),
            "postgres_python_sealer_events_per_s": round(n / pg["ledger_python"]),
            "postgres_raw_indexed_events_per_s": round(n / pg["executemany"]),
            "postgres_copy_indexed_events_per_s": round(n / pg["copy"]),
            "postgres_ratio_to_raw_indexed": round(pg["executemany"] / pg["ledger"], 3),
            "postgres_ratio_to_copy_indexed": round(pg["copy"] / pg["ledger"], 3),
            "postgres_concurrent_events_per_s": round(n / pg["concurrent"]),
            "postgres_concurrent_ratio_to_one_writer": round(pg["ledger"] / pg["concurrent"], 3),
        }
    emit(figures)
