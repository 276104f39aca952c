"""The native unnest of an object field's entries (ledger/_carrow.c, ledger/_typed.py entries_sql)
against the SQL it stands in for, which DuckDB runs: wherever the native read says it is sure of a
row, its entries are DuckDB's, value for value and type for type; where it is not, the row is
DuckDB's to parse (and the derivation's tables come out the same: test_typed_parse.py's awkward
ledger holds such scrapes)."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import orjson
import pytest

from ledger._events import GENESIS
from ledger._rows import native_table
from ledger._snapshot_rows import _carrow
from ledger._typed import entries, entries_sql, entries_table, typed
from reports._views import COUNTERS, projections

from .test_typed_parse import _ledger_with, _no_nul, _sql, _sure_of

KIND = "note.added"
NAMES = {"vllm:prefix_cache_hits_total": "local", "lmcache:hits": "lm", "q'uote": "it's"}
SQL = entries_sql(KIND, "samples", NAMES)
TYPED = typed(
    f'SELECT seq, run_id, block_id, unnest(json_transform(data, \'{{"x":"VARCHAR"}}\')) '
    f"FROM events WHERE kind = '{KIND}'"
)

LABELS = ["", '{engine="0"}', '{a="\\"q\\"",b="\u00e9\u4e2d"}', "{\U0001f600}", '{x="\\n"}', "{}", "{\x00}"]
VALUES: list[object] = [
    0,
    -3,
    8192,
    10**18,
    0.0,
    -0.0,
    12.5,
    1e-7,
    1.5e300,
    5e-324,
    None,
    "12",
    "NaN",
    True,
    [1],
    {"a": 1},
]


def _key(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.6:
        return rng.choice(list(NAMES)) + rng.choice(LABELS)
    if roll < 0.75:
        return rng.choice(list(NAMES)) + rng.choice(["x", "_total", " {", "}"])
    return rng.choice(["other", "vllm:prefix_cache_hits", "x{y}", "\u00e9", "nul\x00", "lmcache:hit"])


def _samples(rng: random.Random) -> object:
    roll = rng.random()
    if roll < 0.05:
        return None
    if roll < 0.08:
        return rng.choice([[1, 2], "text", 3, True])
    return {_key(rng): rng.choice(VALUES) for _ in range(rng.randrange(0, 6))}


def _matched(key: str) -> bool:
    return any(key == name or key.startswith(name + "{") for name in NAMES)


def _sure(samples: object) -> bool:
    """Whether the native unnest takes a row with these samples (canonical JSON)."""
    if samples is None:
        return True
    if not isinstance(samples, dict):
        return False
    for key, value in samples.items():
        if not _no_nul(key):
            return False
        if _matched(key):
            if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
                return False
            if not _sure_of(value, "DOUBLE"):
                return False
        elif not _no_nul(value):
            return False
    return True


def _rows(rng: random.Random, count: int) -> list[tuple[str, object]]:
    rows = []
    for _ in range(count):
        samples = _samples(rng)
        data: dict[str, object] = {"x": "v"}
        if rng.random() > 0.05:
            data["samples"] = samples
        else:
            samples = None  # no such field: no entries
        text = orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode()
        rows.append((text, samples))
    return rows


def test_entries_sql_is_recognised_exactly() -> None:
    spec = entries(SQL)
    assert spec is not None and spec.kind == KIND and spec.field == "samples"
    assert dict(spec.names) == NAMES
    assert entries(SQL.replace("WHERE name IS NOT NULL", "WHERE name IS NULL")) is None
    assert entries(SQL + " ") is None
    counters = entries(projections()["kv_src_counter_samples"])
    assert counters is not None
    assert dict(counters.names) == {metric: counter for counter, metric in COUNTERS.items()}


@pytest.mark.parametrize(("field", "names"), [("a.b", {"x": "y"}), ("samples", {}), ("samples", {"": "y"})])
def test_entries_sql_refuses_what_it_cannot_write(field: str, names: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="entries"):
        entries_sql(KIND, field, names)


def test_entries_are_unnested_as_duckdb_unnests_them(tmp_path: Path) -> None:
    """Random samples, one row at a time: DuckDB's entries wherever the native read is sure, and it
    is sure of exactly the rows its rules take (a kept value that is not a number it reads exactly
    or null, U+0000 in a key, samples that are neither an object nor null are DuckDB's)."""
    assert _carrow is not None and hasattr(_carrow, "ENTRIES") and TYPED is not None
    spec = entries(SQL)
    assert spec is not None
    rng = random.Random(20261203)
    rows = _rows(rng, 800)
    path = _ledger_with(tmp_path / "entries.db", [text for text, _ in rows])
    con = duckdb.connect(":memory:")
    sure = kept = 0
    for seq, (text, samples) in enumerate(rows, 1):
        _, groups, _, unsure = _carrow.read_checked_by_kind(
            path, seq - 1, seq, seq, GENESIS, 0b11000, {KIND: (0b11000, TYPED.fields, spec.native())}
        )
        ((_, count, _, _, outs, unnested),) = groups
        assert count == 1
        assert bool(unsure) == (not _sure(samples)), (seq, text)
        if unsure:
            assert outs is None and unnested is None
            continue
        _, ((_, _, raw_seqs, raw_columns, _, _),), _, _ = _carrow.read_checked_by_kind(
            path, seq - 1, seq, seq, GENESIS, 255
        )
        expected = _sql(con, SQL, native_table(1, raw_seqs, raw_columns))
        got = entries_table(unnested)
        assert got.schema == expected.schema, seq
        assert got.equals(expected), (seq, text, got.to_pylist(), expected.to_pylist())
        sure += 1
        kept += got.num_rows
    con.close()
    assert sure > 300 and kept > 150


def test_a_row_the_typed_parse_leaves_to_duckdb_has_no_entries(tmp_path: Path) -> None:
    """The entries are read only from rows whose typed fields were parsed: where those are not,
    neither is kept, and DuckDB parses both."""
    assert _carrow is not None and TYPED is not None
    spec = entries(SQL)
    assert spec is not None
    path = _ledger_with(
        tmp_path / "typed-unsure.db",
        ['{"samples":{"lmcache:hits":1},"x":"\\u0000"}', '{"samples":{"lmcache:hits":1},"x":"v"}'],
    )
    for seq, unsure_expected in ((1, True), (2, False)):
        _, ((_, _, _, _, outs, unnested),), _, unsure = _carrow.read_checked_by_kind(
            path, seq - 1, seq, seq, GENESIS, 0b11000, {KIND: (0b11000, TYPED.fields, spec.native())}
        )
        assert bool(unsure) == unsure_expected
        assert (outs is None, unnested is None) == (unsure_expected, unsure_expected)
        if not unsure_expected:
            assert entries_table(unnested).to_pylist() == [
                {"seq": 2, "name": "lm", "series": "", "value": 1.0}
            ]
