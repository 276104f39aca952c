"""DuckDB over read-only views of the ledger.

``events`` has the envelope's columns with ``data`` as JSON text; each kind
gets a view named after it (``request.sent`` → ``request_sent``) with its
data fields as typed columns. Only reading statements are accepted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ._errors import QueryError
from ._snapshot import Proof, Snapshot, sql_literal
from ._store import Ledger

_ENVELOPE_COLUMNS = ("seq", "id", "ts", "kind", "run_id", "block_id")
_READING = {
    duckdb.StatementType.SELECT,
    duckdb.StatementType.EXPLAIN,
}
_EXPLAINED = re.compile(r"\s*EXPLAIN\s+(?:ANALYZE\s+|\([^)]*\)\s*)?(.*)", re.IGNORECASE | re.DOTALL)
# DuckDB's json_type names → SQL types for view columns.
_JSON_TYPES = {
    "BIGINT": "BIGINT",
    "UBIGINT": "BIGINT",
    "DOUBLE": "DOUBLE",
    "BOOLEAN": "BOOLEAN",
    "VARCHAR": "VARCHAR",
    "OBJECT": "JSON",
    "ARRAY": "JSON",
}


def view_name(kind: str) -> str:
    """The view of one kind: dots and dashes become underscores."""
    return re.sub(r"[^0-9a-zA-Z_]", "_", kind)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _column_type(types: set[str]) -> str:
    mapped = {_JSON_TYPES.get(t, "JSON") for t in types if t != "NULL"}
    if not mapped:
        return "VARCHAR"
    if mapped == {"BIGINT", "DOUBLE"}:
        return "DOUBLE"
    return mapped.pop() if len(mapped) == 1 else "JSON"


def _field_expr(field: str, sql_type: str) -> str:
    path = "$." + _quote(field)
    if sql_type == "JSON":
        return f"json_extract(data, '{path}')"
    return f"TRY_CAST(json_extract_string(data, '{path}') AS {sql_type})"


def _kind_view_sql(kind: str, fields: dict[str, str]) -> str:
    columns = ["seq", "id AS event_id", "ts", "run_id", "block_id"]
    for field, sql_type in fields.items():
        alias = f"data_{field}" if field in (*_ENVELOPE_COLUMNS, "event_id") else field
        columns.append(f"{_field_expr(field, sql_type)} AS {_quote(alias)}")
    kind_literal = kind.replace("'", "''")
    return (
        f"CREATE VIEW {_quote(view_name(kind))} AS SELECT {', '.join(columns)} "
        f"FROM events WHERE kind = '{kind_literal}'"
    )


def connect(segments: list[Path], fields: dict[str, dict[str, list[str]]]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the ``events`` view and one view per kind.

    ``fields`` (kind → field → JSON types) comes from the snapshot, which
    records them as it writes each segment, so no scan of the data finds them.
    """
    con = duckdb.connect(":memory:")
    if segments:
        con.execute(f"CREATE VIEW events AS {_read_parquet(segments)}")
    else:
        con.execute(
            "CREATE VIEW events AS SELECT CAST(NULL AS BIGINT) AS seq, "
            "CAST(NULL AS VARCHAR) AS id, CAST(NULL AS VARCHAR) AS ts, "
            "CAST(NULL AS VARCHAR) AS kind, CAST(NULL AS VARCHAR) AS run_id, "
            "CAST(NULL AS VARCHAR) AS block_id, CAST(NULL AS VARCHAR) AS data, "
            "CAST(NULL AS VARCHAR) AS digest, CAST(NULL AS VARCHAR) AS chain WHERE false"
        )
    for kind, kind_types in sorted(fields.items()):
        columns = {f: _column_type(set(t)) for f, t in sorted(kind_types.items())}
        con.execute(_kind_view_sql(kind, columns))
    return con


def _read_parquet(files: list[Path]) -> str:
    listed = ", ".join(sql_literal(p) for p in files)
    return f"SELECT * FROM read_parquet([{listed}])"


def check_read_only(statement: str) -> None:
    """Raise :class:`QueryError` unless every statement only reads."""
    try:
        parsed = duckdb.extract_statements(statement)
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse SQL: {exc}") from exc
    if not parsed:
        raise QueryError("no SQL statement given")
    for item in parsed:
        if item.type not in _READING:
            raise QueryError(f"refused: {item.type.name} statements would write; `ledger sql` only reads")
        if item.type == duckdb.StatementType.EXPLAIN:
            # EXPLAIN ANALYZE runs what it explains (a COPY ... TO writes a file): check that too.
            inner = _EXPLAINED.match(item.query)
            if inner is None or not inner.group(1).strip():
                raise QueryError("refused: cannot tell what this EXPLAIN would run")
            check_read_only(inner.group(1))


class Analytics:
    """DuckDB queries over a ledger's Parquet snapshot (proven on open: ledger/_snapshot.py).

    ``projections`` (view name → SQL over ``events``, row by row) are kept per
    snapshot segment and served as views of those names: readers that parse
    the same JSON every time (reports) parse it once per event instead.
    """

    def __init__(
        self,
        ledger: Ledger,
        snapshot_root: Path | None = None,
        projections: Mapping[str, str] | None = None,
        up_to_seq: int | None = None,
    ) -> None:
        self.ledger = ledger
        self.snapshot = Snapshot.for_ledger(ledger, snapshot_root)
        self.projections = dict(projections or {})
        self.up_to_seq = up_to_seq
        self._con: duckdb.DuckDBPyConnection | None = None

    @property
    def proof(self) -> Proof:
        """What the snapshot's proof checked when the connection opened, its cost and mismatches."""
        return self.snapshot.proof

    def connection(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection whose views reflect the ledger's current head (or ``up_to_seq``),
        served only from snapshot files proven against the ledger (rebuilt where they fail)."""
        if self._con is None:
            segments = self.snapshot.refresh(self.ledger, self.projections, self.up_to_seq)
            self._con = connect(segments, self.snapshot.fields())
            for name, sql in self.projections.items():
                self._con.execute(
                    f"CREATE VIEW {_quote(name)} AS "
                    + (_read_parquet(self.snapshot.projection_files(sql)) if segments else sql)
                )
        return self._con

    def sql(self, statement: str) -> pa.Table:
        """Run a reading statement; returns an Arrow table."""
        check_read_only(statement)
        try:
            relation = self.connection().sql(statement)
            return relation.to_arrow_table() if relation is not None else pa.table({})
        except duckdb.Error as exc:
            raise QueryError(str(exc).splitlines()[0]) from exc

    def views(self) -> dict[str, list[tuple[str, str]]]:
        """View name → its (column, type) pairs, for documentation and `--views`."""
        con = self.connection()
        rows = con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "ORDER BY table_name, ordinal_position"
        ).fetchall()
        out: dict[str, list[tuple[str, str]]] = {}
        for table, column, dtype in rows:
            out.setdefault(table, []).append((column, dtype))
        return out

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None


def to_format(table: pa.Table, fmt: str) -> Any:
    """Convert an Arrow table to ``arrow``, ``pandas`` or ``polars``."""
    if fmt == "arrow":
        return table
    if fmt == "pandas":
        return table.to_pandas()
    if fmt == "polars":
        import polars

        return polars.from_arrow(table)
    raise ValueError(f"unknown format {fmt!r}: use arrow, pandas or polars")
