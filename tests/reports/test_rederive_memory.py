"""The audit's re-derivations beside the derivation, only where DuckDB's memory holds both.

Built side by side, the report's derivation and the audit's re-derivations each pin DuckDB
memory; on a 10M-event ledger under the 1 GB limit one of them failed with DuckDB's
out-of-memory error (not a spill). The source builds them one after the other once DuckDB is
past half its limit or has moved tables to disk, and a build beside that still runs out is
built again alone. Either way the audit is the same.

The re-derivations of every row (``kv_rederived``, ``kv_hits_rederived``) are views, and the
audit reads ``kv_rederived_disputed`` and ``kv_hits_inconsistent``, tables of the rows it
reports: they must hold exactly the rows of the full views that meet its conditions.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import duckdb
import pytest

from reports import audit, derive_report, open_source, to_json
from reports._source import room_beside

from .._synthetic import Flaws, generate
from .conftest import import_envelopes

FLAWS = Flaws(
    assertion_failed=True,
    assertion_inconsistent=True,
    hits_inconsistent=True,
    counter_mismatch=True,
    declared_exclusion=True,
)


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rederive") / "ledger.db"
    events, _ = generate(flaws=FLAWS)
    import_envelopes(f"sqlite:///{path}", events).close()
    return path


DISPUTED = (
    "NOT coalesce(recorded_passed, false) OR NOT coalesce(derived_passed, true) "
    "OR (derived_passed IS NOT NULL AND expectation_differs)"
)


def _report_and_findings(src: Any) -> tuple[str, list[tuple[str, str, str]]]:
    text = to_json(derive_report(src))
    return text, sorted((f.code, f.severity, str(f.target)) for f in audit(src))


@pytest.mark.parametrize("beside", [True, False])
def test_beside_or_after_the_derivation_the_audit_is_the_same(
    ledger_path: Path, tmp_path: Path, beside: bool
) -> None:
    url = f"sqlite:///{ledger_path}"
    chosen = open_source(url, tmp_path / "a", verify=True)  # the memory decides
    forced = open_source(url, tmp_path / "b", verify=True, rederive_beside=beside)
    try:
        # A ledger this small leaves DuckDB nearly all of its memory: beside, by default.
        assert chosen.rederived_beside is True
        assert forced.rederived_beside is beside
        report, findings = _report_and_findings(forced)
        assert (report, findings) == _report_and_findings(chosen)
        assert {"assertion-failed", "counter-mismatch"} <= {code for code, _, _ in findings}
    finally:
        for src in (chosen, forced):
            src.close()
            src.ledger.close()


def test_a_build_beside_that_ran_out_of_memory_is_built_again_alone(
    ledger_path: Path, tmp_path: Path
) -> None:
    src = open_source(f"sqlite:///{ledger_path}", tmp_path / "s", verify=True, rederive_beside=False)
    # As a build beside the derivation leaves it when DuckDB runs out of memory there.
    failed: Future[float] = Future()
    failed.set_exception(duckdb.OutOfMemoryException("failed to pin block of size 256.0 KiB"))
    ran_out = dataclasses.replace(src, _rederivation=failed, rederived_beside=True)
    try:
        assert ran_out.rederive() >= 0.0
        assert ran_out.rederived_beside is False
        rows = ran_out.scalar("SELECT count(*) FROM kv_rederived")
        assert rows == src.scalar("SELECT count(*) FROM kv_assertions") and rows > 0
        assert {f.code for f in audit(ran_out)} >= {"assertion-failed", "counter-mismatch"}
    finally:
        ran_out.close()
        src.ledger.close()


def test_other_errors_of_a_build_beside_are_raised(ledger_path: Path, tmp_path: Path) -> None:
    src = open_source(f"sqlite:///{ledger_path}", tmp_path / "s", verify=True, rederive_beside=False)
    failed: Future[float] = Future()
    failed.set_exception(duckdb.BinderException("no such column"))
    broken = dataclasses.replace(src, _rederivation=failed, rederived_beside=True)
    try:
        with pytest.raises(duckdb.BinderException, match="no such column"):
            broken.rederive()
        assert broken.rederived_beside is True
    finally:
        broken.close()
        src.ledger.close()


def test_room_beside_is_half_of_duckdbs_memory_with_nothing_on_disk(tmp_path: Path) -> None:
    con = duckdb.connect(config={"memory_limit": "64MB", "temp_directory": str(tmp_path)})
    try:
        assert room_beside(con)
        # About 40 MB of hashes (nothing for DuckDB to compress) held in a table: past half of
        # the 64 MB limit.
        con.execute("CREATE TABLE held AS SELECT hash(range) AS x, hash(range + 1) AS y FROM range(2500000)")
        used = con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()
        assert used is not None and used[0] > 32 * 10**6
        assert not room_beside(con)
        con.execute("DROP TABLE held")
        assert room_beside(con)
    finally:
        con.close()


@pytest.mark.parametrize("first", ["none", "out-of-memory-beside"])
def test_rederivations_that_fail_raise_and_the_source_still_closes(
    ledger_path: Path, tmp_path: Path, first: str
) -> None:
    """A build that fails (here: a table the re-derivations read is gone), alone or again after
    running out of memory beside the derivation, raises its error, and closing the source, which
    waits for what it started, returns: no future is left without a result."""
    import threading

    src = open_source(f"sqlite:///{ledger_path}", tmp_path / "c", verify=True, rederive_beside=False)
    try:
        if first == "out-of-memory-beside":
            failed: Future[float] = Future()
            failed.set_exception(duckdb.OutOfMemoryException("failed to pin block"))
            src._rederivation = failed
        # kv_requests is served as an Arrow table registered on the connection (reports/_views.py).
        src.con.unregister("kv_requests")
        with pytest.raises(duckdb.CatalogException):
            src.rederive()
        with pytest.raises(duckdb.CatalogException):
            src.rederive()  # once per source: the same error, not a second build
    finally:
        closing = threading.Thread(target=src.close, daemon=True)
        closing.start()
        closing.join(60)
        src.ledger.close()
    assert not closing.is_alive(), "Source.close waited for a future that will never finish"


class _PinsPerThread:
    """The source's connection, whose statement building ``failing`` runs out of memory while
    DuckDB has more than one thread: as ``kv_rederived`` (since read through
    ``kv_rederived_disputed``) did alone under the 1 GB limit on a 10M-event ledger (its joins
    pin blocks per thread, and pinned blocks are never moved to disk; docs/performance.md).
    Small ledgers fail that way only in a band of a few MB that moves with DuckDB's state, so
    the failure is injected here; every statement runs on the real connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection, failing: str) -> None:
        self.con = con
        self.failing = failing
        self.created: list[str] = []

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("CREATE"):
            threads = self.con.execute("SELECT current_setting('threads')").fetchone()
            if f" {self.failing} AS" in sql and threads is not None and int(threads[0]) > 1:
                raise duckdb.OutOfMemoryException(
                    "failed to pin block of size 256.0 KiB (953.4 MiB/953.6 MiB used)"
                )
            self.created.append(sql.split(" AS", 1)[0])
        return self.con.execute(sql, *args)


