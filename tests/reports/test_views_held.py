"""Materialised views served as Arrow tables (reports/_views.py ``create_views(hold=...)``): the
report and every finding are those of the same views as DuckDB tables, the re-derivations built on
a cursor beside the derivation see them, and a query DuckDB would read back with other types stays
a table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import reports._views
from reports import audit, derive_report, open_source, to_json
from reports._views import VIEWS, VIEWS_HELD, VIEWS_NOT_MATERIALISED, _as_arrow

from .._synthetic import Flaws, generate
from .conftest import import_envelopes


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("held") / "ledger.db"
    flaws = Flaws(assertion_inconsistent=True, hits_inconsistent=True, namespace_leak=True)
    events, _ = generate(flaws=flaws)
    import_envelopes(f"sqlite:///{path}", events).close()
    return path


def _report_and_findings(src: Any) -> tuple[str, list[tuple[str, str, str, str]]]:
    text = to_json(derive_report(src))
    return text, sorted((f.code, f.severity, str(f.target), f.detail) for f in audit(src))


@pytest.mark.parametrize("verify", [True, False])
def test_views_held_as_arrow_give_the_report_and_findings_of_tables(
    ledger_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verify: bool
) -> None:
    url = f"sqlite:///{ledger_path}"
    src = open_source(url, tmp_path / "held", verify=verify, rederive_beside=True if verify else None)
    try:
        held = set(src.analytics._views_held)
        materialised = {name for name, _ in VIEWS} - VIEWS_NOT_MATERIALISED
        assert {"kv_requests", "kv_pairs", "kv_hits"} <= held <= VIEWS_HELD <= materialised
        tables = {r[0] for r in src.con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        assert not held & tables and materialised - held <= tables
        # Of the views with a row per request, pair or session, kept a DuckDB table exactly where a
        # column would come back of another type: JSON (Arrow has no JSON type; DuckDB reads it back
        # as VARCHAR). The views with a row per block, run or window are tables.
        for name in VIEWS_HELD:
            types = {row[1] for row in src.con.execute(f"DESCRIBE {name}").fetchall()}
            assert (name in held) == ("JSON" not in types), name
        as_arrow = _report_and_findings(src)
    finally:
        src.close()
    codes = {code for code, *_ in as_arrow[1]}
    assert {"assertion-inconsistent", "hits-inconsistent", "namespace-leak"} <= codes  # the flaws found

    # Past the size views are held at, DuckDB's tables, as before.
    monkeypatch.setattr(reports._views, "HELD_VIEW_REQUESTS_MAX", 0)
    src = open_source(url, tmp_path / "tables", verify=verify, rederive_beside=True if verify else None)
    try:
        assert not src.analytics._views_held
        assert _report_and_findings(src) == as_arrow
    finally:
        src.close()


def test_a_query_read_back_with_other_types_stays_a_table() -> None:
    con = duckdb.connect()
    try:
        # A HUGEINT leaves as Arrow's decimal128(38, 0), which DuckDB reads back as DECIMAL(38,0).
        assert _as_arrow(con, "SELECT CAST(1 AS HUGEINT) AS n") is None
        table = _as_arrow(con, "SELECT 1::BIGINT AS n, 'a' AS s, [1, 2] AS l, {'k': 1.5} AS st")
        assert table is not None and table.to_pylist() == [{"n": 1, "s": "a", "l": [1, 2], "st": {"k": 1.5}}]
        # A JSON column, at the top or nested, is refused as bound: the query never runs.
        assert _as_arrow(con, "SELECT CAST(error('the query ran') AS JSON) AS j") is None
        assert _as_arrow(con, "SELECT {'j': CAST(error('the query ran') AS JSON)} AS st") is None
        with pytest.raises(duckdb.Error, match="the query ran"):
            _as_arrow(con, "SELECT CAST(error('the query ran') AS VARCHAR) AS s")
    finally:
        con.close()


def test_what_duckdb_reads_an_arrow_schema_as_is_told_per_schema() -> None:
    """``arrow_read_as`` is asked once per schema: tables of the same names but other types, nesting
    or nullability each get their own answer, and the answer is DuckDB's."""
    from ledger._snapshot import arrow_read_as

    con = duckdb.connect()
    try:
        tables = [
            pa.table({"a": pa.array([1], pa.int64())}),
            pa.table({"a": pa.array(["x"], pa.string())}),
            pa.table({"a": pa.array([[1]], pa.list_(pa.int32()))}),
            pa.table({"a": pa.array([{"k": 1.5}])}),
            pa.table({"a": pa.array([1], pa.decimal128(38, 0))}),
        ]
        told = [arrow_read_as(con, t) for t in tables]
        assert told == [arrow_read_as(con, t) for t in tables]  # asked again: the same
        for table, read_as in zip(tables, told, strict=True):
            con.register("t", table)
            assert read_as == [
                (str(r[0]), str(r[1])) for r in con.execute("DESCRIBE SELECT * FROM t").fetchall()
            ]
            con.unregister("t")
        assert [kind for ((_, kind),) in told] == [
            "BIGINT",
            "VARCHAR",
            "INTEGER[]",
            "STRUCT(k DOUBLE)",
            "DECIMAL(38,0)",
        ]
    finally:
        con.close()


def test_a_verified_source_makes_no_table_it_would_not_read(ledger_path: Path, tmp_path: Path) -> None:
    """A verified source serves each projection the read parsed as its Arrow table, with no DuckDB
    table of that name made beside it (a projection with no row is an empty table of its SQL's
    types, which the views are then made over), and the per-kind views over the cache's rows,
    which nothing it derives reads, are made only for a plain reader (`ledger sql`'s
    ``request_sent``...)."""
    url = f"sqlite:///{ledger_path}"
    plain = open_source(url, tmp_path / "snap")  # builds the snapshot whose kinds the views name
    try:
        views = {r[0] for r in plain.con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
        assert {"request_sent", "response_received", "hits_observed"} <= views
    finally:
        plain.close()
    src = open_source(url, tmp_path / "snap", verify=True, rederive_beside=False)
    try:
        derived = src.analytics.derived
        assert derived is not None and len(derived.held) >= 4  # the typed projections the read parsed
        tables = {r[0] for r in src.con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        views = {r[0] for r in src.con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
        assert not set(derived.held) & tables
        assert not {"request_sent", "response_received", "hits_observed"} & views
        # The projections of kinds this ledger has no row of (checkpoints, imports...) made the
        # views over them: those views are there, and empty.
        assert src.scalar("SELECT count(*) FROM kv_checkpoints") == 0
        assert src.scalar("SELECT count(*) FROM kv_imports") == 0
    finally:
        src.close()
