"""The native parse of typed fields (ledger/_carrow.c, ledger/_typed.py) against DuckDB's
``json_transform``, which it stands in for: wherever the native parse says it is sure of a row,
its columns are DuckDB's, value for value and type for type; where it is not, DuckDB parses the
rows and the tables come out the same."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pytest

import ledger._analytics as analytics_module
from ledger import Ledger, NewEvent, open_ledger
from ledger._analytics import checked_source, derive_checked, derive_from_rows
from ledger._events import GENESIS
from ledger._row_sources import RowSource
from ledger._rows import SCHEMA, native_table
from ledger._snapshot_rows import _carrow
from ledger._typed import typed, typed_table
from reports._views import projections

KIND = "note.added"
STRUCTURE = {
    "s": "VARCHAR",
    "i": "BIGINT",
    "d": "DOUBLE",
    "b": "BOOLEAN",
    "j": "JSON",
    "p": {"m": "BIGINT", "t": "VARCHAR", "q": {"z": "DOUBLE"}},
    "z": "VARCHAR",
}
_SHAPE = json.dumps(STRUCTURE, separators=(",", ":"))
SQL = (
    f"SELECT seq, run_id, block_id, unnest(json_transform(data, '{_SHAPE}')) "
    f"FROM events WHERE kind = '{KIND}'"
)
ENVELOPE = pa.schema([SCHEMA.field("seq"), SCHEMA.field("run_id"), SCHEMA.field("block_id")])

# Values of every JSON type and the awkward ones: escapes, non-ASCII, floats of every form,
# integers near and past 64 bits, nulls, nesting, strings that look like numbers.
STRINGS = [
    "",
    "plain",
    'quote " back\\slash / slash',
    "\u00e9\u4e2d \U0001f600",
    "\n\t\r\b\f",
    "\x00\x01\x0b\x1f\x7f",
    "\u2028\u2029\ufeff",
    "12",
    "1.5",
    "true",
    "null",
]
NUMBERS = [
    0,
    -1,
    7,
    123456789012345678,
    -123456789012345678,
    1234567890123456789,
    9223372036854775807,
    -9223372036854775808,
    18446744073709551615,
    0.0,
    -0.0,
    0.5,
    1.5,
    100.0,
    -2.25,
    1e-7,
    1e16,
    1e21,
    1.5e300,
    5e-324,
    0.1 + 0.2,
    123456789012345.6,
]
SCALARS: list[object] = [*STRINGS, *NUMBERS, True, False, None]


def _value(rng: random.Random, depth: int = 0) -> object:
    pick = rng.random()
    if depth < 3 and pick < 0.15:
        return {
            rng.choice(["a", "b", "m", "q", "t", "z", "\u00e9", "k\nk"]): _value(rng, depth + 1)
            for _ in range(3)
        }
    if depth < 3 and pick < 0.25:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return rng.choice(SCALARS)


def _textual(rng: random.Random, depth: int = 0) -> object:
    """A value written back as JSON text whole (no floats, short integers)."""
    pick = rng.random()
    if depth < 3 and pick < 0.2:
        return {
            rng.choice(["a", "b", "m", "\u00e9", "k\nk", '"']): _textual(rng, depth + 1) for _ in range(3)
        }
    if depth < 3 and pick < 0.35:
        return [_textual(rng, depth + 1) for _ in range(rng.randrange(4))]
    return rng.choice([*STRINGS, 0, -1, 7, 123456789012345678, True, False, None])


def _of_type(rng: random.Random, key: str) -> object:
    """Mostly a value of the field's own type; now and then any value at all."""
    if rng.random() < 0.2:
        return _value(rng)
    if key in ("i", "m"):
        return rng.choice([0, -1, 7, 123456789012345678, -123456789012345678, None])
    if key == "d":
        return rng.choice([*NUMBERS, None])
    if key == "b":
        return rng.choice([True, False, None])
    return _textual(rng)


