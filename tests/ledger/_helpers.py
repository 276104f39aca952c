"""Helpers of the ledger suite: events, tampering as an attacker would, writer processes."""

from __future__ import annotations

import multiprocessing
import random
import sqlite3
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import make_url

from ledger import NewEvent, open_ledger

Tamper = Callable[[str, list[str]], None]


def note(text: str, **extra: Any) -> NewEvent:
    """A ``note.added`` event."""
    return NewEvent("note.added", {"text": text, **extra})


def notes(count: int, prefix: str = "n") -> list[NewEvent]:
    return [note(f"{prefix}{i}", i=i) for i in range(count)]


def tamper_sqlite(url: str, statements: list[str]) -> None:
    """Bypass the triggers the way an attacker with the file would: drop them, then write."""
    con = sqlite3.connect(make_url(url).database or "", isolation_level=None)
    try:
        triggers = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")]
        for name in triggers:
            con.execute(f'DROP TRIGGER "{name}"')
        for statement in statements:
            con.execute(statement)
    finally:
        con.close()


def tamper_postgres(url: str, statements: list[str]) -> None:
    """Bypass the triggers as a superuser would: disable them for this session's writes."""
    import psycopg

    parsed = make_url(url)
    with psycopg.connect(
        host=parsed.host,
        port=parsed.port,
        user=parsed.username,
        password=parsed.password,
        dbname=parsed.database,
        autocommit=True,
    ) as con:
        con.execute("SET session_replication_role = replica")
        for statement in statements:
            con.execute(statement)  # type: ignore[arg-type]


def mp() -> Any:
    """A multiprocessing context that starts children without re-importing the world."""
    return multiprocessing.get_context("fork")


def concurrent_writer(url: str, worker: int, count: int) -> None:
    """Append ``count`` events: mostly in batches, every tenth one alone; odd workers through
    ``extend`` (no recorded events returned), even ones through ``append_many``."""
    rng = random.Random(worker)
    ledger = open_ledger(url, create=False)
    append = ledger.extend if worker % 2 else ledger.append_many
    done = 0
    while done < count:
        # Up to 400: extend's batches past OVERLAP_MIN_EVENTS are sealed beside their insert.
        size = 1 if rng.random() < 0.2 else min(rng.randrange(20, 400), count - done)
        append([note(f"w{worker}-{done + i}", worker=worker) for i in range(size)])
        done += size
    ledger.close()


def batch_writer(url: str, worker: int, report: Any) -> None:
    """Append batches forever; after each commit report ``(batch_id, size)`` down the pipe.
    Odd workers append through ``extend``, even ones through ``append_many``."""
    rng = random.Random(worker)
    ledger = open_ledger(url, create=False)
    append = ledger.extend if worker % 2 else ledger.append_many
    number = 0
    while True:
        batch_id = f"b{worker}-{number}"
        size = rng.randrange(1, 400)
        append([note(batch_id, i=i, size=size) for i in range(size)])
        report.send((batch_id, size))
        number += 1
