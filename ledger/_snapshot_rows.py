"""A snapshot segment's rows read, checked and typed in one native pass, and split by kind.

Writing a segment used to read its rows natively into Arrow while the native verifier
read the same seq range of the file again on another thread, and then parsed every
row's data in DuckDB once more to find each kind's fields and their JSON types. Here
``ledger/_carrow.c`` does all three as it steps the rows once: each row's digest is
recomputed from its canonical envelope and its chain link followed before its bytes are
copied (so the rows kept are the rows checked, not rows read beside a check), and the
top-level keys of its data are typed as DuckDB's ``json_type`` names them. A row whose
data is not a canonical object with plain keys leaves the typing to DuckDB
(:func:`ledger._snapshot.table_fields`), which stays the reference.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ._row_sources import RowSource, SqliteRows
from ._rows import SCHEMA, native_table
from ._typed import NativeSpecs, entries_table, typed_table
from ._verify import _DELETED, _EDITED, _RELINKED, RangeResult

_carrow: ModuleType | None
try:
    from . import _carrow
except ImportError:  # installed without a C compiler or headers: read, then check apart
    _carrow = None

# Threads split a range only when each part is at least this long.
_SPLIT = 100_000


@dataclass(frozen=True)
class CheckedRows:
    """Rows of a seq range, what their check found, and their fields (None: DuckDB types them).

    ``projected``: the projections the read filled natively (name → its rows, as its SQL gives them
    from these rows), of the kinds present whose every row the native parse was sure of; ``kinds``:
    the kinds present, where the read says (None: not asked)."""

    table: pa.Table
    checked: RangeResult
    fields: dict[str, dict[str, list[str]]] | None
    projected: dict[str, pa.Table] = dataclass_field(default_factory=dict)
    kinds: frozenset[str | None] | None = None


# The envelope columns a typed table takes from its kind's rows (ledger/_typed.py typed_table).
_ENVELOPE_MASK = (1 << SCHEMA.names[1:].index("run_id")) | (1 << SCHEMA.names[1:].index("block_id"))
_ENVELOPE_SCHEMA = pa.schema([SCHEMA.field("seq"), SCHEMA.field("run_id"), SCHEMA.field("block_id")])


Projected = tuple[dict[str, pa.Table], set[str], set[str | None]]


def _projected(specs: NativeSpecs, groups: list[Any]) -> Projected:
    """One part's natively filled projections (name → table), the kinds it was not sure of, and
    the kinds it holds."""
    tables: dict[str, pa.Table] = {}
    unsure: set[str] = set()
    for kind, count, seqs, columns, fields, entries_outs in groups:
        if kind not in specs.typed:
            continue
        if fields is None:
            unsure.add(kind)
            continue
        name, spec = specs.typed[kind]
        tables[name] = typed_table(spec, native_table(count, seqs, columns, _ENVELOPE_SCHEMA), fields)
        if kind in specs.unnested:
            tables[specs.unnested[kind][0]] = entries_table(entries_outs)
    return tables, unsure, {group[0] for group in groups}


def read_checked(
    source: RowSource | str,
    after: int,
    until: int,
    previous: str,
    threads: int = 2,
    specs: NativeSpecs | None = None,
) -> CheckedRows:
    """Rows ``after < seq <= until`` of ``source`` (an SQLite file's path is taken too), each
    checked against the chain before it (``previous``: the chain at ``after``, proven), as one
    table in seq order; given ``specs``, the projections they name filled in the same pass
    (:attr:`CheckedRows.projected`), where the build can.

    Threads read parts of the range; a part after the first follows the chain the database
    stores at its first seq minus one, and must start where the part before ended, on that chain.
    """
    rows = SqliteRows(source) if isinstance(source, str) else source
    parts = max(1, min(threads, (until - after) // _SPLIT))
    step = -(-(until - after) // parts) if until > after else 1
    bounds = [(a, min(a + step, until)) for a in range(after, until, step)] or [(after, until)]
    chains = rows.stored_chains([a for a, _ in bounds[1:]])
    starts = [previous, *(chains.get(a, "") for a, _ in bounds[1:])]
    assert _carrow is not None
    carrow = _carrow

    typed = (
        None
        if specs is None or not specs.typed or not hasattr(carrow, "TYPED_ROWS")
        else specs.argument(dict.fromkeys(specs.typed, _ENVELOPE_MASK))
    )

    def read(
        part: int,
    ) -> tuple[pa.Table, tuple[int, int, int, int, str], dict[str, dict[str, int]] | None, Projected | None]:
        a, b = bounds[part]
        count, seqs, columns, check, fields, *grouped = rows.rows(a, b, a + 1, starts[part], typed)
        made = _projected(specs, grouped[0][0]) if grouped and specs is not None else None
        return native_table(count, seqs, columns), check, fields, made

    with ThreadPoolExecutor(len(bounds), thread_name_prefix="kvledger-snapshot-read") as pool:
        results = list(pool.map(read, range(len(bounds))))
    table = pa.concat_tables([r[0] for r in results]) if len(results) > 1 else results[0][0]
    projected: dict[str, pa.Table] = {}
    kinds: frozenset[str | None] | None = None
    made_parts = [r[3] for r in results if r[3] is not None]
    if specs is not None and typed is not None and len(made_parts) == len(results):
        unsure = set().union(*(m[1] for m in made_parts))
        kinds = frozenset().union(*(m[2] for m in made_parts))
        names = {name for m in made_parts for name in m[0]}
        doubted = {name for kind, (name, _) in specs.typed.items() if kind in unsure} | {
            name for kind, (name, _) in specs.unnested.items() if kind in unsure
        }
        for name in sorted(names - doubted):
            pieces = [m[0][name] for m in made_parts if name in m[0]]
            projected[name] = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
    last_seq, chain = after, previous
    checked: RangeResult | None = None
    merged: dict[str, dict[str, int]] | None = {}
    for (a, b), start, (_, (outcome, bad, found, last_good, last_chain), fields, _) in zip(
        bounds, starts, results, strict=True
    ):
        if fields is None:
            merged = None
        elif merged is not None:
            for kind, keys in fields.items():
                known = merged.setdefault(kind, {})
                for key, mask in keys.items():
                    known[key] = known.get(key, 0) | mask
        if checked is not None:
            continue
        if (a, start) != (last_seq, chain):
            # The row before this part changed between the reads, or the part before stopped early.
            checked = RangeResult(last_seq, chain, last_seq + 1, _RELINKED)
        elif outcome == carrow.DELETED:
            checked = RangeResult(
                last_good, last_chain, bad, _DELETED.format(seq=found, expected=last_good + 1)
            )
        elif outcome != carrow.OK:
            checked = RangeResult(
                last_good, last_chain, bad, _EDITED if outcome == carrow.EDITED else _RELINKED
            )
        elif last_good < b:
            checked = RangeResult(
                last_good, last_chain, last_good + 1, f"seq {last_good + 1} is missing (rows deleted)"
            )
        else:
            last_seq, chain = last_good, last_chain
    return CheckedRows(table, checked or RangeResult(last_seq, chain), _named(merged), projected, kinds)


def _named(masks: dict[str, dict[str, int]] | None) -> dict[str, dict[str, list[str]]] | None:
    """Type masks as the sorted json_type names :func:`ledger._snapshot.table_fields` gives."""
    if masks is None or _carrow is None:
        return None
    names = _carrow.TYPE_NAMES
    return {
        kind: {
            key: sorted(names[bit] for bit in range(len(names)) if mask >> bit & 1)
            for key, mask in sorted(keys.items())
        }
        for kind, keys in sorted(masks.items())
    }


# A projection that reads ``events`` once, filtered on one kind and nothing else: it sees the same
# rows when given only that kind's rows.
_ONE_KIND = re.compile(r"\bFROM events WHERE kind = '((?:[^']|'')*)'(?=\s*\)|\s*$)")
_EVENTS = re.compile(r"\bevents\b")


def single_kind(sql: str) -> str | None:
    """The one kind ``sql`` reads, where its only use of ``events`` is ``FROM events WHERE kind =
    '<kind>'`` with no other condition; None otherwise (it is given every row)."""
    if len(_EVENTS.findall(sql)) != 1:
        return None
    found = _ONE_KIND.search(sql)
    return None if found is None else found.group(1).replace("''", "'")


# A string literal of SQL: what it holds names no column (a JSON path's `*`, a field's name).
_LITERAL = re.compile(r"'(?:[^']|'')*'")


def columns_read(sqls: list[str]) -> list[str]:
    """The columns of :data:`SCHEMA` that ``sqls`` name outside their string literals (every
    column where one selects ``*``): a projection given only these sees what it reads (DuckDB's
    binder refuses any other)."""
    bare = [_LITERAL.sub("''", sql) for sql in sqls]
    if any("*" in sql for sql in bare):
        return list(SCHEMA.names)
    words = set(re.findall(r"\w+", " ".join(bare)))
    return [name for name in SCHEMA.names if name in words or name == "kind"]


def by_kind(table: pa.Table, columns: list[str] | None = None) -> dict[str, pa.Table]:
    """Each kind's rows of ``table`` (only ``columns``, default all), in seq order: per chunk of
    ``table`` (the parts threads read) one stable sort and one take, then slices, so that each
    projection scans only its kind's rows rather than filtering all of them.

    A take over a table of several chunks cost 0.6 to 1.0 s of CPU per 500k rows (Arrow resolves
    each index's chunk); per chunk it is one copy of the columns taken, about 0.15 s."""
    if table.num_rows == 0:
        return {}
    kinds = pc.unique(table.column("kind")).drop_null()
    names = list(table.schema.names if columns is None else columns)
    schema = pa.schema([table.schema.field(name) for name in names])
    pieces: dict[str, list[pa.RecordBatch]] = {}
    for batch in table.to_batches():
        if batch.num_rows == 0:
            continue
        indices = pc.index_in(batch.column("kind"), value_set=kinds)
        order = pc.sort_indices(indices)  # stable: each kind's rows stay in seq order
        grouped = batch.select(names).take(order)
        counts = pc.value_counts(indices)
        offset = 0
        # sort_indices puts the null kinds (if any) last: the counts in index order, nulls after.
        for value, count in sorted(
            zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True),
            key=lambda pair: (pair[0] is None, pair[0] or 0),
        ):
            if value is not None:
                pieces.setdefault(str(kinds[value].as_py()), []).append(grouped.slice(offset, count))
            offset += count
    return {kind: pa.Table.from_batches(batches, schema=schema) for kind, batches in pieces.items()}
