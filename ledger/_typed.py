"""Typed fields parsed natively: what a projection's ``json_transform`` would give, built by
``ledger/_carrow.c`` as it reads and checks the rows, so DuckDB parses no JSON for it.

A projection of the form ``SELECT seq, run_id, block_id, unnest(json_transform(data,
'<structure>')) FROM events WHERE kind = '<kind>'`` (reports/_views.py writes every extraction
so) is typed here when its structure names only VARCHAR, BIGINT, DOUBLE, BOOLEAN, JSON and
objects of those. The native parse gives up on any row it cannot reproduce byte for byte
(ledger/_carrow.c says which); its caller then reads those rows again for DuckDB to parse.

A projection written by :func:`entries_sql` (one row per entry of an object field whose key is
one of some names: a scrape's counter samples) is filled in the same pass, beside its kind's
typed fields, on the same terms.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

_TRANSFORM = re.compile(
    r"SELECT seq, run_id, block_id, unnest\(json_transform\(data, '(\{[^']*\})'\)\) "
    r"FROM events WHERE kind = '((?:[^']|'')*)'\Z"
)
# The native parse's types (ledger/_carrow.c F_*, in the order of _carrow.FIELD_TYPES) and their
# Arrow types (DuckDB's types).
_TYPES = ("VARCHAR", "BIGINT", "DOUBLE", "BOOLEAN", "JSON", "STRUCT")
_ARROW: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "JSON": pa.json_(),
}
_CODES = {name: (_TYPES.index(name), kind) for name, kind in _ARROW.items()}
_STRUCT = _TYPES.index("STRUCT")
_ENVELOPE = ("seq", "run_id", "block_id")

# (name, code, children): the form ledger/_carrow.c reads.
NativeField = tuple[str, int, "list[NativeField] | None"]


@dataclass(frozen=True)
class Typed:
    """One projection's typed fields: what the native parse fills and the table it makes."""

    kind: str
    fields: list[NativeField]
    schema: pa.Schema  # seq, run_id, block_id, then the fields, as json_transform orders them


def _fields(structure: dict[str, Any]) -> tuple[list[NativeField], list[pa.Field]] | None:
    native: list[NativeField] = []
    arrow: list[pa.Field] = []
    for name, spec in structure.items():
        if isinstance(spec, dict):
            if not spec:
                return None
            inner = _fields(spec)
            if inner is None:
                return None
            native.append((name, _STRUCT, inner[0]))
            arrow.append(pa.field(name, pa.struct(inner[1])))
        elif isinstance(spec, str) and spec in _CODES:
            code, kind = _CODES[spec]
            native.append((name, code, None))
            arrow.append(pa.field(name, kind))
        else:
            return None
    return native, arrow


def typed(sql: str) -> Typed | None:
    """The typed fields of a projection the native parse can fill, or None (DuckDB parses it)."""
    found = _TRANSFORM.match(sql)
    if found is None:
        return None
    try:
        structure = json.loads(found.group(1))
    except ValueError:
        return None
    if not isinstance(structure, dict) or not structure or set(structure) & set(_ENVELOPE):
        return None
    parsed = _fields(structure)
    if parsed is None:
        return None
    schema = pa.schema(
        [pa.field("seq", pa.int64()), ("run_id", pa.string()), ("block_id", pa.string()), *parsed[1]]
    )
    return Typed(found.group(2).replace("''", "'"), parsed[0], schema)


def _arrays(fields: list[pa.Field], outs: Any, count: int) -> list[pa.Array]:
    arrays = []
    for field in fields:
        validity, nulls, values, data = next(outs)
        bits = None if validity is None else pa.py_buffer(validity)
        if pa.types.is_struct(field.type):
            children = _arrays(list(field.type), outs, count)
            arrays.append(
                pa.Array.from_buffers(field.type, count, [bits], null_count=nulls, children=children)
            )
        elif data is not None:
            buffers = [bits, pa.py_buffer(values), pa.py_buffer(data)]
            arrays.append(pa.Array.from_buffers(field.type, count, buffers, null_count=nulls))
        else:
            arrays.append(
                pa.Array.from_buffers(field.type, count, [bits, pa.py_buffer(values)], null_count=nulls)
            )
    return arrays


