"""A ledger's stored rows as Arrow tables: natively for SQLite files, else through the driver.

The snapshot (ledger/_snapshot.py) reads every row once when a segment is written,
and a verified report (reports/_source.py) reads them again from the database; in
Python each row costs a tuple of nine objects and a second conversion into Arrow
(about 10 µs per row on a loaded 2-core machine), so SQLite files are read by
``ledger/_carrow.c`` straight into Arrow buffers, one thread per seq range, with
the GIL released. ``KVLEDGER_READER=python`` forces the driver path (parity tests).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import pyarrow as pa

from ._store import Ledger
from ._verify import native_path

_carrow: ModuleType | None
try:
    from . import _carrow
except ImportError:  # installed without a C compiler or headers: the driver path serves
    _carrow = None

SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("id", pa.string()),
        ("ts", pa.string()),
        ("kind", pa.string()),
        ("run_id", pa.string()),
        ("block_id", pa.string()),
        ("data", pa.string()),
        ("digest", pa.string()),
        ("chain", pa.string()),
    ]
)
# Threads split a range only when each part is at least this long.
_SPLIT = 100_000


def rows_to_table(rows: list[tuple[Any, ...]]) -> pa.Table:
    """Arrow table of stored rows (data kept as canonical JSON text)."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in SCHEMA]
    return pa.Table.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, SCHEMA, strict=True)], schema=SCHEMA
    )


def native_reader(ledger: Ledger) -> str | None:
    """The SQLite file the native reader reads for ``ledger``, or None for the driver path."""
    if os.environ.get("KVLEDGER_READER", "auto") == "python" or _carrow is None:
        return None
    return native_path(ledger, "auto")


def native_table(
    count: int,
    seqs: object,
    columns: list[tuple[object | None, int, object, object]],
    schema: pa.Schema = SCHEMA,
) -> pa.Table:
    """The Arrow table over the buffers the native reader filled (no copy): seq, then the
    text columns as (validity, null count, offsets, data), those of ``schema`` (default all)."""
    arrays: list[pa.Array] = [pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(seqs)])]
    for validity, nulls, offsets, data in columns:
        buffers = [
            None if validity is None else pa.py_buffer(validity),
            pa.py_buffer(offsets),
            pa.py_buffer(data),
        ]
        arrays.append(pa.Array.from_buffers(pa.string(), count, buffers, null_count=nulls))
    return pa.Table.from_arrays(arrays, schema=schema)


def _native(path: str, after: int, until: int) -> pa.Table:
    assert _carrow is not None
    return native_table(*_carrow.read(path, after, until))


def read_rows(ledger: Ledger, after_seq: int, until_seq: int, threads: int = 2) -> pa.Table:
    """Rows ``after_seq < seq <= until_seq`` in seq order, as a table of :data:`SCHEMA`."""
    path = native_reader(ledger)
    if path is None:
        return rows_to_table(list(ledger.raw_rows(after_seq=after_seq, until_seq=until_seq)))
    parts = max(1, min(threads, (until_seq - after_seq) // _SPLIT))
    if parts == 1:
        return _native(path, after_seq, until_seq)
    step = -(-(until_seq - after_seq) // parts)
    bounds = [(a, min(a + step, until_seq)) for a in range(after_seq, until_seq, step)]
    with ThreadPoolExecutor(len(bounds)) as executor:
        tables = list(executor.map(lambda b: _native(path, *b), bounds))
    return pa.concat_tables(tables)