def _canonical_rows(rng: random.Random, count: int) -> list[str]:
    rows = []
    for _ in range(count):
        data = {
            key: _of_type(rng, key)
            for key in ["s", "i", "d", "b", "j", "z", "extra", "S"]
            if rng.random() < 0.7
        }
        if rng.random() < 0.8:  # a STRUCT's usual shape
            data["p"] = {k: _of_type(rng, k) for k in ["m", "t", "other"] if rng.random() < 0.7}
            if rng.random() < 0.6:
                data["p"]["q"] = {"z": rng.choice([*NUMBERS, None, "x"])}
        elif rng.random() < 0.5:
            data["p"] = _value(rng)
        rows.append(orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode())
    return rows


# Written by hand: what canonical JSON never holds, and what DuckDB refuses or reads its own way.
HANDWRITTEN: list[str | bytes] = [
    "{}",
    "[]",
    "null",
    '"text"',
    '{"s":"a","i":1}',  # keys out of order
    '{"i":1,"i":2}',  # a key twice
    '{"i": 1}',  # white space
    ' {"i":1}',
    '{"i":1} ',
    '{"i":01}',
    '{"i":1.}',
    '{"i":-}',
    '{"i":1e}',
    '{"d":1E5}',
    '{"d":1e+5}',
    '{"d":-0}',
    '{"i":18446744073709551616}',
    '{"d":18446744073709551616}',
    '{"j":[18446744073709551616]}',
    '{"d":1.50}',
    '{"j":1.50}',
    '{"j":[1.0,2]}',
    '{"j":{"b":1,"a":2}}',
    '{"j":"\\u0041"}',
    '{"j":"\\/"}',
    '{"j":"\\u001f"}',
    '{"j":"\\u001F"}',
    '{"j":"\\ud83d\\ude00"}',
    '{"s":"\\ud83d\\ude00"}',
    '{"s":"\\ud83d"}',
    '{"s":"\\ude00x"}',
    '{"s":"\\u0000"}',
    '{"s":"\\u00e9\\/\\"\\\\"}',
    '{"s":"tab\there"}',  # a raw control
    b'{"s":"\xff"}',
    b'{"s":"\xc3"}',
    b'{"s":"\xed\xa0\x80"}',  # an encoded surrogate
    '{"s":"\u00ff\u00e9"}',
    '{"s":"abc}',
    '{"s":tru}',
    '{"b":"true"}',
    '{"b":1}',
    '{"i":"7"}',
    '{"i":1.0}',
    '{"i":true}',
    '{"p":5}',
    '{"p":[]}',
    '{"p":{"m":1,"m":2}}',
    '{"p":{"q":null}}',
    '{"p":{"q":{}}}',
    '{"p":null}',
    '{"\\u0073":"x"}',  # an escaped key that is "s"
    '{"S":"x"}',  # another case
    '{"s":"x",}',
    '{"s":"x"',
    '{"j":[1,]}',
    '{"j":' + "[" * 40 + "]" * 40 + "}",
    '{"z":{"n":[1,{"a":null}],"t":"\\n"}}',
]


def _ledger_with(path: Path, texts: list[str | bytes]) -> str:
    """A SQLite ledger whose rows of KIND hold ``texts`` as their data (bytes: stored as they are,
    valid UTF-8 or not), digests left as they were: the check fails and the parse still runs,
    and it is the parse that is compared here."""
    led = open_ledger(f"sqlite:///{path}")
    led.append_many([NewEvent(KIND, {"text": "t", "n": n}) for n in range(len(texts))])
    led.close()
    with sqlite3.connect(path) as con:
        # Past the append-only triggers, as a writer of the file can.
        for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            con.execute(f'DROP TRIGGER "{name}"')
        con.executemany(
            "UPDATE events SET data = CAST(? AS TEXT) WHERE seq = ?",
            [(text if isinstance(text, bytes) else text.encode(), seq + 1) for seq, text in enumerate(texts)],
        )
    return str(path)


def _sql(con: duckdb.DuckDBPyConnection, sql: str, table: pa.Table) -> pa.Table:
    con.register("events", table)
    try:
        return con.sql(sql).to_arrow_table()
    finally:
        con.unregister("events")


