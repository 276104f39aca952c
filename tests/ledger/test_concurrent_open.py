"""Processes that open the same new SQLite ledger at once all get a working schema.

A run creates its ledger while a reader (a test polling for events, an analyst's
``ledger sql``) opens the same path: both find it empty and both create the
schema. SQLite runs that DDL outside a transaction, so before the retry in
``ledger._migrate.upgrade`` the later process failed with "table alembic_version
already exists" (seen as an exit 2 from a run started beside a reader).
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from ledger import NewEvent, open_ledger, verify
from ledger._migrate import current_revision, head_revision


def _open_and_append(url: str, worker: int) -> None:
    with open_ledger(url) as led:
        led.append(NewEvent("note.added", {"topic": "open", "text": "opened", "worker": worker}))


def test_simultaneous_first_opens_all_succeed(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for round_ in range(4):
        url = f"sqlite:///{tmp_path}/round-{round_}.db"
        workers = [ctx.Process(target=_open_and_append, args=(url, i)) for i in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert [w.exitcode for w in workers] == [0, 0, 0, 0], f"round {round_}"
        with open_ledger(url) as led:
            assert current_revision(led.database) == head_revision()
            notes = [e.data["worker"] for e in led.events(kind="note.added")]
            assert sorted(notes) == [0, 1, 2, 3]
            assert verify(led).ok
