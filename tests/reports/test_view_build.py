"""The views built as a graph on two cursors (reports/_build.py): what each task waits for, what a
failure does to the tasks after it, and the same tables as the sequential build."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import orjson
import pytest

from ledger import Analytics, Ledger, open_ledger, read_jsonl
from reports import open_source
from reports._build import build, tasks
from reports._views import (
    AUDIT_VIEWS,
    VIEWS,
    create_audit_views,
    create_views,
    projections,
)
from tests._synthetic import generate


def test_a_task_needs_the_earlier_names_its_statement_mentions_as_words() -> None:
    made = tasks(
        [
            ("a", "CREATE TABLE a AS SELECT 1 AS x"),
            ("a_b", "CREATE TABLE a_b AS SELECT 2 AS x"),
            ("b", "CREATE TABLE b AS SELECT * FROM a_b"),  # a_b, not a
            ("c", "CREATE TABLE c AS SELECT * FROM a JOIN b USING (x) JOIN later USING (x)"),
        ]
    )
    needs = [(t.name, sorted(t.needs)) for t in made]
    assert needs == [("a", []), ("a_b", []), ("b", ["a_b"]), ("c", ["a", "b"])]
    with pytest.raises(ValueError, match="a is built twice"):
        tasks([("a", "SELECT 1"), ("a", "SELECT 2")])


def test_no_task_starts_before_what_it_reads_exists() -> None:
    # A wide, deep graph: each level reads every table of the level before. A task started early
    # fails on a missing table (Catalog Error), so every table existing at the end is the proof.
    con = duckdb.connect(":memory:")
    statements = []
    for level in range(6):
        for i in range(4):
            name = f"t{level}_{i}"
            before = [f"SELECT range + {i} AS range FROM t{level - 1}_{j}" for j in range(4)]
            select = (
                "SELECT * FROM range(20000)"
                if level == 0
                else f"SELECT * FROM ({' UNION ALL '.join(before)}) WHERE range % 2 = 0"
            )
            statements.append((name, f"CREATE TABLE {name} AS {select}"))
    building = build(statements, con.cursor)
    building.wait(name for name, _ in statements)
    sequential = duckdb.connect(":memory:")
    for _, statement in statements:
        sequential.execute(statement)
    for name, _ in statements:
        got = con.execute(f"SELECT count(*), sum(range) FROM {name}").fetchone()
        assert got == sequential.execute(f"SELECT count(*), sum(range) FROM {name}").fetchone(), name


def test_a_failed_task_fails_what_needs_it_and_nothing_else() -> None:
    con = duckdb.connect(":memory:")
    statements = [
        ("good", "CREATE TABLE good AS SELECT 1 AS x"),
        ("bad", "CREATE TABLE bad AS SELECT * FROM no_such_table"),
        ("after_bad", "CREATE TABLE after_bad AS SELECT * FROM bad"),
        ("after_good", "CREATE TABLE after_good AS SELECT * FROM good"),
    ]
    building = build(statements, con.cursor)
    with pytest.raises(duckdb.CatalogException, match="no_such_table"):
        building.wait(["good", "bad", "after_good"])
    with pytest.raises(duckdb.CatalogException, match="no_such_table"):
        building.when_done(["after_bad"]).result(timeout=10)
    assert building.wait(["good", "after_good"]) >= 0
    assert con.execute("SELECT * FROM after_good").fetchall() == [(1,)]
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert tables == {"good", "after_good"}


def test_workers_run_side_by_side_and_close_their_cursors() -> None:
    con = duckdb.connect(":memory:")
    made: list[duckdb.DuckDBPyConnection] = []

    def cursor() -> duckdb.DuckDBPyConnection:
        made.append(con.cursor())
        return made[-1]

    summed = "SELECT sum(range) AS s FROM range(3000000)"
    statements = [(f"t{i}", f"CREATE TABLE t{i} AS {summed}") for i in range(4)]
    building = build(statements, cursor, workers=2)
    building.wait(name for name, _ in statements)
    assert len(made) == 2
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in threading.enumerate() if t.name.startswith("kvledger-views-")):
        assert time.monotonic() < deadline, "a view worker outlived its tasks"
        time.sleep(0.01)
    for cursor_made in made:
        with pytest.raises(duckdb.ConnectionException):
            cursor_made.execute("SELECT 1")


@pytest.fixture
def synthetic(sqlite_url: str) -> Ledger:
    events, _ = generate()
    led = open_ledger(sqlite_url)
    led.append_sealed(read_jsonl(iter(orjson.dumps(e) for e in events)))
    return led


def _contents(con: duckdb.DuckDBPyConnection, names: list[str]) -> dict[str, list[str]]:
    return {name: sorted(map(repr, con.execute(f"SELECT * FROM {name}").fetchall())) for name in names}


def test_the_graph_builds_the_tables_the_sequential_build_does(synthetic: Ledger, tmp_path: Path) -> None:
    names = [name for name, _ in VIEWS] + [name for name, _ in AUDIT_VIEWS]
    reference = Analytics(synthetic, tmp_path / "reference", projections())
    con = reference.connection()
    create_views(con)
    create_audit_views(con)
    expected = _contents(con, names)
    reference.close()
    assert sum(len(rows) for rows in expected.values()) > 1000  # a study's worth, not empty tables
    for verify in (False, True):
        src = open_source(synthetic, tmp_path / "graph", verify=verify)
        try:
            src.rederive()
            assert _contents(src.con, names) == expected, f"verify={verify}"
        finally:
            src.close()
