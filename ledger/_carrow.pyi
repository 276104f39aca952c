# Types of the native row reader (ledger/_carrow.c).
from typing import Any

class Memory:
    """Bytes read natively, lent to Arrow through the buffer protocol (pyarrow.py_buffer)."""

OK: int
SCOPES: int
# A typed spec may name an object field's entries to unnest (read_checked_by_kind's ``typed``).
ENTRIES: int
DELETED: int
EDITED: int
RELINKED: int
# The typed fields' types, in the order of their codes (read_checked_by_kind's ``typed``).
FIELD_TYPES: tuple[str, ...]
# DuckDB's json_type names, in the order of the bits of a field's type mask.
TYPE_NAMES: tuple[str, ...]

def read(
    path: str, after_seq: int, until_seq: int, /
) -> tuple[int, Memory, list[tuple[Memory | None, int, Memory, Memory]]]: ...

# What read_checked and check_copy_rows give: the rows, their seqs, the text columns, the check and
# the data's fields (None: DuckDB types them).
Checked = tuple[
    int,
    Memory,
    list[tuple[Memory | None, int, Memory, Memory]],
    tuple[int, int, int, int, str],
    dict[str, dict[str, int]] | None,
]

def read_checked(
    path: str, after_seq: int, until_seq: int, expected_seq: int, previous_chain: str, /
) -> Checked: ...

# A typed field as the native parse reads it: (name, type code, children of a STRUCT or None).
NativeField = tuple[str, int, list["NativeField"] | None]
# One output column of a typed field: (validity | None, nulls, values | None, string data | None).
TypedColumn = tuple[Memory | None, int, Memory | None, Memory | None]

# An object field's entries to unnest: (field, ((name, label), ...)) (ledger/_typed.py Entries).
NativeEntries = tuple[str, tuple[tuple[str, str], ...]]
# A typed kind's spec: (text columns, fields) or (text columns, fields, entries).
TypedSpec = tuple[int, list[NativeField]] | tuple[int, list[NativeField], NativeEntries]

# What read_checked_by_kind and check_copy give: the rows, each kind's (kind, rows, seqs, text
# columns, typed columns | None, (entries, entry columns) | None) in order of first appearance,
# the check, and whether a row of a typed kind was one the parse was not sure of.
ByKind = tuple[
    int,
    list[
        tuple[
            str | None,
            int,
            Memory,
            list[tuple[Memory | None, int, Memory, Memory]],
            list[TypedColumn] | None,
            tuple[int, list[TypedColumn]] | None,
        ]
    ],
    tuple[int, int, int, int, str],
    bool,
]

def read_checked_by_kind(
    path: str,
    after_seq: int,
    until_seq: int,
    expected_seq: int,
    previous_chain: str,
    columns: int = 255,
    typed: dict[str, TypedSpec] | None = None,
    scope: tuple[tuple[str, ...], tuple[str, ...]] | None = None,
    /,
) -> ByKind: ...
def check_copy(
    data: Any,
    expected_seq: int,
    previous_chain: str,
    columns: int = 255,
    typed: dict[str, TypedSpec] | None = None,
    scope: tuple[tuple[str, ...], tuple[str, ...]] | None = None,
    /,
) -> ByKind: ...
def copy_out(get_copy_data: int, free_mem: int, conn: int, /) -> tuple[Any, int]: ...
def check_copy_rows(data: Any, expected_seq: int, previous_chain: str, /) -> Checked: ...
