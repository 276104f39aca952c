"""The snapshot's fast build (rows read natively into Arrow, projected while in memory) against the
driver path it replaces, its incremental refresh, and projections derived from the database's rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import ledger._analytics as analytics_module
from ledger import Analytics, Ledger, NewEvent, open_ledger, query, read_jsonl, verify
from ledger._analytics import Derived, checked_source, derive_checked, derive_from_rows, empty_table
from ledger._events import GENESIS, Head
from ledger._row_sources import row_source
from ledger._rows import SCHEMA, native_reader, read_rows, rows_to_table
from ledger._snapshot import Snapshot, _seqs_follow, table_fields
from ledger._snapshot_rows import read_checked, single_kind
from ledger._verify import RangeResult, read_heads, verify_after
from reports import audit, open_source
from reports._views import projections
from tests._synthetic import generate
from tests.ledger._helpers import tamper_sqlite


@pytest.fixture
def synthetic(sqlite_url: str) -> Ledger:
    events, _ = generate()
    led = open_ledger(sqlite_url)
    led.append_sealed(read_jsonl(iter(orjson.dumps(e) for e in events)))
    # Rows the synthetic study lacks: no run, no block, escapes and non-ASCII text, nested data.
    led.append_many(
        [
            NewEvent("note.added", {"text": 'quote " back\\slash \u00e9\u4e2d \U0001f600 \n', "n": i})
            for i in range(3)
        ]
    )
    return led


def _old_table_fields(table: object) -> dict[str, dict[str, list[str]]]:
    """The fields as the snapshot found them before (one json_type per row and field)."""
    con = duckdb.connect(":memory:")
    con.register("segment", table)
    rows = con.execute(
        "WITH k AS (SELECT kind, unnest(json_keys(data)) AS field, data FROM segment) "
        "SELECT kind, field, list(DISTINCT json_type(data, '$.' || '\"' || field || '\"')) "
        "FROM k GROUP BY kind, field"
    ).fetchall()
    con.close()
    fields: dict[str, dict[str, list[str]]] = {}
    for kind, name, types in rows:
        fields.setdefault(kind, {})[name] = sorted(types)
    return fields


def test_native_rows_equal_the_drivers_rows(synthetic: Ledger) -> None:
    assert native_reader(synthetic) is not None, "the native reader is built at install (setup.py)"
    head = synthetic.head()
    assert head is not None
    by_driver = rows_to_table(list(synthetic.raw_rows()))
    assert by_driver.column("block_id").null_count > 0 and by_driver.column("run_id").null_count > 0
    assert read_rows(synthetic, 0, head.seq).equals(by_driver)
    assert read_rows(synthetic, 0, head.seq, threads=2).equals(by_driver)
    middle = head.seq // 2
    assert read_rows(synthetic, middle, head.seq).equals(by_driver.slice(middle))
    assert read_rows(synthetic, head.seq, head.seq).num_rows == 0


def test_fields_equal_the_old_scan(synthetic: Ledger) -> None:
    table = rows_to_table(list(synthetic.raw_rows()))
    fields = table_fields(table)
    assert fields == _old_table_fields(table)
    assert fields["note.added"] == {"n": ["UBIGINT"], "text": ["VARCHAR"]}


def _files(snapshot: Snapshot, sql: str) -> list[Path]:
    return snapshot.projection_files(sql)


def _contents(analytics: Analytics) -> dict[str, list[tuple[object, ...]]]:
    con = analytics.connection()
    return {
        name: con.execute(f'SELECT * FROM "{name}" ORDER BY ALL').fetchall() for name in analytics.projections
    }


def test_fast_build_equals_the_driver_path(
    synthetic: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same ledger snapshotted natively and through the driver: the same rows, fields and
    projections; and projections derived from the database's rows equal both."""
    native = Analytics(synthetic, tmp_path / "native", projections())
    native_contents, native_fields = _contents(native), native.snapshot.fields()
    segments = [pq.read_table(p) for p in native.snapshot.segments()]
    native.close()
    monkeypatch.setenv("KVLEDGER_READER", "python")
    driver = Analytics(synthetic, tmp_path / "driver", projections())
    assert native_reader(synthetic) is None
    assert _contents(driver) == native_contents and driver.snapshot.fields() == native_fields
    for mine, theirs in zip(segments, [pq.read_table(p) for p in driver.snapshot.segments()], strict=True):
        assert mine.equals(theirs)
    driver.close()
    monkeypatch.delenv("KVLEDGER_READER")
    from_rows = Analytics(synthetic, tmp_path / "native", projections(), from_rows=True)
    assert _contents(from_rows) == native_contents
    assert from_rows.derived is not None and from_rows.derived.rows == synthetic.head().seq  # type: ignore[union-attr]
    from_rows.close()


