"""The audit reads the re-derivations through the rows it reports, materialised apart.

``kv_rederived`` and ``kv_hits_rederived`` re-derive every assertion and hits record; they are
views, and the audit reads ``kv_rederived_disputed`` and ``kv_hits_inconsistent``, tables of the
rows it reports. Those tables must hold exactly the rows of the full re-derivations that meet the
audit's conditions, column for column, on a ledger whose flaws give such rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reports import open_source
from reports._source import Source

from .._synthetic import Flaws, generate
from .conftest import import_envelopes

FLAWS = Flaws(assertion_failed=True, assertion_inconsistent=True, hits_inconsistent=True)
DISPUTED = (
    "NOT coalesce(recorded_passed, false) OR NOT coalesce(derived_passed, true) "
    "OR (derived_passed IS NOT NULL AND expectation_differs)"
)


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("subsets") / "ledger.db"
    events, _ = generate(flaws=FLAWS)
    import_envelopes(f"sqlite:///{path}", events).close()
    return path


def _rows(src: Source, sql: str) -> list[tuple[object, ...]]:
    return src.tuples(sql)


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

        disputed = _rows(src, "SELECT * FROM kv_rederived_disputed ORDER BY seq")
        flagged = _rows(src, f"SELECT * FROM kv_rederived_shown WHERE {DISPUTED} ORDER BY seq")
        assert disputed == flagged
        recorded = [(row[6], row[9]) for row in disputed]  # recorded_passed, derived_passed
        assert (False, False) in recorded  # the planted failure, failed either way
        assert (True, False) in recorded  # recorded passed on wrong values: contradicted

        inconsistent = _rows(src, "SELECT * FROM kv_hits_inconsistent ORDER BY seq")
        assert inconsistent == _rows(src, "SELECT * FROM kv_hits_rederived WHERE inconsistent ORDER BY seq")
        assert inconsistent, "the hits record cut below its scrapes' deltas"
        # Nothing left out: no row outside the table meets its condition.
        assert src.scalar(f"SELECT count(*) FROM kv_rederived_shown WHERE {DISPUTED}") == len(disputed)
        assert src.scalar("SELECT count(*) FROM kv_hits_rederived WHERE NOT inconsistent") == src.scalar(
            "SELECT count(*) FROM kv_hits"
        ) - len(inconsistent)
    finally:
        src.close()
        src.ledger.close()
