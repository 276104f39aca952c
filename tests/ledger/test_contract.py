"""The ledger's contract, run against SQLite and against PostgreSQL (eventsourcing style).

``LedgerContract`` holds every test; ``TestSQLite`` and ``TestPostgreSQL``
give it a fresh database URL and a way to tamper with it behind the triggers.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pyarrow.parquet as pq
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger import (
    GENESIS,
    ConflictError,
    EventError,
    ImportFileError,
    Ledger,
    NewEvent,
    _migrate,
    export_jsonl,
    export_parquet,
    import_jsonl,
    new_id,
    next_chain,
    open_ledger,
    query,
    sha256_hex,
    verify,
)
from ledger._schema import metadata
from ledger._store import OVERLAP_MIN_EVENTS, OVERLAP_PARTS

from ._helpers import Tamper, batch_writer, concurrent_writer, mp, note, notes, tamper_postgres, tamper_sqlite


class VerifyContract:
    """Verification finds every kind of tampering, on one backend (and one verifier)."""

    tamper_with: ClassVar[Tamper]

    @pytest.fixture
    def url(self) -> str:
        raise NotImplementedError

    @pytest.fixture
    def led(self, url: str) -> Any:
        ledger = open_ledger(url)
        yield ledger
        ledger.close()

    def tamper(self, url: str, *statements: str) -> None:
        type(self).tamper_with(url, list(statements))

    # -- tampering ---------------------------------------------------------------

    def _ten(self, led: Ledger) -> None:
        for start in range(0, 10, 2):
            led.append_many(notes(2, f"t{start}-"))

    def test_edited_data_detected(self, url: str, led: Ledger) -> None:
        self._ten(led)
        self.tamper(url, 'UPDATE events SET data = \'{"i":0,"text":"forged"}\' WHERE seq = 4')
        result = verify(led)
        assert (result.ok, result.first_bad_seq, result.count) == (False, 4, 3)
        assert "digest" in (result.problem or "")

    def test_edited_envelope_and_rehashed_digest_detected(self, url: str, led: Ledger) -> None:
        self._ten(led)
        forged = led.get(list(led.events())[5].id)
        assert forged is not None
        from ledger._events import event_digest

        digest = event_digest(forged.id, forged.ts, forged.kind, "run-x", None, b'{"text":"x"}')
        self.tamper(
            url,
            f"UPDATE events SET run_id = 'run-x', data = '{{\"text\":\"x\"}}', "
            f"digest = '{digest}' WHERE seq = 6",
        )
        assert verify(led).first_bad_seq == 6

    # Run and block ids that JSON must escape: verify may not take its plain-quoting fast path.
    ODD_IDS: ClassVar[list[str]] = [
        'run "quoted"',
        "back\\slash",
        "blöck-ü",
        "tab\tand\nnewline",
        "☃",
        "ctl\x01\x1f\x7f\b\f\r",
    ]

    def test_ids_needing_escapes_verify_and_edits_are_found(self, url: str, led: Ledger) -> None:
        odd = self.ODD_IDS
        led.append_many(
            [
                NewEvent("note.added", {"text": f"n{i}"}, run_id=run, block_id=odd[-1 - i])
                for i, run in enumerate(odd)
            ]
        )
        led.append_many(notes(3))
        assert verify(led).ok
        self.tamper(url, 'UPDATE events SET data = \'{"text":"forged"}\' WHERE seq = 2')
        assert verify(led).first_bad_seq == 2

    def test_non_canonical_envelope_digest_refused(self, url: str, led: Ledger) -> None:
        """A digest over the unescaped text (not canonical JSON) must not verify."""
        (event,) = led.append_many([NewEvent("note.added", {"text": "x"}, run_id='a"b')])
        naive = (
            f'{{"block_id":null,"data":{{"text":"x"}},"id":"{event.id}","kind":"note.added",'
            f'"run_id":"a"b","ts":"{event.ts}"}}'
        ).encode()
        digest = sha256_hex(naive)
        self.tamper(
            url,
            f"UPDATE events SET digest = '{digest}', chain = '{next_chain(GENESIS, digest)}'",
            f"UPDATE heads SET chain = '{next_chain(GENESIS, digest)}'",
        )
        result = verify(led)
        assert (result.ok, result.first_bad_seq) == (False, 1)

    def test_deleted_row_detected(self, url: str, led: Ledger) -> None:
        self._ten(led)
        self.tamper(url, "DELETE FROM events WHERE seq = 5")
        result = verify(led)
        assert (result.ok, result.first_bad_seq) == (False, 5)

    def test_reordered_rows_detected(self, url: str, led: Ledger) -> None:
        self._ten(led)
        self.tamper(
            url,
            "UPDATE events SET seq = -7 WHERE seq = 7",
            "UPDATE events SET seq = 7 WHERE seq = 3",
            "UPDATE events SET seq = 3 WHERE seq = -7",
        )
        result = verify(led)
        assert (result.ok, result.first_bad_seq) == (False, 3)

    def test_truncated_tail_detected(self, url: str, led: Ledger) -> None:
        self._ten(led)
        self.tamper(url, "DELETE FROM events WHERE seq > 7")
        result = verify(led)
        assert (result.ok, result.first_bad_seq) == (False, 8)
        assert "truncated" in (result.problem or "")

    def test_wrong_expected_head(self, led: Ledger) -> None:
        self._ten(led)
        head = led.head()
        assert head is not None and verify(led, head.chain).ok
        result = verify(led, "0" * 64)
        assert (result.ok, result.first_bad_seq) == (False, 10)

    def test_parallel_verify_names_the_same_first_bad_seq(self, url: str, led: Ledger) -> None:
        from ledger._verify import verify_ledger

        led.append_many(notes(400))
        self.tamper(
            url, "DELETE FROM events WHERE seq = 101", "UPDATE events SET data = '{}' WHERE seq = 300"
        )
        for workers in (1, 2, 3):
            result = verify_ledger(led, workers=workers)
            assert result.first_bad_seq == 101, workers


class LedgerContract(VerifyContract):
    """Every behaviour the store promises (docs/design.md), on one backend."""

    KILL_TRIALS: ClassVar[int] = 5

    # -- append ---------------------------------------------------------------

    def test_append_single(self, led: Ledger) -> None:
        event = led.append(note("hello"))
        assert (event.seq, event.data, event.kind) == (1, {"text": "hello"}, "note.added")
        assert event.chain == next_chain(GENESIS, event.digest)
        assert led.head() is not None and led.head().chain == event.chain  # type: ignore[union-attr]

    def test_append_batch_seq_and_chain(self, led: Ledger) -> None:
        first = led.append_many(notes(50))
        second = led.append_many(notes(30, "m"))
        events = list(led.events())
        assert [e.seq for e in events] == list(range(1, 81))
        assert events == first + second
        chain = GENESIS
        for event in events:
            chain = next_chain(chain, event.digest)
            assert event.chain == chain
        assert led.count() == 80

    def test_batch_is_atomic_and_error_names_the_event(self, led: Ledger) -> None:
        led.append(note("before"))
        bad = NewEvent("request.sent", {"request_id": "r"})  # missing required fields
        batch = [*notes(5), bad, *notes(5, "m")]
        with pytest.raises(EventError) as info:
            led.append_many(batch)
        assert "data.replica" in str(info.value)
        with pytest.raises(EventError, match="unknown kind"):
            led.append_many([note("a"), NewEvent("no.such.kind", {})])
        assert led.count() == 1

    def test_a_name_that_is_not_unicode_text_is_refused_by_name(self, led: Ledger) -> None:
        """A run or block id with a lone surrogate has no UTF-8 form to hash or store: refused as
        an EventError naming the field, by append_many and extend alike, and nothing written."""
        led.append(note("before"))
        for field in ("run_id", "block_id"):
            odd = NewEvent("note.added", {"text": "t"}, **{field: "run-\ud800"})
            for write in (led.append_many, led.extend):
                with pytest.raises(EventError) as info:
                    write([*notes(3), odd])
                assert info.value.field == field and "not valid Unicode text" in str(info.value)
        assert led.count() == 1 and verify(led).ok

    def test_idempotent_reappend(self, led: Ledger) -> None:
        event = note("once")
        recorded = led.append(event)
        assert led.append(event) == recorded
        again = led.append_many([event, note("new")])
        assert again[0] == recorded and again[1].seq == 2
        assert led.count() == 2

    def test_conflict_names_the_id(self, led: Ledger) -> None:
        event = led.append(note("original"))
        with pytest.raises(ConflictError) as info:
            led.append_many(
                [note("x"), NewEvent("note.added", {"text": "changed"}, id=event.id, ts=event.ts)]
            )
        assert event.id in str(info.value)
        with pytest.raises(ConflictError):
            led.append_many(
                [
                    NewEvent("note.added", {"text": "a"}, id=event.id),
                    NewEvent("note.added", {"text": "b"}, id=event.id),
                ]
            )
        assert led.count() == 1

    def test_extend_stores_what_append_many_stores(self, led: Ledger, tmp_path: Path) -> None:
        """extend: the same rows, digests and chain as append_many, and the head after the batch."""
        run = new_id()
        batches = [
            [
                NewEvent("note.added", {"text": f"é{i}", "v": [i / 3, {"b": None, "a": i}]}, run_id=run)
                for i in range(start, start + 40)
            ]
            for start in range(0, 120, 40)
        ]
        assert led.extend([]) is None  # nothing in the batch, nothing in the ledger
        reference = open_ledger(f"sqlite:///{tmp_path / 'reference.db'}")
        for batch in batches:
            head = led.extend(batch)
            recorded = reference.append_many(batch)
            assert head == led.head() == reference.head()
            assert head is not None and (head.seq, head.chain) == (recorded[-1].seq, recorded[-1].chain)
        assert list(led.raw_rows()) == list(reference.raw_rows())
        assert list(led.events()) == list(reference.events())
        reference.close()
        assert led.extend([]) == led.head()
        assert verify(led).ok and led.recorded_heads()[-1] == led.head()

    def test_extend_idempotent_atomic_and_conflicting(self, led: Ledger) -> None:
        first = note("once")
        head = led.extend([first])
        assert led.extend([first]) == head  # a known id: nothing recorded, the head stays
        assert led.recorded_heads() == [head]
        again = led.extend([first, note("new"), first])
        assert again is not None and again.seq == 2 and led.count() == 2
        assert [e.data["text"] for e in led.events()] == ["once", "new"]
        bad = NewEvent("request.sent", {"request_id": "r"})
        with pytest.raises(EventError) as info:
            led.extend([*notes(3), bad])
        assert "data.replica" in str(info.value)
        with pytest.raises(ConflictError) as conflict:
            led.extend([note("x"), NewEvent("note.added", {"text": "changed"}, id=first.id, ts=first.ts)])
        assert first.id in str(conflict.value)
        assert led.count() == 2 and led.head() == again and verify(led).ok

    def test_extend_of_large_batches_as_of_small_ones(self, led: Ledger, tmp_path: Path) -> None:
        """Batches past OVERLAP_MIN_EVENTS (on SQLite with the native sealer, sealed in parts, each
        while the one before is inserted): the rows append_many stores; a bad event in the first,
        a middle or the last part, a conflict across parts or with a recorded id, and nothing is
        written; ids repeated across parts, or recorded before in any part, appended once."""
        size = OVERLAP_PARTS * (OVERLAP_MIN_EVENTS // 2) + 44  # as many parts as there can be
        half = size // 2
        reference = open_ledger(f"sqlite:///{tmp_path / 'reference.db'}")
        batch = notes(size)
        head = led.extend(batch)
        assert head == led.head() and head is not None and head.seq == size
        reference.append_many(batch)  # the plain path, whatever the backend
        assert head == reference.head()
        bad = NewEvent("request.sent", {"request_id": "r"})
        for at in (3, half + 5, size - 1):  # the first part, a middle one, the last
            with pytest.raises(EventError) as info:
                led.extend([*notes(at, "b"), bad, *notes(size - at - 1, "c")])
            assert "data.replica" in str(info.value)
        with pytest.raises(ConflictError) as conflict:
            led.extend([*notes(size - 1, "d"), NewEvent("note.added", {"text": "changed"}, id=batch[-1].id)])
        assert batch[-1].id in str(conflict.value)
        twice = note("twice")
        with pytest.raises(ConflictError):
            led.extend([twice, *notes(size, "e"), NewEvent("note.added", {"text": "other"}, id=twice.id)])
        assert led.head() == head and led.count() == size
        # Recorded ids in the first part and in the last, and an id repeated across parts.
        fresh = notes(size, "f")
        mixed = [*batch[:10], *fresh[:half], twice, *batch[-10:], *fresh[half:], twice]
        head = led.extend(mixed)
        reference.append_many(mixed)
        assert head == reference.head()
        assert head is not None and head.seq == 2 * size + 1 and led.count() == 2 * size + 1
        assert led.extend(mixed) == head  # every id known: the head stays
        repeated = notes(size, "g")  # only the first event again, at the end: appended once
        head = led.extend([*repeated, repeated[0]])
        reference.append_many([*repeated, repeated[0]])
        assert head == reference.head() and head is not None and head.seq == 3 * size + 1
        assert list(led.raw_rows()) == list(reference.raw_rows())
        reference.close()
        assert verify(led).ok and led.recorded_heads()[-1] == head

    def test_envelope_checked(self, led: Ledger) -> None:
        for bad, field in [
            (NewEvent("note.added", {"text": "x"}, id="NOT-A-UUID"), "id"),
            (NewEvent("note.added", {"text": "x"}, ts="2024-01-01"), "ts"),
            (NewEvent("note.added", {"text": "x"}, run_id=""), "run_id"),
            (NewEvent("note.added", {"text": 3}), "data.text"),
            (NewEvent("note.added", {"text": "x", "v": float("nan")}), "data.v"),
        ]:
            with pytest.raises(EventError) as info:
                led.append(bad)
            assert info.value.field == field
        assert led.count() == 0

    def test_events_filters_and_head(self, led: Ledger) -> None:
        assert led.head() is None
        run, other = new_id(), new_id()
        led.append_many(
            [
                NewEvent(
                    "note.added",
                    {"text": str(i)},
                    run_id=run if i % 2 else other,
                    block_id="b1" if i < 4 else None,
                )
                for i in range(10)
            ]
        )
        led.append(NewEvent("run.finished", {"status": "completed", "error": None}, run_id=run))
        assert [e.seq for e in led.events(run_id=run)] == [2, 4, 6, 8, 10, 11]
        assert [e.seq for e in led.events(kind="run.finished")] == [11]
        assert len(list(led.events(kind=["run.finished", "note.added"]))) == 11
        assert [e.seq for e in led.events(block_id="b1")] == [1, 2, 3, 4]
        assert [e.seq for e in led.events(after_seq=8, until_seq=10)] == [9, 10]
        assert [e.seq for e in led.events(limit=3)] == [1, 2, 3]
        assert led.get(led.events(limit=1).__next__().id) is not None
        head = led.head()
        assert head is not None and head.seq == 11
        assert head.chain == list(led.events())[-1].chain

    # -- immutability in the database -------------------------------------------

    def test_triggers_refuse_update_and_delete(self, led: Ledger) -> None:
        led.append_many(notes(3))
        statements = [
            "UPDATE events SET data = '{}' WHERE seq = 1",
            "DELETE FROM events WHERE seq = 3",
            "UPDATE heads SET chain = 'x'",
            "DELETE FROM heads",
            *self.extra_refused,
        ]
        for statement in statements:
            with pytest.raises(DBAPIError, match="append-only"), led.database.begin() as conn:
                conn.execute(text(statement))
        assert led.count() == 3 and verify(led).ok

    extra_refused: ClassVar[list[str]] = []

    # -- migrations --------------------------------------------------------------

    def test_init_upgrades_to_head(self, url: str) -> None:
        ledger = open_ledger(url)
        assert _migrate.current_revision(ledger.database) == _migrate.head_revision()
        ledger.close()
        from click.testing import CliRunner

        from ledger._cli import cli

        result = CliRunner().invoke(cli, ["--help"])
        assert result.exit_code == 0
        again = CliRunner().invoke(cli, ["init", "--db", url])
        assert again.exit_code == 0, again.output
        assert str(_migrate.head_revision()) in again.output

    def test_metadata_and_migrations_agree(self, led: Ledger) -> None:
        with led.database.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), metadata)
        assert diffs == []

    # -- import / export ------------------------------------------------------------

    def test_export_import_reproduces_chain(self, led: Ledger, tmp_path: Path, url: str) -> None:
        run = new_id()
        led.append_many(
            [NewEvent("note.added", {"text": f"é{i}", "f": i / 3, "n": None}, run_id=run) for i in range(20)]
        )
        led.append(NewEvent("run.finished", {"status": "completed", "error": None}, run_id=run))
        out = tmp_path / "out.jsonl"
        with open(out, "wb") as handle:
            assert export_jsonl(led, handle) == 21
        target = open_ledger(f"sqlite:///{tmp_path / 'copy.db'}")
        assert import_jsonl(target, out) == 21
        assert [(e.digest, e.chain, e.seq) for e in target.events()] == [
            (e.digest, e.chain, e.seq) for e in led.events()
        ]
        assert target.head() == led.head()
        assert import_jsonl(target, out) == 21  # idempotent
        assert target.count() == 21 and verify(target).ok

    def test_import_bare_envelopes(self, led: Ledger, tmp_path: Path) -> None:
        bare = [
            {
                "id": new_id(),
                "ts": "2026-01-01T00:00:00.000000Z",
                "kind": "note.added",
                "run_id": None,
                "block_id": None,
                "data": {"text": str(i)},
            }
            for i in range(3)
        ]
        path = tmp_path / "bare.jsonl"
        path.write_bytes(b"".join(orjson.dumps(b) + b"\n" for b in bare))
        assert import_jsonl(led, path) == 3
        assert [e.id for e in led.events()] == [b["id"] for b in bare]

    @pytest.mark.parametrize(
        ("line", "field", "needle"),
        [
            (b"{not json", None, "not valid JSON"),
            (
                b'{"id": "%s", "ts": "2026-01-01T00:00:00.000000Z", "kind": "no.such", "run_id": null, '
                b'"block_id": null, "data": {}}',
                "kind",
                "unknown kind",
            ),
            (
                b'{"id": "%s", "ts": "2026-01-01T00:00:00.000000Z", "kind": "note.added", "run_id": null, '
                b'"block_id": null, "data": {}}',
                "data.text",
                "missing",
            ),
            (
                b'{"id": "%s", "ts": "2026-01-01T00:00:00.000000Z", "kind": "note.added", "run_id": null, '
                b'"block_id": null, "data": {"text": 5}}',
                "data.text",
                "must be str",
            ),
            (
                b'{"id": "%s", "ts": "2026-01-01T00:00:00.000000Z", "kind": "note.added", "run_id": null, '
                b'"data": {"text": "x"}}',
                "block_id",
                "missing",
            ),
            (
                b'{"id": "%s", "ts": "2026-01-01T00:00:00.000000Z", "kind": "note.added", "run_id": null, '
                b'"block_id": null, "data": {"text": "x"}, "digest": "' + b"0" * 64 + b'"}',
                "digest",
                "hashes to",
            ),
        ],
    )
    def test_malformed_import_rejected_whole(
        self, led: Ledger, tmp_path: Path, line: bytes, field: str | None, needle: str
    ) -> None:
        good = [
            orjson.dumps(
                {
                    "id": new_id(),
                    "ts": "2026-01-01T00:00:00.000000Z",
                    "kind": "note.added",
                    "run_id": None,
                    "block_id": None,
                    "data": {"text": "ok"},
                }
            )
            for _ in range(3)
        ]
        bad = line.replace(b"%s", new_id().encode()) if b"%s" in line else line
        path = tmp_path / "bad.jsonl"
        path.write_bytes(b"\n".join([*good, bad, *good[:1]]) + b"\n")
        with pytest.raises(ImportFileError) as info:
            import_jsonl(led, path)
        assert info.value.line == 4 and info.value.field == field
        assert "line 4" in str(info.value) and needle in str(info.value)
        assert led.count() == 0

    def test_parquet_export_readable(self, led: Ledger, tmp_path: Path) -> None:
        led.append_many(notes(5))
        led.append(NewEvent("run.finished", {"status": "completed", "error": None}))
        written = export_parquet(led, tmp_path / "pq")
        assert written["events.parquet"] == 6 and written["note_added.parquet"] == 5
        table = pq.read_table(tmp_path / "pq" / "note_added.parquet")
        assert table.column("text").to_pylist() == [f"n{i}" for i in range(5)]
        seqs = pq.read_table(tmp_path / "pq" / "events.parquet").column("seq").to_pylist()
        assert seqs == list(range(1, 7))

    # -- analytics ---------------------------------------------------------------

    def test_views_typed_and_formats(self, led: Ledger) -> None:
        led.append_many(
            [
                NewEvent(
                    "response.received",
                    {
                        "request_id": f"r{i}",
                        "status": 200,
                        "ttft_s": 0.1 * (i + 1),
                        "t_first": 0.1,
                        "t_last": 0.2,
                        "e2e_s": 0.3,
                        "prompt_tokens": 100 + i,
                        "output_tokens": 8,
                        "cached_tokens": 0,
                        "decode_rate": 25.0,
                        "text_sha256": "ab",
                        "finish_reason": "length",
                        "error": None,
                        "ttft_method": "kernel-stamp",
                    },
                )
                for i in range(4)
            ]
        )
        table = query(led, "SELECT prompt_tokens, ttft_s, status FROM response_received ORDER BY seq")
        assert table.column("prompt_tokens").to_pylist() == [100, 101, 102, 103]
        assert str(table.schema.field("prompt_tokens").type) == "int64"
        assert str(table.schema.field("ttft_s").type) == "double"
        assert query(led, "SELECT count(*) AS n FROM events", "pandas")["n"][0] == 4
        assert query(led, "SELECT count(*) AS n FROM events", "polars")["n"][0] == 4
        assert query(led, "SELECT * FROM response_received").num_rows == 4
        assert query(led, "SELECT * FROM events").num_rows == 4

    def test_snapshot_refresh_and_rebuild(self, led: Ledger, url: str) -> None:
        led.append_many(notes(3))
        assert query(led, "SELECT count(*) AS n FROM note_added").column("n")[0].as_py() == 3
        led.append_many(notes(4, "m"))
        assert query(led, "SELECT count(*) AS n FROM note_added").column("n")[0].as_py() == 7
        # A different ledger at the same place: the snapshot must not serve the old one.
        self.tamper(url, "DELETE FROM events", "DELETE FROM heads")
        led.append_many(notes(2, "z"))
        texts = query(led, "SELECT text FROM note_added ORDER BY seq").column("text").to_pylist()
        assert texts == ["z0", "z1"]

    def test_projections_follow_segments_sql_and_rebuilds(
        self, led: Ledger, url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from ledger import Analytics, _snapshot

        texts = "SELECT seq, data->>'text' AS text FROM events WHERE kind = 'note.added'"

        def project(sql: str = texts) -> list[str]:
            analytics = Analytics(led, projections={"texts": sql})
            try:
                return [
                    r[0]
                    for r in analytics.connection().execute("SELECT text FROM texts ORDER BY seq").fetchall()
                ]
            finally:
                analytics.close()

        led.append_many(notes(3))
        assert project() == ["n0", "n1", "n2"]
        led.append_many(notes(2, "m"))  # a second segment: only it is projected now
        folder = Analytics(led).snapshot._projection_dir(texts)
        before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
        assert project() == ["n0", "n1", "n2", "m0", "m1"]
        after = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
        assert len(after) == 2 and all(after[name] == t for name, t in before.items())
        # Other SQL is another projection, never the old files under a new meaning.
        assert project(texts.replace("->>'text'", "->>'i'")) == ["0", "1", "2", "0", "1"]
        # Compaction merges segments and drops their projections; the next reader projects anew.
        monkeypatch.setattr(_snapshot, "_MAX_SEGMENTS", 1)
        led.append_many(notes(1, "c"))
        assert project() == ["n0", "n1", "n2", "m0", "m1", "c0"]
        assert len(list(folder.iterdir())) == 1
        # A different ledger at the same place: the snapshot and its projections are rebuilt.
        self.tamper(url, "DELETE FROM events", "DELETE FROM heads")
        led.append_many(notes(2, "z"))
        assert project() == ["z0", "z1"]

    # -- concurrency and crashes -------------------------------------------------------

    def test_concurrent_writers(self, led: Ledger, url: str) -> None:
        workers, each = 4, 5_000
        procs = [mp().Process(target=concurrent_writer, args=(url, w, each)) for w in range(workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
            assert p.exitcode == 0
        events = list(led.events())
        assert len(events) == workers * each
        assert [e.seq for e in events] == list(range(1, workers * each + 1))
        assert len({e.id for e in events}) == workers * each
        assert Counter(e.data["worker"] for e in events) == {w: each for w in range(workers)}
        assert verify(led).ok

    def test_kill_9_mid_batch(self, led: Ledger, url: str) -> None:
        rng = random.Random(9)
        reported: dict[str, int] = {}
        for trial in range(self.KILL_TRIALS):
            receiver, sender = mp().Pipe(duplex=False)
            proc = mp().Process(target=batch_writer, args=(url, trial, sender))
            proc.start()
            sender.close()
            assert receiver.poll(30), "the writer committed nothing"
            time.sleep(rng.uniform(0.0, 0.15))
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
            while receiver.poll():
                try:
                    batch_id, size = receiver.recv()
                except EOFError:
                    break
                reported[batch_id] = size
            receiver.close()
        sizes = Counter(e.data["text"] for e in led.events())
        for batch_id, size in reported.items():
            assert sizes[batch_id] == size, f"committed batch {batch_id} lost"
        for event in led.events():
            assert sizes[event.data["text"]] == event.data["size"], "a partial batch is visible"
        assert verify(led).ok
        assert len(sizes) >= len(reported) >= self.KILL_TRIALS


class TestSQLite(LedgerContract):
    tamper_with = staticmethod(tamper_sqlite)
    KILL_TRIALS = 20

    @pytest.fixture
    def url(self, sqlite_url: str) -> str:
        return sqlite_url

    def test_snapshot_rebuilt_for_another_file_at_the_same_path(self, url: str, tmp_path: Path) -> None:
        first = open_ledger(url)
        first.append_many(notes(5))
        assert query(first, "SELECT count(*) AS n FROM events").column("n")[0].as_py() == 5
        first.close()
        for suffix in ("", "-wal", "-shm"):
            Path(tmp_path / f"ledger.db{suffix}").unlink(missing_ok=True)
        second = open_ledger(url)
        second.append_many(notes(6, "other"))
        texts = query(second, "SELECT text FROM note_added ORDER BY seq").column("text").to_pylist()
        assert texts == [f"other{i}" for i in range(6)]
        second.close()

    def test_new_ledgers_have_16_kib_pages_and_older_ones_keep_theirs(self, tmp_path: Path) -> None:
        """A new file gets 16 KiB pages; a file made with 4 KiB pages keeps them, is read and
        appended to as before, and either checkpoints its WAL every 16 MiB."""
        import sqlite3

        from ledger._backends import PAGE_SIZE, WAL_AUTOCHECKPOINT_BYTES

        older = tmp_path / "older.db"
        with sqlite3.connect(older) as con:
            con.execute("PRAGMA page_size=4096")
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("CREATE TABLE other (x)")  # the page size is now fixed
        for path, pages in ((tmp_path / "new.db", PAGE_SIZE), (older, 4096)):
            led = open_ledger(f"sqlite:///{path}")
            led.append_many(notes(50))
            with led.database.connect() as con:
                assert con.exec_driver_sql("PRAGMA page_size").scalar() == pages
                assert con.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == (
                    WAL_AUTOCHECKPOINT_BYTES // pages
                )
            assert verify(led).ok and led.count() == 50
            led.close()
        assert PAGE_SIZE == 16384

    def test_native_verifier_is_built(self, led: Ledger) -> None:
        """This machine has a compiler and the headers: the fast path must not fall back silently."""
        from ledger import _verify

        assert _verify._cverify is not None, "ledger/_cverify.c was not built at install"
        assert _verify.native_path(led) is not None

    def test_a_large_batch_finding_the_lock_held_is_sealed_whole_before_it_waits(self, led: Ledger) -> None:
        """Another writer holds the append lock: the batch is not sealed in parts inside it (which
        would hold that writer's successors up) but whole, as the plain path does, and then waits;
        the connection's busy timeout, set to 0 for the try, is as it was."""

        def busy_timeout() -> int:
            connection = led.database.raw_connection()
            try:
                return int(connection.cursor().execute("PRAGMA busy_timeout").fetchone()[0])
            finally:
                connection.close()

        waits = busy_timeout()
        assert waits > 0
        holder = sqlite3.connect(str(led.url.database), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        heads: list[Any] = []
        writer = threading.Thread(target=lambda: heads.append(led.extend(notes(OVERLAP_MIN_EVENTS))))
        writer.start()
        time.sleep(0.5)
        assert writer.is_alive() and not heads  # waiting for the lock
        holder.execute("COMMIT")
        holder.close()
        writer.join(60)
        assert heads and heads[0] is not None and heads[0].seq == OVERLAP_MIN_EVENTS == led.count()
        assert led._sealer_pool is None  # no part was sealed beside an insert
        assert busy_timeout() == waits
        assert verify(led).ok

    def test_large_batches_are_sealed_beside_their_insert(self, led: Ledger) -> None:
        """The path the large-batch contract covers here: the second half sealed while the first is
        inserted, on the ledger's own sealing thread (one per ledger and process, gone with close)."""
        assert led.native_insert
        led.extend(notes(OVERLAP_MIN_EVENTS - 1))
        assert led._sealer_pool is None  # a small batch: the plain path
        led.extend(notes(OVERLAP_MIN_EVENTS, "m"))
        assert led._sealer_pool is not None
        pool = led._sealer_pool[1]
        led.close()
        assert led._sealer_pool is None and pool._shutdown
        assert verify(led).ok and led.count() == 2 * OVERLAP_MIN_EVENTS - 1

    def test_native_sealer_is_built(self, led: Ledger) -> None:
        """Likewise for append: sealing and chaining run natively unless told otherwise."""
        from ledger import _events

        assert _events._cseal is not None, "ledger/_cseal.c was not built at install"
        assert led.native is True

    # Each tampering scenario, on ranges split so that some damage falls on a boundary.
    SCENARIOS: ClassVar[dict[str, list[str]]] = {
        "clean": [],
        "edited": ["UPDATE events SET data = '{}' WHERE seq = 1700"],
        "boundary-deleted": ["DELETE FROM events WHERE seq = 1000"],
        "boundary-next-deleted": ["DELETE FROM events WHERE seq = 1001"],
        "relinked": ["UPDATE events SET chain = digest WHERE seq = 2001"],
        "boundary-chain-short": ["UPDATE events SET chain = 'abc' WHERE seq = 1000"],
        "boundary-chain-non-text": ["UPDATE events SET chain = 7 WHERE seq = 1500"],
        # The stored hex must be the digest's exact spelling: lower case, text.
        "digest-upper-case": ["UPDATE events SET digest = upper(digest) WHERE seq = 1200"],
        "chain-upper-case": ["UPDATE events SET chain = upper(chain) WHERE seq = 1300"],
        "digest-blob": ["UPDATE events SET digest = CAST(digest AS BLOB) WHERE seq = 2200"],
        # One hex digit off, the last: every byte of the spelling is compared.
        "digest-last-digit": [
            "UPDATE events SET digest = substr(digest, 1, 63) "
            "|| CASE substr(digest, 64) WHEN '0' THEN '1' ELSE '0' END WHERE seq = 1400"
        ],
        "chain-last-digit": [
            "UPDATE events SET chain = substr(chain, 1, 63) "
            "|| CASE substr(chain, 64) WHEN '0' THEN '1' ELSE '0' END WHERE seq = 2400"
        ],
        "reordered": [
            "UPDATE events SET seq = -5 WHERE seq = 5",
            "UPDATE events SET seq = 5 WHERE seq = 9",
            "UPDATE events SET seq = 9 WHERE seq = -5",
        ],
        "below-one": ["UPDATE events SET seq = 0 WHERE seq = 1"],
        "tail": ["DELETE FROM events WHERE seq > 2990"],
        "odd-id-edited": ['UPDATE events SET data = \'{"text":"x"}\' WHERE seq = 2500'],
        "non-text": ["UPDATE events SET id = 7 WHERE seq = 1500"],
    }

    @pytest.mark.parametrize("scenario", sorted(SCENARIOS))
    def test_native_and_python_verifiers_agree(self, url: str, led: Ledger, scenario: str) -> None:
        from ledger._verify import verify_ledger

        odd = self.ODD_IDS
        led.append_many(
            [
                NewEvent(
                    "note.added",
                    {"text": f"n{i}", "odd": odd[i % len(odd)]},
                    run_id=odd[i % len(odd)] if i % 7 == 0 else None,
                )
                for i in range(3000)
            ]
        )
        self.tamper(url, *self.SCENARIOS[scenario])
        verdicts = {}
        for verifier in ("native", "python"):
            for workers in (1, 3):
                verdicts[verifier, workers] = verify_ledger(led, workers=workers, verifier=verifier)
        for workers in (1, 3):  # the same words for the same split
            assert verdicts["native", workers] == verdicts["python", workers], scenario
        # Where the split falls may change how a gap is worded, never which seq is first bad.
        assert len({dataclasses.replace(v, problem=None) for v in verdicts.values()}) == 1, verdicts
        assert verdicts["native", 1].ok == (scenario == "clean")


class TestSQLitePythonVerifier(VerifyContract):
    """The tampering contract again on SQLite, through the Python verifier (no native build)."""

    tamper_with = staticmethod(tamper_sqlite)

    @pytest.fixture
    def url(self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
        monkeypatch.setenv("KVLEDGER_VERIFIER", "python")
        return sqlite_url


@pytest.mark.postgres
class TestPostgreSQL(LedgerContract):
    tamper_with = staticmethod(tamper_postgres)
    KILL_TRIALS = 8
    extra_refused: ClassVar[list[str]] = ["TRUNCATE events", "TRUNCATE heads"]

    @pytest.fixture
    def url(self, pg_url: str) -> str:
        return pg_url


@pytest.mark.postgres
class TestPostgreSQLPythonVerifier(VerifyContract):
    """The tampering contract again on PostgreSQL through the Python verifier: the reference for
    the native check of the rows' binary COPY that TestPostgreSQL goes through."""

    tamper_with = staticmethod(tamper_postgres)

    @pytest.fixture
    def url(self, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
        monkeypatch.setenv("KVLEDGER_VERIFIER", "python")
        return pg_url


class TestSQLitePythonSealer(LedgerContract):
    """The whole contract again on SQLite with append sealing and chaining in Python (the reference)."""

    tamper_with = staticmethod(tamper_sqlite)
    KILL_TRIALS = 8

    @pytest.fixture
    def url(self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
        monkeypatch.setenv("KVLEDGER_SEALER", "python")  # writer processes inherit it
        return sqlite_url

    def test_python_sealer_in_use(self, led: Ledger) -> None:
        assert led.native is False


@pytest.mark.postgres
class TestPostgreSQLPythonSealer(TestPostgreSQL):
    """The whole contract again on PostgreSQL with append sealing and chaining in Python."""

    @pytest.fixture
    def url(self, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
        monkeypatch.setenv("KVLEDGER_SEALER", "python")
        return pg_url

    def test_python_sealer_in_use(self, led: Ledger) -> None:
        assert led.native is False
