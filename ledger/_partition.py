"""One checked read of the ledger's rows, split by group of runs (reports/_source.py
``open_group_sources``).

A whole ledger's tables do not all fit in a report's memory at once past a few million events;
one group of runs' tables do. :class:`Partition` is the sink of :func:`ledger._analytics.derive_checked`:
the rows of each projection of a scoped kind go to the groups whose scope keeps them (rows
without a run to every group), appended to one Arrow IPC file per group and projection in a
private folder, and read back memory-mapped when the group is opened
(:class:`GroupAnalytics`); the other projections (few rows: runs, blocks, probes...) are held
once, in memory, and served to every group. So every row is read and checked once, and a
group's tables are what a reader scoped to that group derives, in the same order (seq).

A projection's text columns whose values repeat (run and block ids, config digests, counter
names...) are written dictionary-encoded: at 10M events the files were 2.9 GB, written and read
back once each, and the kernel's copy of every byte into the page cache a fifth of the read's
CPU; encoded they are 1.5 GB.
DuckDB reads a dictionary column as the text column it encodes (the group's tables are checked
to read with the projection's own types, as any held table is), with the same values.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ._analytics import Analytics, Derived, RunScope, _copy_pieces, _hold, _quote, empty_table
from ._rows import SCHEMA
from ._snapshot import _reads_as
from ._snapshot_rows import single_kind

# A row's group where several groups keep it (reports/_source.py run_scope: the validation runs).
_SHARED = -1


class Partition:
    """Each projection's rows, by group of runs (a :class:`ledger._analytics.PieceSink`): those of
    a kind that ``scopes`` (one per group, all of the same kinds) keep by run are written to
    ``folder``, group by group; the others are held, for every group."""

    def __init__(self, folder: Path, scopes: Sequence[RunScope], projections: Mapping[str, str]) -> None:
        self.folder = folder
        kinds = frozenset().union(*(scope.kinds for scope in scopes))
        # A projection is split where its kind is; a projection of such a kind without a run column
        # (a scrape's counter samples) is split by its rows' seq, as a scoped read keeps whole rows.
        self.split = frozenset(name for name, sql in projections.items() if single_kind(sql) in kinds)
        universe = sorted(frozenset().union(*(scope.runs for scope in scopes)))
        # Every run some group keeps, and for each group which of them it keeps: a row's run is
        # looked up once (index_in), and each group's rows taken by that index.
        self._universe = pa.array(universe, pa.string())
        self._members = [pa.array([run in scope.runs for run in universe], pa.bool_()) for scope in scopes]
        # The one group that keeps each run, or _SHARED where several do (the validation runs).
        holders = [[g for g, scope in enumerate(scopes) if run in scope.runs] for run in universe]
        self._owner = pa.array([h[0] if len(h) == 1 else _SHARED for h in holders], pa.int32())
        self._writers: dict[tuple[int, str], pa.ipc.RecordBatchStreamWriter] = {}
        # Each split projection's text columns written dictionary-encoded, told by its first piece
        # (every file of a projection keeps one schema).
        self._encoded: dict[str, frozenset[str]] = {}
        self._held: dict[str, list[pa.Table]] = {}
        self.held: dict[str, pa.Table] = {}  # the projections served to every group (after finish)
        # Rows of a split projection whose run no group keeps (checked, not copied): a report that
        # must hold every run's rows (reports/_stream.py) is told there were some.
        self.rows_of_no_group = 0

    def take(self, name: str, piece: pa.Table, rows: pa.Table) -> None:
        if name not in self.split:
            # Copied: a piece of the read may lend buffers shared with the rest of its part's rows,
            # which a view of them would keep alive to the end (the read's memory grew by about
            # 40 MB a second at 10M events, every part held for a few rows of blocks and launches).
            self._held.setdefault(name, []).append(
                pc.take(piece, pa.array(range(piece.num_rows), pa.int64()))
            )
            return
        encoded = self._encoded.get(name)
        if encoded is None:
            encoded = self._encoded[name] = _repeating(piece)
        # Encoded first: a run id's group is then looked up once per distinct id, not per row.
        piece = _encode(piece, encoded)
        runs = piece.column("run_id") if "run_id" in piece.column_names else _runs_by_seq(piece, rows)
        found = pc.index_in(runs, value_set=self._universe)
        without_run = pc.is_null(runs)
        # Each row's one group; rows without a run go to every group (_SHARED); null: no group's.
        owner = pc.if_else(without_run, pa.scalar(_SHARED, pa.int32()), pc.take(self._owner, found))
        self.rows_of_no_group += owner.null_count
        low, high = pc.min_max(owner).values()
        if low.as_py() is None:
            return  # no row of any group's
        if low.as_py() != _SHARED:
            # The usual piece: rows of one group, or of a few, each only theirs. A run's rows are
            # contiguous in seq, so most pieces are one group's whole; else one stable sort by group
            # keeps each group's rows in seq order.
            if owner.null_count:
                piece, owner = piece.filter(pc.is_valid(owner)), pc.drop_null(owner)
            if low.as_py() == high.as_py():
                self._writer(low.as_py(), name, piece.schema).write_table(piece)
                return
            order = pc.sort_indices(owner)
            piece, owner = piece.take(order), pc.take(owner, order)
            counts = pc.value_counts(owner)  # in the order of first sight: by group, as sorted
            start = 0
            for group, count in zip(
                counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True
            ):
                self._writer(group, name, piece.schema).write_table(piece.slice(start, count))
                start += count
            return
        # Rows several groups keep (without a run, or of a validation run): each group's own filter.
        for group, members in enumerate(self._members):
            # Null where the run is in no group's scope: dropped by the filter.
            part = piece.filter(pc.or_kleene(without_run, pc.take(members, found)))
            if part.num_rows:
                self._writer(group, name, part.schema).write_table(part)

    def _writer(self, group: int, name: str, schema: pa.Schema) -> pa.ipc.RecordBatchStreamWriter:
        writer = self._writers.get((group, name))
        if writer is None:
            # A stream, not a file: each piece's dictionaries are its own (replaced, which the
            # file format does not allow).
            writer = pa.ipc.new_stream(str(self._path(group, name)), schema)
            self._writers[group, name] = writer
        return writer

    def _path(self, group: int, name: str) -> Path:
        return self.folder / f"{group}.{name}.arrow"

    def finish(self) -> None:
        """Close the files (the read is over) and join each held projection's pieces."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        for name, pieces in self._held.items():
            self.held[name] = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        self._held.clear()

    def tables(self, group: int) -> dict[str, pa.Table]:
        """The ``group``-th group's projections that have rows: its own, memory-mapped from its
        files (the pages are the file's, not the process's), and the held ones."""
        tables = dict(self.held)
        for name in sorted(self.split):
            path = self._path(group, name)
            if path.exists():
                with pa.memory_map(str(path)) as mapped:
                    tables[name] = pa.ipc.open_stream(mapped).read_all()
        return tables

    def discard(self, group: int) -> None:
        """Remove the ``group``-th group's files (its tables read, and let go)."""
        for name in self.split:
            self._path(group, name).unlink(missing_ok=True)

    def close(self) -> None:
        """Remove every file and let the held rows go."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        self._held.clear()
        self.held.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


def _repeating(piece: pa.Table) -> frozenset[str]:
    """The text columns of ``piece`` whose values repeat: at most half as many distinct values as
    rows (ids of a request or digests of a payload, nearly all distinct, are left as they are)."""
    return frozenset(
        field.name
        for field, column in zip(piece.schema, piece.columns, strict=True)
        if pa.types.is_string(field.type)
        and 2 * pc.count_distinct(column, mode="all").as_py() <= piece.num_rows
    )


def _encode(piece: pa.Table, names: frozenset[str]) -> pa.Table:
    """``piece`` with the text columns ``names`` dictionary-encoded (the same values)."""
    if not names:
        return piece
    columns = [
        pc.dictionary_encode(column) if field.name in names else column
        for field, column in zip(piece.schema, piece.columns, strict=True)
    ]
    return pa.Table.from_arrays(columns, names=piece.column_names)


def _runs_by_seq(piece: pa.Table, rows: pa.Table) -> pa.ChunkedArray:
    """Each row of ``piece``'s run, looked up by its seq among ``rows`` (those it was made of)."""
    seqs = rows.column("seq")
    at = pc.index_in(piece.column("seq"), value_set=seqs.combine_chunks())
    return pc.take(rows.column("run_id"), at)


