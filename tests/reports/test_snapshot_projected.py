"""Projection files written from the tables the segment's own read typed (ledger/_carrow.c
``read_checked`` with a typed spec), rather than by DuckDB parsing every row's JSON again: DuckDB
reads each such file with the SQL's own columns and types and the rows the SQL gives over the
segment; a kind whose rows the native parse was not sure of, or whose table DuckDB would read
otherwise, is left to DuckDB's COPY."""

from __future__ import annotations

from pathlib import Path

import duckdb
import orjson
import pyarrow as pa
import pytest

from ledger import Analytics, Ledger, NewEvent, open_ledger, read_jsonl
from ledger._snapshot import _native_specs, _reads_as, rows_differing, sql_literal
from ledger._snapshot_rows import single_kind
from reports._views import projections
from tests._synthetic import generate
from tests.reports.test_typed_parse import awkward  # noqa: F401  (a fixture)


def _study(url: str) -> Ledger:
    events, _ = generate()
    led = open_ledger(url)
    led.append_sealed(read_jsonl(iter(orjson.dumps(e) for e in events)))
    led.append_many([NewEvent("note.added", {"text": 'q " \\ \u00e9\u4e2d \n', "n": i}) for i in range(3)])
    return led


def _kinds_present(led: Ledger) -> set[str]:
    return {e.kind for e in led.events()}


def _differences(con: duckdb.DuckDBPyConnection, sql: str, segment: Path, file: Path) -> tuple[int, bool]:
    """Rows in one and not the other (both ways, with repeats), and whether the columns and types
    DuckDB reads from the file are those the SQL gives over the segment."""
    differing = rows_differing(con, sql, segment, file)
    assert differing is not None
    want = [r[:2] for r in con.execute(f"DESCRIBE {sql}").fetchall()]
    got = [r[:2] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet({sql_literal(file)})").fetchall()]
    return differing, want == got


def _every_file_as_its_sql_gives(analytics: Analytics) -> int:
    """Each projection file of each segment against its SQL derived again from the segment; returns
    the files compared."""
    con = duckdb.connect(":memory:")
    compared = 0
    for sql in analytics.projections.values():
        for segment, file in zip(
            analytics.snapshot.segments(), analytics.snapshot.projection_files(sql), strict=True
        ):
            assert file.name == segment.name
            rows_differing, same_types = _differences(con, sql, segment, file)
            assert rows_differing == 0 and same_types, (sql[:80], file)
            compared += 1
    con.close()
    return compared


@pytest.mark.parametrize("segment_rows", [None, 700])
def test_files_from_the_reads_tables_equal_what_the_sql_gives(
    ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, segment_rows: int | None
) -> None:
    """On both backends, in one segment or several: every projection of a kind the ledger holds is
    written from the read's tables, and DuckDB reads each file as the SQL's own output over its
    segment (the rows, the columns, the types); the full proof finds nothing."""
    if segment_rows is not None:
        monkeypatch.setattr("ledger._snapshot._SEGMENT_ROWS", segment_rows)
    led = _study(ledger_url)
    present = _kinds_present(led)
    specs = _native_specs(projections())
    assert specs is not None, "the native read is built at install (setup.py)"
    natively = {name for name in specs.names() if single_kind(projections()[name]) in present}
    analytics = Analytics(led, tmp_path / "snapshots", projections())
    analytics.connection()
    segments = len(analytics.snapshot.segments())
    assert (segments > 1) == (segment_rows is not None)
    # Every typed projection of a kind present, in every segment that holds its kind (at least once).
    assert analytics.proof.projected_natively >= len(natively) > 10
    assert _every_file_as_its_sql_gives(analytics) == segments * len(projections())
    analytics.close()
    assert not analytics.snapshot.check(led).mismatches
    led.close()


def test_a_kind_the_read_was_not_sure_of_is_projected_by_duckdb(
    awkward: Ledger,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """request.sent and metrics.scraped rows the native parse leaves to DuckDB (U+0000 in a string, an
    integer of 20 digits, a counter's value as text): their projections are DuckDB's, the others'
    the read's; every file is what its SQL gives, and the same contents as the driver path's."""
    specs = _native_specs(projections())
    assert specs is not None
    present = _kinds_present(awkward)
    doubted = {"request.sent", "metrics.scraped"}
    natively = {n for n in specs.names() if single_kind(projections()[n]) in present - doubted}
    analytics = Analytics(awkward, tmp_path / "native", projections())
    analytics.connection()
    assert analytics.proof.projected_natively == len(natively)
    _every_file_as_its_sql_gives(analytics)
    con = analytics.connection()
    contents = {n: con.execute(f'SELECT * FROM "{n}" ORDER BY ALL').fetchall() for n in analytics.projections}
    analytics.close()
    monkeypatch.setenv("KVLEDGER_READER", "python")
    driver = Analytics(awkward, tmp_path / "driver", projections())
    con = driver.connection()
    assert driver.proof.projected_natively == 0
    by_driver = {n: con.execute(f'SELECT * FROM "{n}" ORDER BY ALL').fetchall() for n in driver.projections}
    assert by_driver == contents
    driver.close()


def test_a_table_duckdb_would_read_with_other_types_is_not_written() -> None:
    """The check that lets a table stand for its SQL's output: the same names and types pass; a column
    of another type, or missing, does not."""
    sql = projections()["kv_src_run_finished"]
    text = ("kind", "run_id", "block_id", "data")
    rows = pa.table(
        {"seq": [1], "kind": ["run.finished"], "run_id": ["r"], "block_id": [None], "data": ["{}"]},
        schema=pa.schema([("seq", pa.int64()), *((name, pa.string()) for name in text)]),
    )
    right = pa.table(
        {"seq": pa.array([1], pa.int64()), "run_id": ["r"], "block_id": [None], "status": ["completed"]},
        schema=pa.schema(
            [("seq", pa.int64()), ("run_id", pa.string()), ("block_id", pa.string()), ("status", pa.string())]
        ),
    )
    assert _reads_as(sql, right, rows)
    assert not _reads_as(sql, right.set_column(0, "seq", pa.array([1], pa.int32())), rows)
    assert not _reads_as(sql, right.drop_columns(["status"]), rows)