def _compare(path: str, count: int) -> tuple[int, list[int]]:
    """Each row read alone, parsed natively and by DuckDB: the number of rows the native parse was
    sure of (their tables must be equal, column types included) and the seqs it left to DuckDB."""
    spec = typed(SQL)
    assert spec is not None and spec.kind == KIND
    con = duckdb.connect(":memory:")
    sure, unsure = 0, []
    for seq in range(1, count + 1):
        _, groups, _, not_sure = _carrow.read_checked_by_kind(
            path, seq - 1, seq, seq, GENESIS, 255, {KIND: (0b11000, spec.fields)}
        )
        ((kind, rows, seqs, columns, outs, entries),) = groups
        assert entries is None  # no entries asked for
        assert kind == KIND and rows == 1
        if not_sure:
            assert outs is None
            unsure.append(seq)
            continue
        _, ((_, _, raw_seqs, raw_columns, none, _),), _, plain_unsure = _carrow.read_checked_by_kind(
            path, seq - 1, seq, seq, GENESIS, 255
        )
        assert none is None and not plain_unsure
        try:
            expected = _sql(con, SQL, native_table(1, raw_seqs, raw_columns))
        except duckdb.Error as exc:
            raise AssertionError(f"seq {seq}: DuckDB refuses what the native parse took") from exc
        got = _sql(
            con, "SELECT * FROM events", typed_table(spec, native_table(rows, seqs, columns, ENVELOPE), outs)
        )
        assert got.schema == expected.schema, seq
        assert got.equals(expected), (seq, got.to_pylist(), expected.to_pylist())
        sure += 1
    con.close()
    return sure, unsure


def _no_nul(value: object) -> bool:
    """No string or key holds U+0000 (left to DuckDB everywhere)."""
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, dict):
        return all(_no_nul(k) and _no_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_no_nul(v) for v in value)
    return True


