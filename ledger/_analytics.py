"""DuckDB over read-only views of the ledger.

``events`` has the envelope's columns with ``data`` as JSON text; each kind
gets a view named after it (``request.sent`` → ``request_sent``) with its
data fields as typed columns. Only reading statements are accepted.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, Protocol

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ._errors import QueryError
from ._events import GENESIS
from ._row_sources import RowSource
from ._row_sources import row_source as row_source_for
from ._rows import SCHEMA, native_table, read_rows, rows_to_table
from ._snapshot import Proof, Snapshot, _reads_as, _seqs_follow, key_path, sql_literal
from ._snapshot_rows import _carrow, by_kind, columns_read, single_kind
from ._store import Ledger
from ._typed import ENTRIES_SCHEMA, NativeSpecs, entries_table, native_specs, typed_table
from ._verify import _NO_LOWER_BOUND, RangeResult

# DuckDB's memory for a report (see duckdb_config): with the chunk of rows in flight and
# Python's report, a 10M-event ledger's audit stays under 2 GB.
DUCKDB_MEMORY_LIMIT = "1GB"
# Rows read from the database at a time when projections are derived from them.
_CHUNK = 250_000
# Up to this many rows, a projection parsed natively in the checked read is served as the Arrow
# table the read made, not copied into DuckDB (the copy was about a third of the derivation's CPU
# at 1M events); past it, DuckDB's own tables, which it can move to disk past its memory limit.
_HELD_ROWS_MAX = 2_000_000
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


def duckdb_config(spill: Path) -> dict[str, str | bool | int | float | list[str]]:
    """Settings of a report's in-memory DuckDB. Its tables (the extractions and materialised
    views) grow with the ledger, about 5 GB at 10M events: past ``memory_limit`` DuckDB moves
    them to ``spill`` (a temporary folder, never the caller's working directory).
    ``KVLEDGER_DUCKDB_MEMORY`` and ``KVLEDGER_DUCKDB_THREADS`` override the limit and the
    threads (default: one per core)."""
    limit = os.environ.get("KVLEDGER_DUCKDB_MEMORY") or DUCKDB_MEMORY_LIMIT
    config: dict[str, str | bool | int | float | list[str]] = {
        "memory_limit": limit,
        "temp_directory": str(spill),
        "checkpoint_threshold": limit,
    }
    if os.environ.get("KVLEDGER_DUCKDB_THREADS"):
        config["threads"] = os.environ["KVLEDGER_DUCKDB_THREADS"]
    return config


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
    path = key_path(field)
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


def connect(
    segments: list[Path],
    fields: dict[str, dict[str, list[str]]],
    con: duckdb.DuckDBPyConnection | None = None,
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB (``con``, or a new one) with the ``events`` view and one view per kind.

    ``fields`` (kind → field → JSON types) comes from the snapshot, which
    records them as it writes each segment, so no scan of the data finds them.
    """
    con = con or duckdb.connect(":memory:")
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


@dataclass(frozen=True)
class RunScope:
    """Which rows a reader about some runs derives its tables from: rows of ``kinds`` only where
    their run is one of ``runs`` (or they have none); rows of other kinds all. Every row is still
    read and checked; only the copies and parses of the rows left out are spared, so a run's
    report on a ledger of many runs costs its verification and the run's own rows."""

    kinds: frozenset[str]
    runs: frozenset[str]

    def keeps(self, table: pa.Table, kind: str | None = None) -> pa.Table:
        """The rows of ``table`` that it keeps: ``table`` holds rows of ``kind``, or, where that is
        None, of the kinds its ``kind`` column names; it has their ``run_id`` column."""
        if kind is not None and kind not in self.kinds:
            return table
        run_id = table.column("run_id")
        runs = pa.array(sorted(self.runs), pa.string())
        kept = pc.or_kleene(pc.is_null(run_id), pc.is_in(run_id, value_set=runs))
        if kind is None:
            kinds = pa.array(sorted(self.kinds), pa.string())
            kept = pc.or_kleene(kept, pc.invert(pc.is_in(table.column("kind"), value_set=kinds)))
        return table.filter(kept)


@dataclass
class Derived:
    """Projections derived from the database's rows: how many rows, up to which, at what cost."""

    rows: int = 0
    head_seq: int = 0
    head_chain: str | None = None
    seconds: float = 0.0
    read_seconds: float = 0.0
    gaps: int = 0  # chunks whose rows were not exactly their seq range (rows deleted or moved)
    # Projections served as Arrow tables registered on the connection (derive_checked), by name.
    held: dict[str, pa.Table] = dataclass_field(default_factory=dict)
    projections_held: int = 0  # how many were held when derived (some are released after the views)
    # Rows whose digest and link the checked read checked (derive_checked): each row up to head_seq
    # once. A part with a row the native parse was not sure of is read (and checked) again for
    # DuckDB to parse: those rows are counted apart.
    rows_checked: int = 0
    rows_read_again: int = 0


class PieceSink(Protocol):
    """Where :func:`derive_checked` hands each chunk's projection rows instead of making tables of
    them (ledger/_partition.py splits them by group of runs)."""

    def take(self, name: str, piece: pa.Table, rows: pa.Table) -> None:
        """``piece``: the next rows of projection ``name`` in seq order (one Arrow schema per
        projection), made from ``rows``, the rows of its kind they came from (``seq`` and ``run_id``
        among their columns)."""


def derive_from_rows(
    con: duckdb.DuckDBPyConnection,
    ledger: Ledger,
    projections: Mapping[str, str],
    until_seq: int,
    scope: RunScope | None = None,
) -> Derived:
    """Create each projection (name → SQL over ``events``) as a table of ``con``, derived from
    the database's rows 1..``until_seq`` (those ``scope`` keeps), read natively in chunks
    (ledger/_rows.py) while the previous chunk is parsed, so memory holds one chunk of raw rows
    at a time."""
    derived = Derived()
    started = time.perf_counter()
    bounds = [(a, min(a + _CHUNK, until_seq)) for a in range(0, until_seq, _CHUNK)]
    kinds = {name: single_kind(sql) for name, sql in projections.items()}
    read_by_kind = columns_read([sql for name, sql in projections.items() if kinds[name] is not None])
    if scope is not None and "run_id" not in read_by_kind:
        read_by_kind = [*read_by_kind, "run_id"]  # what the scope keeps is told by it
    with ThreadPoolExecutor(1, thread_name_prefix="kvledger-read-rows") as reader:
        pending = reader.submit(_timed_read, ledger, *bounds[0]) if bounds else None
        for index, (after, stop) in enumerate(bounds or [(0, 0)]):
            if pending is None:
                table, took = rows_to_table([]), 0.0
            else:
                table, took = pending.result()
            derived.read_seconds += took
            pending = (
                reader.submit(_timed_read, ledger, *bounds[index + 1]) if index + 1 < len(bounds) else None
            )
            # Rows missing or out of place are the database as it is: its verification names them
            # (chain-broken), and the tables show what it holds, as a report of it does.
            derived.gaps += table.num_rows != stop - after or not _seqs_follow(table, after + 1)
            derived.rows += table.num_rows
            if table.num_rows:
                derived.head_seq = int(table.column("seq")[-1].as_py())
                derived.head_chain = str(table.column("chain")[-1].as_py())
            parts = by_kind(table, read_by_kind)
            if scope is not None:
                parts = {kind: scope.keeps(rows, kind) for kind, rows in parts.items()}
            empty = empty_table(table.schema)
            if all(kinds.values()):
                table = empty  # the chunk's raw rows go now: only its kinds' copies are read
            elif scope is not None:
                table = scope.keeps(table)  # a projection of several kinds reads the whole chunk
            for name, sql in projections.items():
                # Each projection reads its own kind's rows only (its WHERE still applies): a scan
                # of every row's kind per projection cost more than most projections' parse.
                kind = kinds[name]
                if index and kind is not None and kind not in parts:
                    continue  # nothing of its kind in this chunk
                con.register("events", table if kind is None else parts.get(kind, empty))
                verb = f"CREATE TABLE {_quote(name)} AS" if index == 0 else f"INSERT INTO {_quote(name)}"
                con.execute(f"{verb} {sql}")
                con.unregister("events")
            del parts, table, empty
    derived.seconds = time.perf_counter() - started
    return derived


def empty_table(schema: pa.Schema) -> pa.Table:
    """No rows of ``schema``. (``Schema.empty_table`` converts Python values, and the first such
    conversion in a process makes pyarrow import pandas: 0.15 to 0.2 s of CPU before the read.)"""
    return pa.Table.from_arrays([pa.nulls(0, field.type) for field in schema], schema=schema)


def checked_source(
    ledger: Ledger, projections: Mapping[str, str], rows: RowSource | None = None
) -> RowSource | None:
    """Where :func:`derive_checked` reads, checks and splits by kind the rows in one native pass
    (an SQLite file, or PostgreSQL in bulk: ledger/_row_sources.py; ``rows``, where given, instead
    of the ledger's own), or None (the reader or verifier is not native, an older build lacks the
    call, or a projection reads more than one kind's rows)."""
    if _carrow is None or not hasattr(_carrow, "read_checked_by_kind"):
        return None
    source = rows if rows is not None else row_source_for(ledger)
    return source if source is not None and all(single_kind(sql) for sql in projections.values()) else None


def derive_checked(
    con: duckdb.DuckDBPyConnection,
    source: RowSource,
    projections: Mapping[str, str],
    until_seq: int,
    scope: RunScope | None = None,
    sink: PieceSink | None = None,
) -> tuple[Derived, RangeResult] | None:
    """:func:`derive_from_rows` over rows that are verified as they are read: each chunk's rows are
    checked link by link from GENESIS (digest recomputed from the envelope, chain followed, seq in
    order, nothing below seq 1) by ``ledger/_carrow.c`` as it steps them, and handed over split
    by kind, so the tables come from exactly the rows the check passed, and that check is the
    chain verification of seq 1..``until_seq`` (no second read of the file beside it). A
    projection of typed fields (``json_transform``) is parsed in the same pass (ledger/_typed.py);
    a part with a row that parse is not sure of is read again for DuckDB to parse.

    ``sink``: each projection's rows are handed to it chunk by chunk (:class:`PieceSink`: the natively
    parsed tables as they are, DuckDB's parse of the others as Arrow, of the native types where the
    projection has them) instead of filling its table, which stays empty (it tells DuckDB's types).

    Returns the tables' figures and the check's outcome, or None, with no table left, where a
    chunk's check fails or ``until_seq`` is 0: the caller then derives from the rows as the
    database holds them and verifies apart, which names the first bad seq as it always did (what
    a sink was handed before is then the caller's to discard)."""
    assert _carrow is not None
    if until_seq <= 0 or (scope is not None and not hasattr(_carrow, "SCOPES")):
        return None  # (a build older than scopes: the rows are derived apart, and kept in Python)
    carrow = _carrow
    derived = Derived()
    started = time.perf_counter()
    bounds = [(a, min(a + _CHUNK, until_seq)) for a in range(0, until_seq, _CHUNK)]
    kinds: dict[str, list[str]] = {}
    for name, sql in projections.items():
        kinds.setdefault(str(single_kind(sql)), []).append(name)
    # Only the columns the projections name are copied out of the rows (all are checked).
    text = SCHEMA.names[1:]

    def mask_of(sqls: list[str]) -> int:
        named = set(columns_read(sqls))
        return sum(1 << index for index, name in enumerate(text) if name in named)

    def schema_of(mask: int) -> pa.Schema:
        return pa.schema(
            [SCHEMA.field("seq"), *(SCHEMA.field(name) for i, name in enumerate(text) if mask >> i & 1)]
        )

    mask = mask_of(list(projections.values()))
    if scope is not None or sink is not None:
        mask |= 1 << text.index("run_id")  # what the scope keeps, or the sink's groups, are told by it
    empty = empty_table(schema_of(mask))
    # A kind's first projection of typed fields is parsed natively as its rows are read
    # (ledger/_typed.py): its rows' data is then copied only where another projection reads it;
    # beside it, a projection of an object field's entries is filled in the same pass, its JSON not
    # copied for DuckDB to parse. (A build older than the typed fields: DuckDB parses every one.)
    specs = (
        native_specs(kinds, projections, with_entries=hasattr(carrow, "ENTRIES"))
        if hasattr(carrow, "FIELD_TYPES")
        else NativeSpecs({}, {})
    )
    typed, unnested = specs.typed, specs.unnested
    kind_masks: dict[str, int] = {}
    natively = specs.names()
    for kind in typed:
        others = [projections[n] for n in kinds[kind] if n not in natively]
        # run_id and block_id for the typed table; what the kind's other projections read, if any.
        kind_masks[kind] = mask_of(["SELECT run_id, block_id", *others]) & ~(
            0 if others else 1 << text.index("kind")
        )
    native_typed = specs.argument(kind_masks)
    schemas: dict[int, pa.Schema] = {}

    # Each chunk is read in two parts side by side; a part after the first starts on the chain the
    # database stores before it, which must be the chain the part before ended on, checked.
    parts = [[(a, a + (b - a) // 2), (a + (b - a) // 2, b)] if b - a > 1 else [(a, b)] for a, b in bounds]
    stored = source.stored_chains([a for chunk in parts for a, _ in chunk if a > 0])

    def start_of(after: int) -> str:
        return GENESIS if after == 0 else stored.get(after, "")

    # The scope's rows are kept by the native read itself: the others are checked, never copied.
    kept = None if scope is None else (tuple(sorted(scope.kinds)), tuple(sorted(scope.runs)))

    def read(after: int, stop: int) -> tuple[Any, float]:
        began = time.perf_counter()
        # The first part has no lower bound: a row slipped in below seq 1 fails its check.
        lower = _NO_LOWER_BOUND if after == 0 else after
        if not native_typed:
            # Also what a build older than the typed fields takes and gives.
            got = source.by_kind(lower, stop, after + 1, start_of(after), mask, None, kept)
            rows, groups, check = got[:3]
            return (
                (rows, [(*group[:4], None, None) for group in groups], check, 0),
                time.perf_counter() - began,
            )
        # (The rows read and checked, each kind's rows, the check, and the rows read again.)
        result = source.by_kind(lower, stop, after + 1, start_of(after), mask, native_typed, kept)
        if not result[3]:
            return (*result[:3], 0), time.perf_counter() - began
        # A row the native parse was not sure of: the part again, its data for DuckDB to parse.
        again = source.by_kind(lower, stop, after + 1, start_of(after), mask, None, kept)
        return (result[0], *again[1:3], again[0]), time.perf_counter() - began

    # Typed projections whose Arrow tables are held (not copied into DuckDB), their pieces in seq
    # order; one whose types differ from DuckDB's table, or with a part DuckDB parses, is copied.
    holding: dict[str, list[pa.Table]] = (
        {name: [] for name, _ in [*typed.values(), *unnested.values()]}
        if until_seq <= _HELD_ROWS_MAX and sink is None
        else {}
    )
    # The natively parsed projections' Arrow schemas: DuckDB's parse of a part of theirs is handed to
    # the sink in them, so each projection's pieces share one schema.
    native_schemas = {name: spec.schema for name, spec in typed.values()}
    native_schemas.update({name: ENTRIES_SCHEMA for name, _ in unnested.values()})

    def parsed_by_duckdb(name: str, rows: pa.Table) -> pa.Table:
        con.register("events", rows)
        try:
            piece = con.sql(projections[name]).to_arrow_table()
        finally:
            con.unregister("events")
        schema = native_schemas.get(name)
        return piece if schema is None or piece.schema.equals(schema) else piece.cast(schema)

    # The schema of each held projection's first piece: DuckDB's types, checked once; a piece
    # of another schema is copied, and with it what was held.
    held_schemas: dict[str, pa.Schema] = {}
    # A projection's DuckDB table (its SQL over no rows: DuckDB's types) is made only where it is
    # filled, stays empty or tells a sink's types: one served as the Arrow tables held would be
    # dropped unread (about 4 ms a statement, 26 projections, for every source and every group).
    created: set[str] = set()

    def create(name: str) -> None:
        if name not in created:
            created.add(name)
            con.register("events", empty)
            try:
                con.execute(f"CREATE TABLE {_quote(name)} AS {projections[name]}")
            finally:
                con.unregister("events")

    failed, chain = False, GENESIS
    # The two readers keep the cores busy: each projection runs on this thread alone (DuckDB's
    # own workers beside them cost more in switching than they gave).
    threads = con.execute("SELECT current_setting('threads')").fetchone()
    con.execute("SET threads = 1")
    with (
        contextlib.ExitStack() as restore,
        ThreadPoolExecutor(2, thread_name_prefix="kvledger-read-rows") as reader,
    ):
        if threads is not None:
            restore.callback(con.execute, f"SET threads = {int(threads[0])}")
        pending = [reader.submit(read, *part) for part in parts[0]]
        for index, (_, stop) in enumerate(bounds):
            # Each kind's pieces in seq order: its rows' columns, its typed fields' table or None, and
            # its entries' table or None.
            pieces: dict[str, list[tuple[pa.Table, pa.Table | None, pa.Table | None]]] = {}
            slowest = 0.0
            for (after, until), future in zip(parts[index], pending, strict=True):
                (stepped, groups, check, again), took = future.result()
                derived.rows_checked += stepped
                derived.rows_read_again += again
                slowest = max(slowest, took)
                outcome, _, _, last_good, last_chain = check
                if start_of(after) != chain or outcome != carrow.OK or last_good != until:
                    failed = True
                    break
                chain = last_chain
                for kind, count, seqs, columns, fields, *rest in groups:
                    group_mask = mask if fields is None else native_typed[kind][0]
                    schema = schemas.get(group_mask) or schemas.setdefault(group_mask, schema_of(group_mask))
                    rows = native_table(count, seqs, columns, schema)
                    parsed = None if fields is None else typed_table(typed[kind][1], rows, fields)
                    unnest = rest[0] if rest and fields is not None else None
                    pieces.setdefault(kind, []).append(
                        (rows, parsed, None if unnest is None else entries_table(unnest))
                    )
                del groups
            if failed:
                break
            derived.read_seconds += slowest  # the parts are read side by side
            if index + 1 < len(bounds):
                pending = [reader.submit(read, *part) for part in parts[index + 1]]
            derived.head_seq, derived.head_chain = stop, chain
            derived.rows += sum(piece[0].num_rows for p in pieces.values() for piece in p)
            for kind, names in kinds.items():
                if index and kind not in pieces:
                    continue  # nothing of its kind in this chunk
                if index == 0 and sink is not None:
                    for name in names:
                        create(name)
                kind_pieces = pieces.get(kind, [])
                parsed_name = typed[kind][0] if kind in typed else None
                entries_name = unnested[kind][0] if kind in unnested else None
                if kind_pieces and all(parsed is not None for _, parsed, _ in kind_pieces):
                    # One table of the chunk's typed rows, one of its entries, and one of its columns
                    # for the others.
                    whole = [
                        None if p[0] is None else pa.concat_tables(p) if len(p) > 1 else p[0]
                        for p in zip(*kind_pieces, strict=True)
                    ]
                    kind_pieces = [(whole[0], whole[1], whole[2])]
                for rows, parsed, unnest in kind_pieces:
                    for name in names:
                        native = parsed if name == parsed_name else unnest if name == entries_name else None
                        if sink is not None:
                            sink.take(name, parsed_by_duckdb(name, rows) if native is None else native, rows)
                            continue
                        if native is not None:
                            first = held_schemas.get(name)
                            # Read by DuckDB with the types its table (the projection's SQL) has:
                            # asked once per SQL and schema in a process.
                            sql = projections[name]
                            if name in holding and (
                                native.schema.equals(first) if first else _reads_as(sql, native, empty)
                            ):
                                held_schemas[name] = native.schema
                                holding[name].append(native)
                                continue
                            create(name)
                            _copy_pieces(con, name, [*holding.pop(name, ()), native])
                            continue
                        create(name)
                        if name in (parsed_name, entries_name):
                            # A part left to DuckDB: what was held goes first, in seq order.
                            _copy_pieces(con, name, holding.pop(name, ()))
                        con.register("events", rows)
                        con.execute(f"INSERT INTO {_quote(name)} {projections[name]}")
                        con.unregister("events")
            del pieces
    if failed:
        for name in projections:
            con.execute(f"DROP TABLE IF EXISTS {_quote(name)}")
        return None
    for name, pieces_held in holding.items():
        if pieces_held:
            # The projection's SQL gives the types; the Arrow table has them too (checked).
            whole = pa.concat_tables(pieces_held) if len(pieces_held) > 1 else pieces_held[0]
            _hold(con, derived, name, whole)
    del holding
    for name in projections:
        if name not in derived.held:
            create(name)  # no row of its kind: the empty table tells the types
    derived.seconds = time.perf_counter() - started
    return derived, RangeResult(derived.head_seq, str(derived.head_chain))


def _hold(con: duckdb.DuckDBPyConnection, derived: Derived, name: str, table: pa.Table) -> None:
    """Serve ``table`` (of DuckDB's types for projection ``name``) as that projection (no table of
    that name is made for it), and count it held in ``derived``."""
    con.register(name, table)
    derived.held[name] = table
    derived.projections_held += 1


def _copy_pieces(con: duckdb.DuckDBPyConnection, name: str, pieces: Sequence[pa.Table]) -> None:
    """Copy ``pieces`` (natively parsed Arrow tables of ``name``'s columns) into its table, in
    order: what was held, then the piece at hand."""
    for piece in pieces:
        con.register("events", piece)
        con.execute(f"INSERT INTO {_quote(name)} SELECT * FROM events")
        con.unregister("events")


def _timed_read(ledger: Ledger, after: int, stop: int) -> tuple[pa.Table, float]:
    started = time.perf_counter()
    return read_rows(ledger, after, stop, threads=1), time.perf_counter() - started


class Analytics:
    """DuckDB queries over a ledger's Parquet snapshot (proven on open: ledger/_snapshot.py).

    ``projections`` (view name → SQL over ``events``, row by row) are kept per
    snapshot segment and served as views of those names: readers that parse
    the same JSON every time (reports) parse it once per event instead.
    ``from_rows`` serves them instead as tables derived, when the connection opens,
    from the database's own rows up to the snapshot's head (see :func:`derive_from_rows`):
    what a verified reader (``ledger audit``, ``ledger attest``) publishes then never
    depends on the cache's content, which anyone who can write its folder can forge
    together with the digests kept beside it.
    """

    def __init__(
        self,
        ledger: Ledger,
        snapshot_root: Path | None = None,
        projections: Mapping[str, str] | None = None,
        up_to_seq: int | None = None,
        from_rows: bool = False,
        scope: RunScope | None = None,
        sink: PieceSink | None = None,
        rows: RowSource | None = None,
    ) -> None:
        self.ledger = ledger
        self.scope = scope
        # Where a checked read takes the rows (None: the ledger's own; a test double counts them).
        self.rows = rows
        # Where the checked read hands the projections' rows instead of making tables of them
        # (derive_checked); with one, no table is derived where that read is not available or fails.
        self.sink = sink
        self.snapshot = Snapshot.for_ledger(ledger, snapshot_root)
        self.projections = dict(projections or {})
        self.up_to_seq = up_to_seq
        self.from_rows = from_rows
        self.derived: Derived | None = None
        # The chain check of seq 1..derived.head_seq made as the rows were read (derive_checked),
        # or None where the tables were derived from rows read apart from any check.
        self.checked: RangeResult | None = None
        self._con: duckdb.DuckDBPyConnection | None = None
        # Views whose rows are served as Arrow tables registered on the connection (hold_view).
        self._views_held: dict[str, pa.Table] = {}
        self._spill: Path | None = None

    @property
    def proof(self) -> Proof:
        """What the snapshot's proof checked when the connection opened, its cost and mismatches."""
        return self.snapshot.proof

    def connection(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection whose views reflect the ledger's current head (or ``up_to_seq``),
        served only from snapshot files proven against the ledger (rebuilt where they fail)."""
        if self._con is None:
            segments, until = self._prove()
            self._spill = Path(tempfile.mkdtemp(prefix="kvledger-duckdb-"))
            # Removed on close, or when this object goes (a source left open, the interpreter ending).
            weakref.finalize(self, shutil.rmtree, self._spill, True)
            con = duckdb.connect(":memory:", config=duckdb_config(self._spill))
            if self.from_rows:
                # The projections are derived again from the database's rows, not read from the
                # cache: the cache is proven as always (its mismatches are still reported), but
                # nothing it holds reaches a number.
                self._derive(con, until)
            # A verified reader's tables are its projections, derived from the database's rows: the
            # per-kind views over the cache's rows are not made for it (nothing it derives reads
            # them; binding one cost about 3 ms a kind, for every source and every group).
            self._con = connect(segments, {} if self.from_rows else self.snapshot.fields(), con)
            for name, sql in self.projections.items() if not self.from_rows else ():
                served = _read_parquet(self.snapshot.projection_files(sql)) if segments else sql
                self._con.execute(f"CREATE VIEW {_quote(name)} AS {self._scoped(served, sql)}")
        return self._con

    def _prove(self) -> tuple[list[Path], int]:
        """Prove the snapshot against the ledger (rebuilding what fails): its segment files, and the
        seq a reader from the database's rows derives up to."""
        # A reader whose tables come from the database's rows never reads the cache's rows: where
        # no cache was ever built it builds none (on a 10M-event ledger that build was 57 s of a
        # run's first 70 s audit); a cache that is there is proven, and rebuilt, as always.
        unbuilt = self.from_rows and self.snapshot.unbuilt()
        segments = [] if unbuilt else self.snapshot.refresh(self.ledger, self.projections, self.up_to_seq)
        until = self.snapshot.proof.head_seq
        if unbuilt:
            head = self.ledger.head()
            until = 0 if head is None else head.seq
            until = until if self.up_to_seq is None else min(until, self.up_to_seq)
        return segments, until

    def _derive(self, con: duckdb.DuckDBPyConnection, until: int) -> None:
        """Derive the projections on ``con`` from the database's rows 1..``until``."""
        source = checked_source(self.ledger, self.projections, self.rows)
        scope = self.scope
        done = (
            None if source is None else derive_checked(con, source, self.projections, until, scope, self.sink)
        )
        if done is not None:
            self.derived, self.checked = done
        elif self.sink is None:
            self.derived = derive_from_rows(con, self.ledger, self.projections, until, self.scope)

    def _scoped(self, served: str, sql: str) -> str:
        """``served`` (a projection's rows) with only the rows the scope keeps, where the projection
        is of a scoped kind and has the run's column (the others are joined to those by seq)."""
        kind = single_kind(sql)
        if self.scope is None or kind is None or kind not in self.scope.kinds:
            return served
        assert self._con is not None
        columns = {row[0] for row in self._con.execute(f"DESCRIBE {served}").fetchall()}
        if "run_id" not in columns:
            return served
        runs = ", ".join("'" + run.replace("'", "''") + "'" for run in sorted(self.scope.runs))
        return f"SELECT * FROM ({served}) WHERE run_id IS NULL OR run_id IN ({runs})"

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """Another connection to the same in-memory database (for work on another thread), with
        the projections held as Arrow tables registered on it too (a registration is one
        connection's own)."""
        cursor = self.connection().cursor()
        for name, table in (self.derived.held if self.derived is not None else {}).items():
            cursor.register(name, table)
        for name, table in self._views_held.items():
            cursor.register(name, table)
        return cursor

    def hold_view(self, name: str, table: pa.Table) -> None:
        """Serve ``table`` as ``name`` on the connection, and on each cursor made after (a view's
        rows made once as Arrow, in place of a DuckDB table of them: reports/_views.py)."""
        self.connection().register(name, table)
        self._views_held[name] = table

    @property
    def held(self) -> frozenset[str]:
        """The projections served as Arrow tables registered on the connection."""
        return frozenset(self.derived.held if self.derived is not None else ())

    def release(self, name: str) -> None:
        """Stop serving the held projection ``name`` on the connection, and let its rows go
        (cursors made before keep their own registration until they close)."""
        if self.derived is not None and self.derived.held.pop(name, None) is not None and self._con:
            self._con.unregister(name)

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
        if self.derived is not None:
            self.derived.held.clear()
        self._views_held.clear()
        if self._spill is not None:
            shutil.rmtree(self._spill, ignore_errors=True)
            self._spill = None


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
