"""``ledger compact``: an SQLite ledger's file rewritten at another page size, every row as it was."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger import BackendError, CompactError, open_ledger, verify
from ledger._backends import PAGE_SIZE
from ledger._cli import cli
from ledger._compact import compact

from ._helpers import notes, tamper_sqlite


def _older_ledger(path: Path, events: int = 3000) -> str:
    """A ledger in a file made with SQLite's 4 KiB pages, as files made before 16 KiB were."""
    with contextlib.closing(sqlite3.connect(path)) as con:
        con.execute("PRAGMA page_size=4096")
        con.execute("PRAGMA journal_mode=WAL")
    url = f"sqlite:///{path}"
    led = open_ledger(url)
    led.append_many(notes(events))
    led.close()
    return url


def _rows(url: str) -> list[tuple[object, ...]]:
    # Closed here: a connection left to the garbage collector would hold the file open.
    with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as con:
        return con.execute("SELECT * FROM events ORDER BY seq").fetchall()


def _page_size(url: str) -> int:
    with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as con:
        return int(con.execute("PRAGMA page_size").fetchone()[0])


def test_an_older_ledger_gets_16_kib_pages_and_keeps_every_row(tmp_path: Path) -> None:
    url = _older_ledger(tmp_path / "older.db")
    rows = _rows(url)
    led = open_ledger(url)
    head = led.head()
    done = compact(led)
    assert (done.page_size_before, done.page_size_after) == (4096, PAGE_SIZE) == (4096, _page_size(url))
    assert done.events == len(rows) == 3000 and head is not None
    assert (done.head_seq, done.head_chain) == (head.seq, head.chain)
    assert _rows(url) == rows  # every column of every row, in order
    # The ledger goes on as before: WAL mode, its checkpoint interval for the new pages, appends.
    led.append_many(notes(5, "after"))
    assert verify(led).ok and led.count() == 3005
    with led.database.connect() as con:
        assert con.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert con.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 16 * 2**20 // PAGE_SIZE
    led.close()


def test_another_page_size_and_again(tmp_path: Path) -> None:
    url = _older_ledger(tmp_path / "older.db", 200)
    led = open_ledger(url)
    assert compact(led, 65536).page_size_after == 65536 == _page_size(url)
    again = compact(led, 65536)  # already so: rewritten all the same, nothing lost
    assert again.page_size_before == again.page_size_after == 65536 and again.events == 200
    with pytest.raises(CompactError, match="page size 1000"):
        compact(led, 1000)
    led.close()


def test_a_ledger_that_does_not_verify_is_refused_untouched(tmp_path: Path) -> None:
    url = _older_ledger(tmp_path / "older.db", 200)
    tamper_sqlite(url, ['UPDATE events SET data = \'{"text":"forged"}\' WHERE seq = 50'])
    path = Path(url.removeprefix("sqlite:///"))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    led = open_ledger(url)
    with pytest.raises(CompactError, match=r"does not verify \(seq 50"):
        compact(led)
    led.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before and _page_size(url) == 4096


def test_a_ledger_open_elsewhere_is_refused_and_left_in_wal_mode(tmp_path: Path) -> None:
    url = _older_ledger(tmp_path / "older.db", 200)
    rows = _rows(url)
    other = sqlite3.connect(url.removeprefix("sqlite:///"))  # another reader, idle, file still open
    other.execute("SELECT count(*) FROM events").fetchone()
    led = open_ledger(url)
    try:
        with pytest.raises(CompactError, match=r"another connection has .* open"):
            compact(led)
        assert _page_size(url) == 4096 and _rows(url) == rows
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        led.append_many(notes(3, "still"))  # the ledger works as before
        assert verify(led).ok
    finally:
        other.close()
        led.close()


def test_postgresql_is_refused(pg_url: str) -> None:
    led = open_ledger(pg_url)
    try:
        with pytest.raises(BackendError, match="PostgreSQL server compacts its own tables"):
            compact(led)
    finally:
        led.close()


def test_the_command(tmp_path: Path) -> None:
    url = _older_ledger(tmp_path / "older.db", 300)
    runner = CliRunner()
    result = runner.invoke(cli, ["compact", "--db", url, "--json"])
    assert result.exit_code == 0, result.output
    done = json.loads(result.output)
    assert (done["page_size_before"], done["page_size_after"], done["events"]) == (4096, PAGE_SIZE, 300)
    text = runner.invoke(cli, ["compact", "--db", url, "--page-size", "32768"])
    words = " ".join(text.output.split())  # as the terminal's width wrapped it
    assert text.exit_code == 0 and "16,384 → 32,768" in words and "300 events verified" in words
    tamper_sqlite(url, ["DELETE FROM events WHERE seq = 7"])
    refused = runner.invoke(cli, ["compact", "--db", url])
    assert refused.exit_code == 2 and "does not verify" in refused.output