def _whole(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def typed_table(spec: Typed, envelope: pa.Table, outs: list[Any]) -> pa.Table:
    """The projection's rows: ``envelope``'s seq, run_id and block_id, then the typed columns the
    native parse filled (its buffers wrapped, not copied)."""
    count = envelope.num_rows
    # The native read's table is one chunk: its arrays as they are (``combine_chunks`` copies even one).
    arrays = [_whole(envelope.column(name)) for name in _ENVELOPE]
    arrays += _arrays(list(spec.schema)[3:], iter(outs), count)
    return pa.Table.from_arrays(arrays, schema=spec.schema)


# ---- An object field's entries, unnested (e.g. a scrape's Prometheus samples). ----

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ENTRIES_FROM = re.compile(
    r".* FROM \(SELECT seq, unnest\(json_keys\(data, '\$\.([A-Za-z_][A-Za-z0-9_]*)'\)\) AS key, "
    r"unnest\(json_extract_string\(data, '\$\.\1\.\*'\)\) AS value "
    r"FROM events WHERE kind = '((?:[^']|'')*)'\)\) "
    r"WHERE name IS NOT NULL\Z",
    re.DOTALL,
)
_ENTRY_CASE = re.compile(
    r"WHEN key = '((?:[^']|'')*)' OR starts_with\(key, '(?:[^']|'')*\{'\) THEN '((?:[^']|'')*)'"
)
ENTRIES_SCHEMA = pa.schema(
    [("seq", pa.int64()), ("name", pa.string()), ("series", pa.string()), ("value", pa.float64())]
)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def entries_sql(kind: str, field: str, names: dict[str, str]) -> str:
    """SQL over ``events`` giving one row per entry of the object ``data.<field>`` of ``kind``'s rows
    whose key is one of ``names`` (name → label) or starts with it and '{' (a Prometheus sample's
    metric and labels): ``seq``, ``name`` (the label), ``series`` (the key past the name: its
    labels, or '' for none) and ``value`` (the entry as DOUBLE, NULL where it is not a number).
    The native read fills the same rows (:func:`entries`) without DuckDB parsing the JSON."""
    if not _IDENTIFIER.match(field):
        raise ValueError(f"entries of {field!r}: a field name of letters, digits and underscores")
    if not names or any(not name for name in names):
        raise ValueError("entries: at least one name, none empty")
    # The keys and values as two lists unnested side by side (json_keys and the `.*` wildcard both
    # walk the object in its order): half the CPU of a cast to MAP(VARCHAR, JSON). A field value that
    # is not an object gives no row.
    matches = [f"key = {_literal(n)} OR starts_with(key, {_literal(n + '{')})" for n in names]
    label = " ".join(f"WHEN {m} THEN {_literal(names[n])}" for m, n in zip(matches, names, strict=True))
    series = " ".join(f"WHEN {m} THEN substr(key, {len(n) + 1})" for m, n in zip(matches, names, strict=True))
    return (
        "SELECT seq, name, series, TRY_CAST(value AS DOUBLE) AS value FROM (SELECT seq, value, "
        f"CASE {label} END AS name, CASE {series} END AS series "
        f"FROM (SELECT seq, unnest(json_keys(data, '$.{field}')) AS key, "
        f"unnest(json_extract_string(data, '$.{field}.*')) AS value "
        f"FROM events WHERE kind = {_literal(kind)})) "
        "WHERE name IS NOT NULL"
    )


@dataclass(frozen=True)
class Entries:
    """One projection of an object field's entries (:func:`entries_sql`): what the native read
    fills beside its kind's typed fields."""

    kind: str
    field: str
    names: tuple[tuple[str, str], ...]  # (name, label), in the SQL's order

    def native(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """The form ledger/_carrow.c reads (a typed spec's third item)."""
        return self.field, self.names


def entries(sql: str) -> Entries | None:
    """The entries projection ``sql`` is, when it is exactly what :func:`entries_sql` writes, else None."""
    # The kind, field and names read off the SQL; written again from them, it must be the same text.
    tail = _ENTRIES_FROM.match(sql)
    if tail is None:
        return None
    found = _ENTRY_CASE.findall(sql)
    names = {name.replace("''", "'"): label.replace("''", "'") for name, label in found}
    field, kind = tail.group(1), tail.group(2).replace("''", "'")
    if not names or entries_sql(kind, field, names) != sql:
        return None
    return Entries(kind, field, tuple(names.items()))


def entries_table(outs: tuple[int, list[Any]]) -> pa.Table:
    """The entries the native read filled (its buffers wrapped, not copied)."""
    count, columns = outs
    return pa.Table.from_arrays(_arrays(list(ENTRIES_SCHEMA), iter(columns), count), schema=ENTRIES_SCHEMA)


@dataclass(frozen=True)
class NativeSpecs:
    """The projections a native read fills, by kind: each kind's first projection of typed fields
    (``typed``: kind → (name, spec)) and, beside it, a projection of the entries of an object field
    the typed one does not read (``unnested``; one pass gives one or the other per field)."""

    typed: dict[str, tuple[str, Typed]]
    unnested: dict[str, tuple[str, Entries]]

    def argument(self, masks: Mapping[str, int]) -> dict[str, tuple[Any, ...]]:
        """The ``typed`` argument of ``ledger/_carrow.c``'s reads: kind → (the text columns its rows
        keep, by ``masks``, its fields[, its entries])."""
        argument: dict[str, tuple[Any, ...]] = {}
        for kind, (_, spec) in self.typed.items():
            entries_of = (self.unnested[kind][1].native(),) if kind in self.unnested else ()
            argument[kind] = (masks[kind], spec.fields, *entries_of)
        return argument

    def names(self) -> set[str]:
        """The projections filled natively."""
        return {name for name, _ in self.typed.values()} | {name for name, _ in self.unnested.values()}


def native_specs(
    kinds: Mapping[str, list[str]], projections: Mapping[str, str], with_entries: bool
) -> NativeSpecs:
    """What the native read fills of ``projections`` (name → SQL), given each kind's projections
    (``kinds``: kind → names, in order); ``with_entries``: whether the build unnests entries."""
    found: dict[str, tuple[str, Typed]] = {}
    for kind, names in kinds.items():
        for name in names:
            spec = typed(projections[name])
            if spec is not None and spec.kind == kind:
                found[kind] = (name, spec)
                break
    unnested: dict[str, tuple[str, Entries]] = {}
    for kind, names in kinds.items():
        for name in names:
            spec_of_entries = entries(projections[name])
            if (
                with_entries
                and spec_of_entries is not None
                and kind in found
                and spec_of_entries.field not in {field[0] for field in found[kind][1].fields}
            ):
                unnested[kind] = (name, spec_of_entries)
                break
    return NativeSpecs(found, unnested)
