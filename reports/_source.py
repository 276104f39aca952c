"""Where reports read from: one DuckDB connection over the ledger's snapshot, with our views.

Reports never write the database. :class:`ledger.Analytics` keeps a Parquet
snapshot outside the database and serves it through an in-memory DuckDB; our
views are TEMP views on that connection. The head a report names is the
snapshot's last event, so the numbers and the head always agree even while
others append.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from ledger import Analytics, Head, Ledger, open_ledger

from ._views import create_views, projections


@dataclass
class Source:
    """A ledger opened for reading, its DuckDB connection and the head derived from."""

    ledger: Ledger
    analytics: Analytics
    con: duckdb.DuckDBPyConnection
    head: Head | None
    _cache: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows of ``sql`` as dicts (ORDER BY in ``sql`` keeps them deterministic)."""
        cursor = self.con.execute(sql, params or {})
        names = [d[0] for d in cursor.description or []]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def tuples(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` as tuples, for large results read positionally."""
        return self.con.execute(sql, params or {}).fetchall()

    def rows_once(self, sql: str) -> list[dict[str, Any]]:
        """:meth:`rows`, run once per source: for small ledger-wide queries that the report
        and the audit both ask (the snapshot under a source does not change). Each call
        gets its own copies of the rows."""
        if sql not in self._cache:
            self._cache[sql] = self.rows(sql)
        return [dict(row) for row in self._cache[sql]]

    def scalar(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        row = self.con.execute(sql, params or {}).fetchone()
        return row[0] if row else None

    def close(self) -> None:
        self.analytics.close()


def open_source(
    url_or_ledger: str | Ledger, snapshot_root: Path | None = None, until_seq: int | None = None
) -> Source:
    """Open a ledger for reading and prepare the report views.

    ``until_seq`` derives as of that event (attestation checks re-derive at
    the attested head even after the ledger has grown).
    """
    ledger = open_ledger(url_or_ledger, create=False) if isinstance(url_or_ledger, str) else url_or_ledger
    analytics = Analytics(ledger, snapshot_root, projections())
    con = analytics.connection()
    create_views(con, until_seq)
    bound = "" if until_seq is None else f"WHERE seq <= {int(until_seq)}"
    row = con.execute(f"SELECT seq, chain FROM events {bound} ORDER BY seq DESC LIMIT 1").fetchone()
    head = Head(int(row[0]), str(row[1])) if row else None
    return Source(ledger, analytics, con, head)
