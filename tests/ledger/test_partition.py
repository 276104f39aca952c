"""The partition of one checked read by group of runs (ledger/_partition.py), fed pieces directly.

Its spill files keep repeating text columns dictionary-encoded, which columns told by a
projection's first piece; what a group reads back must be the rows it was handed, value for
value, whatever each piece's dictionary.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ledger._analytics import RunScope
from ledger._partition import Partition

SQL = (
    'SELECT seq, run_id, block_id, unnest(json_transform(data, \'{"request_id":"VARCHAR"}\')) '
    "FROM events WHERE kind = 'request.sent'"
)
NAME = "kv_src_request_sent"


def _piece(first_seq: int, runs: list[str], block: str, unique: bool) -> pa.Table:
    count = len(runs)
    seqs = list(range(first_seq, first_seq + count))
    ids = [f"req-{s}" if unique else "req-same" for s in seqs]
    return pa.table(
        {
            "seq": pa.array(seqs, pa.int64()),
            "run_id": pa.array(runs, pa.string()),
            "block_id": pa.array([block if i % 3 else None for i in range(count)], pa.string()),
            "request_id": pa.array(ids, pa.string()),
        }
    )


def test_repeating_text_is_spilled_encoded_and_every_group_reads_back_its_rows(tmp_path: Path) -> None:
    scopes = [
        RunScope(frozenset({"request.sent"}), frozenset({"run-a"})),
        RunScope(frozenset({"request.sent"}), frozenset({"run-b"})),
    ]
    partition = Partition(tmp_path, scopes, {NAME: SQL})
    # The first piece decides: run_id and block_id repeat, request_id does not.
    first = _piece(1, ["run-a"] * 6 + ["run-b"] * 6, "blk-1", unique=True)
    # A later piece whose ids all repeat, and one whose runs and blocks are new values: each written
    # in the first piece's schema, with its own dictionaries.
    second = _piece(13, ["run-b"] * 4, "blk-2", unique=False)
    third = _piece(17, ["run-a", "run-b", "run-a"], "blk-3", unique=True)
    for piece in (first, second, third):
        partition.take(NAME, piece, piece)
    partition.finish()
    try:
        for group, run in enumerate(["run-a", "run-b"]):
            (table,) = partition.tables(group).values()
            schema = table.schema
            assert pa.types.is_dictionary(schema.field("run_id").type)
            assert pa.types.is_dictionary(schema.field("block_id").type)
            assert pa.types.is_string(schema.field("request_id").type)
            want = pa.concat_tables([p.filter(pc.equal(p["run_id"], run)) for p in (first, second, third)])
            got = table.cast(want.schema)
            assert got.to_pylist() == want.to_pylist()
            assert got["seq"].to_pylist() == sorted(got["seq"].to_pylist())  # seq order kept
    finally:
        partition.close()
    assert not tmp_path.exists()