def _as_text(value: object) -> bool:
    """A value the parse writes back as JSON text: no float, no integer of 19 digits or more."""
    if isinstance(value, float) or (
        isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18
    ):
        return False
    if isinstance(value, dict):
        return all(_no_nul(k) and _as_text(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_as_text(v) for v in value)
    return _no_nul(value)


def _sure_of(value: object, spec: object) -> bool:
    """Whether the native parse takes ``value`` for a field of ``spec`` (canonical input)."""
    if value is None:
        return True
    if isinstance(spec, dict):
        return isinstance(value, dict) and _object_sure(value, spec)
    short_int = isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**18
    if spec == "BIGINT":
        return short_int
    if spec == "DOUBLE":
        # strtod refuses what underflows (ERANGE); DuckDB would give the subnormal.
        return short_int or (
            isinstance(value, float) and (value == 0 or abs(value) >= 2.2250738585072014e-308)
        )
    if spec == "BOOLEAN":
        return isinstance(value, bool)
    return _as_text(value)  # VARCHAR, JSON


def _object_sure(data: dict[str, object], structure: dict[str, object]) -> bool:
    for key, value in data.items():
        if not all(" " <= c <= "~" and c not in '"\\' for c in key):
            return False  # a key of other than plain ASCII is DuckDB's to match
        if key in structure:
            if not _sure_of(value, structure[key]):
                return False
        elif not _no_nul(value):
            return False
    return True


def test_canonical_rows_are_parsed_as_duckdb_parses_them(tmp_path: Path) -> None:
    """Random canonical rows: DuckDB's columns wherever the parse is sure, and it is sure of
    exactly the rows its rules take (floats and long integers written back as text, U+0000,
    escaped keys and values of another type than the field's are DuckDB's)."""
    rng = random.Random(20261201)
    texts = _canonical_rows(rng, 1500)
    path = _ledger_with(tmp_path / "canonical.db", list(texts))
    sure, unsure = _compare(path, len(texts))
    expected_unsure = [
        seq for seq, text in enumerate(texts, 1) if not _object_sure(json.loads(text), STRUCTURE)
    ]
    assert unsure == expected_unsure
    assert sure > 250


def test_typed_table_takes_an_envelope_of_one_chunk_or_several(tmp_path: Path) -> None:
    """The native read's envelope is one chunk, whose arrays the typed table wraps as they are
    (no copy); an envelope of several chunks is joined first. Both give the same table, and the
    one-chunk table shares the envelope's buffers."""
    count = 40
    path = tmp_path / "chunks.db"
    led = open_ledger(f"sqlite:///{path}")
    led.append_many(
        [NewEvent(KIND, {"s": f"row {n}", "i": n, "text": "t"}, run_id=f"run-{n % 3}") for n in range(count)]
    )
    led.close()
    spec = typed(SQL)
    assert spec is not None
    _, groups, _, not_sure = _carrow.read_checked_by_kind(
        str(path), 0, count, 1, GENESIS, 255, {KIND: (0b11000, spec.fields)}
    )
    assert not not_sure
    ((_, rows, seqs, columns, outs, _),) = groups
    envelope = native_table(rows, seqs, columns, ENVELOPE)
    assert all(envelope.column(name).num_chunks == 1 for name in ENVELOPE.names)
    whole = typed_table(spec, envelope, outs)
    split = pa.Table.from_batches([*envelope.slice(0, 15).to_batches(), *envelope.slice(15).to_batches()])
    assert all(split.column(name).num_chunks == 2 for name in ENVELOPE.names)
    joined = typed_table(spec, split, outs)
    assert whole.equals(joined) and whole.schema == joined.schema

    def data(table: pa.Table, name: str) -> int:
        return int(table.column(name).chunk(0).buffers()[-1].address)

    for name in ENVELOPE.names:
        assert data(whole, name) == data(envelope, name)  # wrapped, not copied
        assert data(joined, name) != data(split, name)  # joined into new buffers
    assert whole.column("seq").to_pylist() == list(range(1, count + 1))
    assert whole.column("run_id").to_pylist() == [f"run-{n % 3}" for n in range(count)]
    assert whole.column("s").to_pylist() == [f"row {n}" for n in range(count)]


def test_single_values_of_each_type(tmp_path: Path) -> None:
    """Every scalar alone in every typed field, nested too."""
    texts = []
    for key in ["s", "i", "d", "b", "j", "z", "other"]:
        for value in SCALARS:
            texts.append(orjson.dumps({key: value}).decode())
            texts.append(orjson.dumps({"p": {"m": value, "q": {"z": value}, "t": value}}).decode())
            texts.append(orjson.dumps({key: [value, {"k": value}]}).decode())
    path = _ledger_with(tmp_path / "single.db", list(texts))
    sure, unsure = _compare(path, len(texts))
    assert unsure == [
        seq for seq, text in enumerate(texts, 1) if not _object_sure(json.loads(text), STRUCTURE)
    ]
    assert sure > 200


def test_handwritten_rows_are_parsed_as_duckdb_parses_them_or_left_to_it(tmp_path: Path) -> None:
    """JSON canonical form never holds, and JSON DuckDB refuses: parsed as DuckDB parses it, or
    left to DuckDB (which then refuses it as before)."""
    path = _ledger_with(tmp_path / "handwritten.db", HANDWRITTEN)
    sure, unsure = _compare(path, len(HANDWRITTEN))
    taken = [text for seq, text in enumerate(HANDWRITTEN, 1) if seq not in unsure]
    assert sure == len(taken)
    must = [
        "{}",
        '{"s":"\\u00e9\\/\\"\\\\"}',
        '{"p":{"q":null}}',
        '{"p":{"q":{}}}',
        '{"p":null}',
        '{"S":"x"}',
        '{"j":"\\u001f"}',
        '{"z":{"n":[1,{"a":null}],"t":"\\n"}}',
        '{"d":1E5}',
        '{"d":1e+5}',
        '{"d":1.50}',
        '{"s":"\\ud83d\\ude00"}',
    ]
    assert set(must) <= set(taken), set(must) - set(taken)
    refused = ['{"s":"abc}', '{"s":tru}', '{"s":"x",}', '{"j":[1,]}', "null", "[]", b'{"s":"\xff"}']
    assert not set(refused) & set(taken)


@pytest.fixture
def awkward(sqlite_url: str) -> Ledger:
    """A sim-shaped study and, among its rows, request.sent rows the native parse leaves to DuckDB
    (U+0000 in a string, an integer of 20 digits in JSON) and some it parses (escapes, non-ASCII,
    nulls, integers where text is asked for, an empty object for a STRUCT)."""
    from ledger import read_jsonl
    from tests._synthetic import generate

    events, _ = generate()
    led = open_ledger(sqlite_url)
    led.append_sealed(read_jsonl(iter(orjson.dumps(e) for e in events)))
    led.append_many(
        [
            NewEvent(
                "request.sent",
                {
                    # U+0000 and an integer past 18 digits are left to DuckDB; the rest is parsed natively.
                    "request_id": f'r{i}\u00e9\n"' + ("\x00" if i % 4 == 0 else ""),
                    "gpu": {"index": 10**19 if i % 5 == 0 else i, "name": None},
                    "replica": i if i % 2 else f"replica-{i}",
                    "workload": "w\u4e2d",
                    "step": "cold",
                    "warmup": i % 2 == 0,
                    "payload_sha256": "0" * 64,
                    "namespace": "ns",
                    "nominal_tokens": None if i % 3 == 0 else 1024,
                    "params": {"max_tokens": i} if i % 2 else {},
                    "turn": i if i % 3 else None,
                },
            )
            for i in range(9)
        ]
        # Scrapes whose samples the native read unnests (escaped and non-ASCII labels, nulls, a
        # bare counter, other metrics of every type) and some it leaves to DuckDB (a counter's value
        # as text, or true).
        + [
            NewEvent(
                "metrics.scraped",
                {
                    "replica": i % 2,
                    "endpoint": "http://127.0.0.1:8000",
                    "phase": "before" if i % 2 else "after",
                    "request_id": f"scrape-{i}",
                    "window": None,
                    "error": None,
                    "samples": samples,
                },
            )
            for i, samples in enumerate(
                [
                    {
                        'vllm:prefix_cache_hits_total{engine="0",model="m\u00e9 "q""}': 12.5,
                        "vllm:prefix_cache_hits_total": None,
                        'vllm:prefix_cache_queries_total{engine="\u4e2d"}': 3,
                        "vllm:prefix_cache_hits_totalx": 1,
                        'other{a="b"}': [1, {"x": None}],
                        "zz": "text",
                    },
                    {'vllm:external_prefix_cache_hits_total{e="1"}': 1e-7, "w": True},
                    {"vllm:prefix_cache_hits_total": "12"},
                    {"vllm:prefix_cache_queries_total": True},
                    {},
                ]
            )
        ]
    )
    return led


class _Counting:
    """A row source (ledger/_row_sources.py), counting the reads its typed parse was sure of and
    those it was not."""

    def __init__(self, source: RowSource) -> None:
        self.source = source
        self.sure = self.unsure = 0

    def by_kind(
        self,
        after: int,
        until: int,
        expected: int,
        previous: str,
        mask: int,
        typed: dict[str, Any] | None,
        scope: Any = None,
    ) -> tuple[Any, ...]:
        result = self.source.by_kind(after, until, expected, previous, mask, typed, scope)
        if typed is not None:
            if result[3]:
                self.unsure += 1
            else:
                self.sure += 1
        return result

    def scan(self, after: int, until: int, expected: int, previous: str) -> tuple[int, int, int, int, str]:
        return self.source.scan(after, until, expected, previous)

    def stored_chains(self, seqs: list[int]) -> dict[int, str]:
        return self.source.stored_chains(seqs)


def _checked(ledger: Ledger) -> tuple[int, RowSource, list[str]]:
    """The head seq, the checked read's source and the projections' names."""
    head = ledger.head()
    assert head is not None
    path = checked_source(ledger, projections())
    assert path is not None
    return head.seq, path, list(projections())


def _tables(con: duckdb.DuckDBPyConnection, names: list[str], query: str = "SELECT * FROM") -> dict[str, Any]:
    return {n: con.execute(f'{query} "{n}"').fetchall() for n in names}


def test_checked_derivation_with_rows_left_to_duckdb(
    awkward: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    last, path, names = _checked(awkward)
    plain_con = duckdb.connect(":memory:")
    derive_from_rows(plain_con, awkward, projections(), last)
    expected, types = _tables(plain_con, names), _tables(plain_con, names, "DESCRIBE")
    for chunk in (5, 64, last):
        monkeypatch.setattr(analytics_module, "_CHUNK", chunk)
        counting = _Counting(path)
        con = duckdb.connect(":memory:")
        assert derive_checked(con, counting, projections(), last) is not None
        # Parts parsed natively and parts read again for DuckDB, side by side in one derivation.
        assert counting.unsure > 0 and (counting.sure > 0 or chunk == last)
        assert _tables(con, names) == expected and _tables(con, names, "DESCRIBE") == types
        con.close()


def test_type_codes_are_the_native_parse_s() -> None:
    """ledger/_typed.py numbers the types as the built reader does."""
    from ledger import _typed

    assert _carrow is not None
    assert _typed._TYPES == _carrow.FIELD_TYPES


class _OlderBuild:
    """The reader as built before its typed fields: no FIELD_TYPES, six arguments at most,
    groups of four and no ``unsure`` at the end."""

    def __getattr__(self, name: str) -> object:
        if name == "FIELD_TYPES":
            raise AttributeError(name)
        return getattr(_carrow, name)

    def read_checked_by_kind(self, *args: object) -> object:
        assert len(args) <= 6, "an older build takes no typed fields"
        rows, groups, check, _ = _carrow.read_checked_by_kind(*args)
        return rows, [group[:4] for group in groups], check


def test_a_build_older_than_the_typed_fields_derives_the_same(
    awkward: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until the reader is built again, the checked read is used as before and DuckDB parses."""
    last, path, names = _checked(awkward)
    expected_con = duckdb.connect(":memory:")
    assert derive_checked(expected_con, path, projections(), last) is not None
    expected = _tables(expected_con, names)
    monkeypatch.setattr(analytics_module, "_carrow", _OlderBuild())
    monkeypatch.setattr(analytics_module, "_CHUNK", 64)
    assert checked_source(awkward, projections()) == path
    con = duckdb.connect(":memory:")
    assert derive_checked(con, path, projections(), last) is not None
    assert _tables(con, names) == expected


def test_columns_of_many_megabytes_are_read_whole(tmp_path: Path) -> None:
    """One read of rows whose columns run to megabytes (their buffers grown many times over):
    every row checked, its text columns the stored ones, and its typed fields DuckDB's, value for
    value."""
    rng = random.Random(20261204)
    count = 2000
    events = [
        NewEvent(
            KIND,
            {
                "text": f"note {n}",
                "s": "".join(rng.choice(STRINGS[:5]) for _ in range(300)) + f" #{n}",
                "i": n,
                "d": n / 7,
                "b": n % 2 == 0,
                "j": [n, {"k": "v" * (n % 50)}],
                "p": {"m": -n, "t": "\u00e9" * (n % 9), "q": {"z": n / 3}},
            },
            run_id=f"run-{n % 13}",
        )
        for n in range(count)
    ]
    path = tmp_path / "large.db"
    led = open_ledger(f"sqlite:///{path}")
    led.append_many(events)
    head = led.head()
    led.close()
    assert head is not None and head.seq == count
    spec = typed(SQL)
    assert spec is not None and _carrow is not None
    rows, ((_, kind_rows, seqs, columns, outs, _),), check, not_sure = _carrow.read_checked_by_kind(
        str(path), 0, count, 1, GENESIS, 255, {KIND: (0b11000, spec.fields)}
    )
    assert (rows, kind_rows, not_sure) == (count, count, False)
    assert check[0] == _carrow.OK and check[3:] == (head.seq, head.chain)
    _, ((_, _, raw_seqs, raw_columns, _, _),), raw_check, _ = _carrow.read_checked_by_kind(
        str(path), 0, count, 1, GENESIS, 255
    )
    assert raw_check == check
    plain = native_table(count, raw_seqs, raw_columns)
    assert plain["data"].nbytes > 4 << 20  # 64 KiB at first: doubled seven times and more
    with sqlite3.connect(path) as con:
        stored = con.execute("SELECT seq, id, data, chain FROM events ORDER BY seq").fetchall()
    assert list(zip(*(plain[c].to_pylist() for c in ("seq", "id", "data", "chain")), strict=True)) == stored
    duck = duckdb.connect(":memory:")
    parsed = typed_table(spec, native_table(count, seqs, columns, ENVELOPE), outs)
    got = _sql(duck, "SELECT * FROM events", parsed)
    expected = _sql(duck, SQL, plain)
    assert got.schema == expected.schema
    assert got.equals(expected)
    duck.close()