def test_a_build_alone_that_runs_out_of_memory_is_built_again_on_one_thread(
    ledger_path: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{ledger_path}"
    expected = open_source(url, tmp_path / "e", verify=True, rederive_beside=False)
    src = open_source(url, tmp_path / "s", verify=True, rederive_beside=False)
    try:
        want = _report_and_findings(expected)
        src.con.execute("SET threads = 2")
        pinning = _PinsPerThread(src.con, "kv_rederived_disputed")
        assert dataclasses.replace(src, con=pinning).rederive() >= 0.0  # type: ignore[arg-type]
        assert src.scalar("SELECT current_setting('threads')") == 2  # as it was, once built
        # Built again on one thread from where it failed: what came before it is not built twice.
        assert sum(c.endswith(" kv_scrape_windows") for c in pinning.created) == 1
        assert sum(c.endswith(" kv_rederived_disputed") for c in pinning.created) == 1
        assert src.scalar("SELECT count(*) FROM kv_rederived") == expected.scalar(
            "SELECT count(*) FROM kv_assertions"
        )
        assert _report_and_findings(src) == want
    finally:
        for source in (expected, src):
            source.close()
            source.ledger.close()


@pytest.mark.parametrize("beside", [True, False])
def test_the_materialised_rows_are_exactly_those_the_full_rederivations_flag(
    ledger_path: Path, tmp_path: Path, beside: bool
) -> None:
    src = open_source(f"sqlite:///{ledger_path}", tmp_path / "s", verify=True, rederive_beside=beside)
    try:
        src.rederive()
        kinds = dict(
            src.tuples(
                "SELECT table_name, 'table' FROM duckdb_tables() "
                "UNION ALL SELECT view_name, 'view' FROM duckdb_views() WHERE NOT internal"
            )
        )
        assert kinds["kv_rederived"] == kinds["kv_hits_rederived"] == "view"
        assert kinds["kv_rederived_disputed"] == kinds["kv_hits_inconsistent"] == "table"
        # The full re-derivation still covers every assertion.
        assertions = src.scalar("SELECT count(*) FROM kv_assertions")
        assert src.scalar("SELECT count(*) FROM kv_rederived") == assertions

        disputed = src.tuples("SELECT * FROM kv_rederived_disputed ORDER BY seq")
        flagged = src.tuples(f"SELECT * FROM kv_rederived_shown WHERE {DISPUTED} ORDER BY seq")
        assert disputed == flagged
        recorded = [(row[6], row[9]) for row in disputed]  # recorded_passed, derived_passed
        assert (False, False) in recorded  # the planted failure, failed either way
        assert (True, False) in recorded  # recorded passed on wrong values: contradicted

        inconsistent = src.tuples("SELECT * FROM kv_hits_inconsistent ORDER BY seq")
        assert inconsistent == src.tuples("SELECT * FROM kv_hits_rederived WHERE inconsistent ORDER BY seq")
        assert inconsistent, "the hits record cut below its scrapes' deltas"
        # Every hits record is judged one way or the other: none is dropped by a NULL verdict.
        assert src.scalar("SELECT count(*) FROM kv_hits_rederived WHERE NOT inconsistent") == src.scalar(
            "SELECT count(*) FROM kv_hits"
        ) - len(inconsistent)
    finally:
        src.close()
        src.ledger.close()
