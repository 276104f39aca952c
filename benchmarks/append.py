"""Append throughput into SQLite, against raw ``executemany`` (the limit) and eventsourcing (the peer).

All three store the same 200,000 events (about 300 bytes of data each) in
batches of the same size, one committed transaction per batch, on a file in
WAL mode. The ledger's figure covers validation, canonical JSON, digests,
chaining and the insert; the events themselves (ids, timestamps) are made by
the producer beforehand, as in real use.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from ledger import NewEvent, open_ledger

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


def bench_ledger(directory: Path, events: list[NewEvent], batch: int) -> tuple[float, list[tuple[Any, ...]]]:
    """Seconds to append ``events``; also the stored rows, for the other contenders."""
    ledger = open_ledger(f"sqlite:///{directory / 'ledger.db'}")
    with timed() as t:
        for start in range(0, len(events), batch):
            ledger.append_many(events[start : start + batch])
    rows = list(ledger.raw_rows())
    assert len(rows) == len(events) and ledger.count() == len(events)
    ledger.close()
    return t[0], rows


def bench_raw(directory: Path, rows: list[tuple[Any, ...]], batch: int, indexed: bool = False) -> float:
    """Plain ``executemany`` of the very rows the ledger stored, same PRAGMAs and batches.

    ``indexed`` adds the ledger's indexes (UNIQUE id, run_id, kind): context, not the limit.
    """
    con = sqlite3.connect(directory / f"raw{int(indexed)}.db", isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute(_PLAIN)
    if indexed:
        for statement in _INDEXES:
            con.execute(statement)
    with timed() as t:
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
    with timed() as t:
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
    with timed() as t:
        for start in range(0, len(domain), batch):
            recorder.insert_events([to_stored(d) for d in domain[start : start + batch]])
    datastore.close()
    return t[0]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks append")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1_000)
    args = parser.parse_args()
    with timed() as made:
        events = make_events(args.events)
    with tempfile.TemporaryDirectory(prefix="kvledger-bench-") as tmp:
        directory = Path(tmp)
        ledger_s, rows = bench_ledger(directory, events, args.batch)
        raw_s = bench_raw(directory, rows, args.batch)
        indexed_s = bench_raw(directory, rows, args.batch, indexed=True)
        es_s = bench_eventsourcing(directory, rows, args.batch)
        es_mapped_s = bench_eventsourcing_mapped(directory, events, args.batch)
    n = args.events
    size = sum(len(r[6]) for r in rows) / n
    print(f"{n:,} events, {size:.0f} bytes of data each, batches of {args.batch:,}")
    print(f"  producer: NewEvent creation (ids, timestamps)  {n / made[0]:>12,.0f} events/s (not counted)")
    print(f"  ledger:   validated, chained, committed         {n / ledger_s:>12,.0f} events/s")
    print(f"  raw:      sqlite3 executemany, plain table      {n / raw_s:>12,.0f} events/s (the limit)")
    print(f"  raw:      same, with the ledger's three indexes {n / indexed_s:>12,.0f} events/s (context)")
    print(f"  eventsourcing 9: Mapper(JSON) + SQLite recorder {n / es_mapped_s:>12,.0f} events/s (the peer)")
    print(f"  eventsourcing 9: recorder alone, bytes given    {n / es_s:>12,.0f} events/s (context)")
    print("  ratio_to_eventsourcing compares the same work: event objects in, committed rows out;")
    print("  the ledger also validates, digests and chains, which the peer does not.")
    emit(
        {
            "benchmark": "append",
            "events": n,
            "events_per_s": round(n / ledger_s),
            "raw_events_per_s": round(n / raw_s),
            "eventsourcing_events_per_s": round(n / es_mapped_s),
            "eventsourcing_recorder_only_events_per_s": round(n / es_s),
            "raw_indexed_events_per_s": round(n / indexed_s),
            "ratio_to_raw": round(raw_s / ledger_s, 3),
            "ratio_to_eventsourcing": round(es_mapped_s / ledger_s, 3),
            "ratio_to_eventsourcing_recorder_only": round(es_s / ledger_s, 3),
            "unix_time": int(time.time()),
        }
    )