def test_segments_split_at_their_size_and_a_few_last_rows_join_the_last(
    synthetic: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build cut into segments derives what one segment derives; rows left after a full segment
    make one of their own, but up to an eighth of a segment join the one before."""
    import ledger._snapshot as snapshot_module

    whole = Analytics(synthetic, tmp_path / "whole", projections())
    expected, fields = _contents(whole), whole.snapshot.fields()
    whole.close()
    head = synthetic.head()
    assert head is not None and head.seq > 400
    # Three segments of `size`, and 2 to 4 rows left, which join the third.
    size = (head.seq - 2) // 3
    monkeypatch.setattr(snapshot_module, "_SEGMENT_ROWS", size)
    cut = Analytics(synthetic, tmp_path / "cut", projections())
    assert _contents(cut) == expected and cut.snapshot.fields() == fields
    bounds = [
        (t.column("seq")[0].as_py(), t.column("seq")[-1].as_py())
        for t in map(pq.read_table, cut.snapshot.segments())
    ]
    assert bounds == [(1, size), (size + 1, 2 * size), (2 * size + 1, head.seq)]
    assert cut.proof.rows_checked == head.seq and not cut.proof.mismatches
    cut.close()
    size = (head.seq - 1) // 2 - size // 8  # two full segments, then more than an eighth of one
    monkeypatch.setattr(snapshot_module, "_SEGMENT_ROWS", size)
    more = Analytics(synthetic, tmp_path / "more", projections())
    assert _contents(more) == expected
    bounds = [
        (t.column("seq")[0].as_py(), t.column("seq")[-1].as_py())
        for t in map(pq.read_table, more.snapshot.segments())
    ]
    assert bounds == [(1, size), (size + 1, 2 * size), (2 * size + 1, head.seq)]
    more.close()


def test_the_segment_before_the_last_is_written_and_recorded_when_the_last_fails_its_check(
    synthetic: Ledger, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The raw write of the segment before the last waits to run beside the last one's: when the
    last segment's rows fail their check, the one before is still written, proven and recorded
    with its projections, in order, and a build of the good ledger gives the same files."""
    import ledger._snapshot as snapshot_module

    head = synthetic.head()
    assert head is not None and head.seq > 400
    size = (head.seq - 2) // 3
    monkeypatch.setattr(snapshot_module, "_SEGMENT_ROWS", size)
    good = Analytics(synthetic, tmp_path / "good", projections())
    good.connection()
    good_files = {
        p.relative_to(good.snapshot.directory): p.read_bytes()
        for p in good.snapshot.directory.rglob("*.parquet")
    }
    good.close()
    edited = head.seq - 3  # in the last segment
    tamper_sqlite(sqlite_url, [f"UPDATE events SET data = '{{\"x\":1}}' WHERE seq = {edited}"])
    cut = Analytics(synthetic, tmp_path / "cut", projections())
    cut.connection()
    folder = cut.snapshot.directory
    metas = [snapshot_module._segment_meta(p) for p in cut.snapshot.segments()]
    assert [(m["first"], m["last"], m["proven"]) for m in metas if m is not None] == [
        (1, size, True),
        (size + 1, 2 * size, True),
        (2 * size + 1, head.seq, False),
    ]
    state = json.loads((folder / "state.json").read_text())
    names = [f"events-{1:012d}-{size:012d}.parquet", f"events-{size + 1:012d}-{2 * size:012d}.parquet"]
    for entry in state["projections"].values():
        assert list(entry["files"])[:2] == names  # both recorded, in order
    for name in names:  # the proven segments and their projections: the good build's bytes
        for path in folder.rglob(name):
            assert path.read_bytes() == good_files[path.relative_to(folder)]
    cut.close()


def test_incremental_refresh_projects_only_the_new_rows(synthetic: Ledger, tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    first = Analytics(synthetic, root, projections())
    before = _contents(first)
    folder = first.snapshot.directory
    first.close()
    written = {p: p.stat().st_mtime_ns for p in folder.rglob("*.parquet")}
    head = synthetic.head()
    assert head is not None
    response = next(e for e in synthetic.events() if e.kind == "response.received")
    extra = [
        NewEvent("response.received", {**response.data, "request_id": f"late-{i}"}, response.run_id)
        for i in range(5)
    ]
    synthetic.append_many(extra)
    second = Analytics(synthetic, root, projections())
    after = _contents(second)
    assert second.proof.rows_checked == len(extra) and not second.proof.mismatches
    new_files = {p for p in folder.rglob("*.parquet")} - set(written)
    assert {p.name for p in new_files} == {f"events-{head.seq + 1:012d}-{head.seq + len(extra):012d}.parquet"}
    assert all(p.stat().st_mtime_ns == t for p, t in written.items())  # nothing rewritten
    responses = "kv_src_response_received"
    late = sorted(r for r in after[responses] if r not in before[responses])
    assert [(r[0], r[3]) for r in late] == [(head.seq + 1 + i, f"late-{i}") for i in range(len(extra))]
    assert all(after[name] == before[name] for name in before if name != responses)
    second.close()
    # The same rows derived from the database in one pass.
    fresh = Analytics(synthetic, root, projections(), from_rows=True)
    assert _contents(fresh) == after
    fresh.close()


def test_unchanged_files_are_not_read_again_and_a_rewrite_is_found_with_its_times_set_back(
    synthetic: Ledger, tmp_path: Path
) -> None:
    """A refresh hashes a file only when its inode, size or ctime moved: a rewrite whose access and
    modification times are set back still moves its ctime, so it is hashed and found."""
    root = tmp_path / "snapshots"
    Analytics(synthetic, root, projections()).connection()  # the build
    warm = Analytics(synthetic, root, projections())
    warm.connection()
    # Files are recorded with their digests as they are written: the next read hashes none of them.
    assert warm.proof.files > 2 and warm.proof.unchanged == warm.proof.files and warm.proof.bytes == 0
    folder = warm.snapshot.directory
    warm.close()
    state = json.loads((folder / "state.json").read_text())
    state["hashed"] = {}  # forgotten: each file is read and hashed once more
    (folder / "state.json").write_text(json.dumps(state))
    again = Analytics(synthetic, root, projections())
    again.connection()
    assert again.proof.files == warm.proof.files and again.proof.unchanged == 0 and again.proof.bytes > 0
    again.close()
    last = Analytics(synthetic, root, projections())
    last.connection()
    assert last.proof.unchanged == warm.proof.files and last.proof.bytes == 0
    last.close()
    paths = [p for p in folder.glob("projection-*/*.parquet") if "ttft_s" in pq.read_schema(p).names]
    assert paths
    for path in paths:
        times = path.stat()
        table = pq.read_table(path)
        column = table.schema.get_field_index("ttft_s")
        halved = table.set_column(column, "ttft_s", pc.divide(table.column("ttft_s"), 2))
        pq.write_table(halved, path, compression="zstd")
        os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
        assert path.stat().st_mtime_ns == times.st_mtime_ns
    found = Analytics(synthetic, root, projections())
    found.connection()
    assert sorted(m.file for m in found.proof.mismatches) == sorted(paths)
    found.close()


def test_rows_missing_from_the_database_are_a_broken_chain_for_a_verified_source(
    synthetic: Ledger, sqlite_url: str, tmp_path: Path
) -> None:
    """A verified source derives its tables from the rows the database holds; a deleted row is the
    verification's chain-broken finding, not an error that stops the audit."""
    tamper_sqlite(sqlite_url, ["DELETE FROM events WHERE seq = 10"])
    src = open_source(synthetic, tmp_path / "snapshots", verify=True)
    try:
        (broken,) = [f for f in audit(src) if f.code == "chain-broken"]
        assert broken.severity == "blocking"
        assert src.analytics.derived is not None and src.analytics.derived.gaps == 1
    finally:
        src.close()


def _typed_natively(table: object, ledger: Ledger) -> dict[str, dict[str, list[str]]] | None:
    path = row_source(ledger)
    assert path is not None, "the native reader and verifier are built at install (setup.py)"
    head = ledger.head()
    assert head is not None
    return read_checked(path, 0, head.seq, GENESIS).fields


def test_fields_typed_in_the_read_equal_duckdbs(synthetic: Ledger) -> None:
    """The fields the native read types as it steps the rows are those DuckDB's json_type finds,
    on every shape of value: negative and 18-digit integers, floats, nulls, booleans, nesting,
    escapes and non-ASCII text in values and keys."""
    synthetic.append_many(
        [
            NewEvent(
                "note.added",
                {
                    "text": f"shape {i}",
                    "neg": -(10**18 - 1) if i % 2 else -1,
                    "big": 10**18 - 1 if i % 3 else 2**59,
                    "float": [1.5, 1e300, -2.5e-8][i % 3],
                    "maybe": None if i % 2 else 'text \u00e9 "q" \\ \n',
                    "flag": bool(i % 2),
                    "nested": {"a": [1, {"b": "}"}], "c": "]"} if i % 2 else [[], "{"],
                    "zero": 0,
                    "\u00e9t\u00e9": i,
                },
            )
            for i in range(6)
        ]
    )
    table = rows_to_table(list(synthetic.raw_rows()))
    native = _typed_natively(table, synthetic)
    assert native == table_fields(table)
    assert native is not None
    assert native["note.added"]["float"] == ["DOUBLE"] and native["note.added"]["nested"] == [
        "ARRAY",
        "OBJECT",
    ]
    assert native["note.added"]["neg"] == ["BIGINT"] and native["note.added"]["n"] == ["UBIGINT"]


@pytest.mark.parametrize(
    "data",
    [
        {"text": "", "tab\tkey": 2},
        {"text": "", "big": 2**63},
        {"text": "", "neg": -(2**63)},
    ],
    ids=["escaped-key", "past-18-digits", "most-negative"],
)
def test_what_it_cannot_type_it_leaves_to_duckdb(
    synthetic: Ledger, tmp_path: Path, data: dict[str, object]
) -> None:
    """A key with an escape and integers of 19 digits or more (where DuckDB's reading is its own):
    the segment's fields come from DuckDB, as before."""
    synthetic.append_many([NewEvent("note.added", data)])
    table = rows_to_table(list(synthetic.raw_rows()))
    assert _typed_natively(table, synthetic) is None
    analytics = Analytics(synthetic, tmp_path / "snapshots", projections())
    analytics.connection()
    assert analytics.snapshot.fields() == table_fields(table)
    analytics.close()


def test_rows_read_in_parts_are_checked_across_the_seams(
    synthetic: Ledger, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads read parts of a range, each following the chain stored before it: a clean ledger
    reads as one proven range equal to the driver's rows; an edit in any part names its seq."""
    monkeypatch.setattr("ledger._snapshot_rows._SPLIT", 10)
    path = row_source(synthetic)
    head = synthetic.head()
    assert path is not None and head is not None
    by_driver = rows_to_table(list(synthetic.raw_rows()))
    whole = read_checked(path, 0, head.seq, GENESIS, threads=3)
    assert whole.table.equals(by_driver)
    assert (whole.checked.bad_seq, whole.checked.last_seq, whole.checked.last_chain) == (
        None,
        head.seq,
        head.chain,
    )
    chain_at_20 = str(by_driver.column("chain")[19].as_py())
    assert read_checked(path, 20, head.seq, chain_at_20, threads=2).checked.bad_seq is None
    edited = head.seq - 5  # in the last part
    tamper_sqlite(sqlite_url, [f"UPDATE events SET data = '{{\"x\":1}}' WHERE seq = {edited}"])
    found = read_checked(path, 0, head.seq, GENESIS, threads=3).checked
    assert found.bad_seq == edited and found.problem is not None and "edited" in found.problem
    tamper_sqlite(sqlite_url, ["DELETE FROM events WHERE seq = 12"])  # a seam's row, in the first part
    found = read_checked(path, 0, head.seq, GENESIS, threads=3).checked
    assert found.bad_seq == 12 and found.last_seq == 11


def test_one_kind_projections_are_recognised_and_nothing_else() -> None:
    assert single_kind("SELECT seq FROM events WHERE kind = 'request.sent'") == "request.sent"
    assert single_kind("SELECT 1 FROM (SELECT seq FROM events WHERE kind = 'it''s' ) e") == "it's"
    assert single_kind("SELECT seq FROM events WHERE kind = 'a' OR kind = 'b'") is None
    assert single_kind("SELECT seq FROM events WHERE kind = 'a' AND seq > 2") is None
    assert single_kind("SELECT * FROM events a JOIN events b USING (seq) WHERE kind = 'a'") is None
    assert all(single_kind(sql) is not None for sql in projections().values())


def test_data_keys_with_quotes_backslashes_and_dots_have_their_columns(sqlite_url: str) -> None:
    """Each awkward top-level key gets a typed column in its kind's view, as the driver reads it."""
    keys = ['say "hi"', "it's", "back\\slash", "a.b", "plain"]
    led = open_ledger(sqlite_url)
    rows = [{"text": "t", **{k: i * 10 + n for n, k in enumerate(keys)}} for i in range(3)]
    led.append_many([NewEvent("note.added", row) for row in rows])
    led.close()
    columns = ", ".join('"' + k.replace('"', '""') + '"' for k in keys)
    got = query(sqlite_url, f"SELECT {columns} FROM note_added ORDER BY seq", fmt="arrow").to_pylist()
    assert got == [{k: i * 10 + n for n, k in enumerate(keys)} for i in range(3)]


def _tables(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[object, ...]]]:
    """Each projection's rows in the order they were inserted, and its columns' names and types."""
    return {
        name: [
            *con.execute(f'SELECT * FROM "{name}"').fetchall(),
            *((c[0], c[1]) for c in con.execute(f'DESCRIBE SELECT * FROM "{name}"').fetchall()),
        ]
        for name in projections()
    }


def _checked_and_plain(ledger: Ledger) -> tuple[Head, str, Derived, dict[str, list[tuple[object, ...]]]]:
    """The ledger's head, the checked read's source, and the derivation from rows read apart
    with its tables: what a checked derivation must equal."""
    head = ledger.head()
    assert head is not None
    path = checked_source(ledger, projections())
    assert path is not None, "the native reader and verifier are built at install (setup.py)"
    plain_con = duckdb.connect(":memory:")
    plain = derive_from_rows(plain_con, ledger, projections(), head.seq)
    expected = _tables(plain_con)
    plain_con.close()
    return head, path, plain, expected


@pytest.mark.parametrize("held_rows_max", [2_000_000, 0], ids=["held-as-arrow", "copied-into-duckdb"])
def test_checked_derivation_equals_the_derivation_from_rows_and_verifies(
    synthetic: Ledger, monkeypatch: pytest.MonkeyPatch, held_rows_max: int
) -> None:
    """Rows checked as they are read and split by kind in C give the tables the rows read apart
    give, row for row, in order and of the same types, over chunks of every size, whether the
    natively parsed projections are served as the Arrow tables the read made (a ledger of up to
    2M rows) or copied into DuckDB's tables; and their check, with the rows appended after it
    scanned, is the ledger's verification."""
    head, path, plain, expected = _checked_and_plain(synthetic)
    assert any(len(rows) > 1 for rows in expected.values())
    monkeypatch.setattr(analytics_module, "_HELD_ROWS_MAX", held_rows_max)
    for chunk in (7, 64, head.seq - 1, head.seq, 250_000):
        monkeypatch.setattr(analytics_module, "_CHUNK", chunk)
        con = duckdb.connect(":memory:")
        read = read_heads(synthetic)
        done = derive_checked(con, path, projections(), head.seq)
        assert done is not None
        derived, checked = done
        # Held only under the limit, and then every kind parsed natively that has rows.
        assert (len(derived.held) > 5) == (held_rows_max > 0), sorted(derived.held)
        assert (derived.rows, derived.head_seq, derived.head_chain) == (
            plain.rows,
            plain.head_seq,
            plain.head_chain,
        )
        assert checked == RangeResult(head.seq, head.chain)
        assert _tables(con) == expected
        assert verify_after(path, read, checked) == verify(synthetic)
        con.close()
    synthetic.append_many([NewEvent("note.added", {"text": "after", "n": 9})])
    assert verify_after(path, read_heads(synthetic), checked) == verify(synthetic)
    assert verify(synthetic).head_seq == head.seq + 1


@pytest.mark.parametrize("narrowed_from", [0, 1], ids=["every-piece", "from-the-second-piece"])
def test_a_held_projection_whose_types_differ_is_copied_into_duckdb(
    synthetic: Ledger, monkeypatch: pytest.MonkeyPatch, narrowed_from: int
) -> None:
    """Serving the read's Arrow table in place of DuckDB's must change no query: where its
    types are not the table's (here ``seq`` made a 32-bit integer), or a later piece's are not
    the first's, the rows are copied into the table as before, those held first, with the
    table's types, and the other projections are still held."""
    head, path, _, expected = _checked_and_plain(synthetic)
    responses_parsed = 0
    typed_table = analytics_module.typed_table

    def narrowing(spec: Any, rows: pa.Table, fields: Any) -> pa.Table:
        nonlocal responses_parsed
        table = typed_table(spec, rows, fields)
        if spec.kind != "response.received":
            return table
        responses_parsed += 1
        if responses_parsed <= narrowed_from:
            return table
        return table.set_column(0, "seq", table.column("seq").cast(pa.int32()))

    monkeypatch.setattr(analytics_module, "typed_table", narrowing)
    # One row a chunk where the schema changes between pieces: a chunk's two parts are one kind's
    # single piece, and the parse gives one schema per kind, so the change can only come between
    # chunks.
    monkeypatch.setattr(analytics_module, "_CHUNK", 1 if narrowed_from else 64)
    con = duckdb.connect(":memory:")
    done = derive_checked(con, path, projections(), head.seq)
    assert done is not None and responses_parsed > narrowed_from + 1
    derived, _ = done
    responses = [name for name, sql in projections().items() if single_kind(sql) == "response.received"]
    assert responses and not set(responses) & set(derived.held) and len(derived.held) > 5
    assert _tables(con) == expected
    con.close()


@pytest.mark.parametrize(
    "statements",
    [
        ['UPDATE events SET data = \'{"n":1,"text":"x"}\' WHERE seq = 30'],
        ["DELETE FROM events WHERE seq = 30"],
        ["UPDATE events SET chain = digest WHERE seq = 30"],
        [
            "INSERT INTO events (seq, id, ts, kind, run_id, block_id, data, digest, chain) "
            "SELECT 0, 'planted-' || id, ts, kind, run_id, block_id, data, digest, chain "
            "FROM events WHERE seq = 1"
        ],
    ],
    ids=["edited", "deleted", "relinked", "below-seq-1"],
)
def test_a_failed_check_derives_and_verifies_as_before(
    synthetic: Ledger, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, statements: list[str]
) -> None:
    """Where the check in the read fails, no table of it is left: the tables are derived from the
    rows as the database holds them and the verification runs apart, naming the same first bad
    seq as ``ledger verify``."""
    head = synthetic.head()
    assert head is not None
    open_source(synthetic, tmp_path / "snapshots").close()  # the snapshot of the untampered rows
    tamper_sqlite(sqlite_url, statements)
    monkeypatch.setattr(analytics_module, "_CHUNK", 16)
    path = checked_source(synthetic, projections())
    assert path is not None
    con = duckdb.connect(":memory:")
    assert derive_checked(con, path, projections(), head.seq) is None
    assert con.execute("SELECT count(*) FROM duckdb_tables()").fetchone() == (0,)
    expected = verify(synthetic)
    assert not expected.ok
    src = open_source(synthetic, tmp_path / "snapshots", verify=True)
    try:
        assert src.analytics.checked is None and src.analytics.derived is not None
        assert src.verification() == expected
        (broken,) = [f for f in audit(src) if f.code == "chain-broken"]
        assert broken.severity == "blocking"
    finally:
        src.close()


def test_seqs_follow_only_where_every_chunk_steps_by_one() -> None:
    def chunked(*chunks: list[int | None]) -> pa.Table:
        return pa.Table.from_batches(
            [pa.record_batch([pa.array(c, pa.int64())], names=["seq"]) for c in chunks]
        )

    assert _seqs_follow(chunked([5, 6, 7], [8], [], [9, 10]), 5)
    assert _seqs_follow(chunked([5]), 5)
    assert _seqs_follow(chunked([]), 5)
    assert not _seqs_follow(chunked([5, 6, 7]), 4)  # not from the first seq
    assert not _seqs_follow(chunked([5, 7, 8]), 5)  # a gap
    assert not _seqs_follow(chunked([5, 6, 6, 7]), 5)  # a repeat
    assert not _seqs_follow(chunked([5, 6, 8, 7]), 5)  # out of order, same first and last
    assert not _seqs_follow(chunked([5, 6, 4]), 5)  # a step back
    assert not _seqs_follow(chunked([5, 6], [8, 9]), 5)  # a gap between chunks
    assert not _seqs_follow(chunked([5, 6], [6, 7]), 5)  # chunks overlapping
    assert not _seqs_follow(chunked([5, None, 7]), 5)  # a null


def test_a_build_and_a_derivation_import_no_pandas(synthetic: Ledger, tmp_path: Path) -> None:
    # pyarrow imports pandas the first time a Python value becomes an Arrow scalar or array (0.15
    # to 0.2 s of CPU); the snapshot's build and the report's derivations need none. In a fresh
    # interpreter, where nothing else imported it.
    synthetic.close()
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "import duckdb\n"
        "from ledger import Analytics, open_ledger\n"
        "from ledger._analytics import derive_from_rows\n"
        "from reports._views import projections\n"
        "assert 'pandas' not in sys.modules\n"
        f"led = open_ledger({synthetic.url.render_as_string()!r})\n"
        f"root = Path({str(tmp_path / 'snap')!r})\n"
        "analytics = Analytics(led, root, projections())\n"
        "analytics.connection()\n"
        "assert analytics.proof.rows_checked > 0, analytics.proof\n"
        "analytics.close()\n"
        "built = 'pandas' in sys.modules\n"
        "head = led.head().seq\n"
        "analytics = Analytics(led, root, projections(), up_to_seq=head, from_rows=True)\n"
        "analytics.connection()\n"
        "assert analytics.checked is not None and analytics.derived.rows == head, analytics.derived\n"
        "analytics.close()\n"
        "con = duckdb.connect()\n"
        "assert derive_from_rows(con, led, projections(), head).rows == head\n"
        "print(built, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, cwd=Path.cwd()
    )
    assert (out.returncode, out.stdout.strip()) == (0, "False False"), out.stderr


def test_empty_table_is_the_schemas_empty_table() -> None:
    for schema in (SCHEMA, pa.schema([("seq", pa.int64()), ("ok", pa.bool_()), ("x", pa.float64())])):
        table = empty_table(schema)
        assert table.num_rows == 0 and table.schema == schema
        assert table.equals(schema.empty_table())