class GroupAnalytics(Analytics):
    """One group's :class:`Analytics`, over the tables a :class:`Partition` made of the one checked
    read (``shared``'s): the snapshot proven by that read's reader, and no row read again.
    ``tables``: the group's projections that have rows (:meth:`Partition.tables`); ``on_close``
    runs once the connection is closed (the group's files removed)."""

    def __init__(
        self,
        shared: Analytics,
        scope: RunScope,
        tables: Mapping[str, pa.Table],
        on_close: Callable[[], None],
    ) -> None:
        super().__init__(shared.ledger, None, shared.projections, shared.up_to_seq, True, scope)
        self.snapshot = shared.snapshot
        self._shared = shared
        self._tables = dict(tables)
        self._on_close = on_close

    def _prove(self) -> tuple[list[Path], int]:
        # Proven once, by the read's reader: its segments serve every group's ``events`` view.
        derived = self._shared.derived
        return self.snapshot.segments(), 0 if derived is None else derived.head_seq

    def _derive(self, con: duckdb.DuckDBPyConnection, until: int) -> None:
        """Each projection as derive_checked leaves it: its rows served as the Arrow table where
        DuckDB reads that with the names and types the projection's own SQL gives, else copied into
        the table that SQL makes (DuckDB's types), which is left empty where it has no rows."""
        shared = self._shared.derived
        assert shared is not None
        derived = Derived(
            rows=shared.rows,
            head_seq=shared.head_seq,
            head_chain=shared.head_chain,
            seconds=shared.seconds,
            read_seconds=shared.read_seconds,
            rows_checked=shared.rows_checked,
            rows_read_again=shared.rows_read_again,
        )
        empty = empty_table(SCHEMA)
        for name, sql in self.projections.items():
            table = self._tables.pop(name, None)
            # DuckDB reads the table with the types the projection's own SQL gives (asked once per
            # SQL and schema in a process: each group after the first is told without a query).
            if table is not None and table.num_rows and _reads_as(sql, table, empty):
                _hold(con, derived, name, table)
                continue
            con.register("events", empty)
            con.execute(f"CREATE TABLE {_quote(name)} AS {sql}")
            con.unregister("events")
            if table is not None and table.num_rows:
                _copy_pieces(con, name, [table])
        self.derived, self.checked = derived, self._shared.checked

    def close(self) -> None:
        super().close()
        self._tables.clear()
        self._on_close()
