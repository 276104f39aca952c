"""Property-based tests (hypothesis): canonical JSON, digests, malformed imports."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import EventError, ImportFileError, Ledger, canonical_json, import_jsonl, new_id, open_ledger
from ledger._events import envelope_bytes, event_digest

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=25,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=8)
optional_ids = st.none() | st.text(min_size=1, max_size=12)


def _shuffled(value: Any, rng: random.Random) -> Any:
    """The same value with every object's keys in another insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@given(json_objects, st.randoms())
def test_canonical_json_ignores_key_order(value: dict[str, Any], rng: random.Random) -> None:
    assert canonical_json(_shuffled(value, rng)) == canonical_json(value)


@given(json_objects)
def test_canonical_json_round_trips_to_identical_bytes(value: dict[str, Any]) -> None:
    encoded = canonical_json(value)
    assert canonical_json(orjson.loads(encoded)) == encoded


@given(json_objects, optional_ids, optional_ids, st.randoms())
def test_envelope_bytes_is_canonical_json_of_the_envelope(
    data: dict[str, Any], run_id: str | None, block_id: str | None, rng: random.Random
) -> None:
    envelope = {
        "id": new_id(),
        "ts": "2026-01-01T00:00:00.000000Z",
        "kind": "note.added",
        "run_id": run_id,
        "block_id": block_id,
        "data": data,
    }
    data_json = canonical_json(data)
    assert envelope_bytes(
        envelope["id"], envelope["ts"], "note.added", run_id, block_id, data_json
    ) == canonical_json(_shuffled(envelope, rng))
    digest = event_digest(
        envelope["id"], envelope["ts"], "note.added", run_id, block_id, canonical_json(_shuffled(data, rng))
    )
    assert digest == event_digest(envelope["id"], envelope["ts"], "note.added", run_id, block_id, data_json)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_floats_shortest_round_trip(number: float) -> None:
    text = canonical_json(number).decode()
    assert float(text) == number and math.copysign(1, float(text)) == math.copysign(1, number)
    # Python's repr is the shortest round-trip form too: same decimal value, same digits.
    assert Decimal(text) == Decimal(repr(number))


@given(st.sampled_from([math.nan, math.inf, -math.inf]), json_objects, st.text(max_size=5))
def test_nan_and_infinity_refused(bad: float, value: dict[str, Any], key: str) -> None:
    with pytest.raises(EventError):
        canonical_json({**value, key: bad})
    with pytest.raises(EventError):
        canonical_json({"outer": [value, {"deep": bad}]})


def _good_line() -> bytes:
    return orjson.dumps(
        {
            "id": new_id(),
            "ts": "2026-01-01T00:00:00.000000Z",
            "kind": "note.added",
            "run_id": None,
            "block_id": None,
            "data": {"text": "ok"},
        }
    )


def _corrupt(kind: str, rng: random.Random) -> bytes:
    obj = orjson.loads(_good_line())
    if kind == "json":
        return _good_line()[: rng.randrange(1, 40)]
    if kind == "kind":
        obj["kind"] = rng.choice(["", "note", "nope.nope", 7])
    elif kind == "missing":
        del obj[rng.choice(["id", "ts", "kind", "run_id", "block_id", "data"])]
    elif kind == "type":
        obj["data"]["text"] = rng.choice([1, 2.5, None, [], {}, True])
    elif kind == "envelope":
        obj[rng.choice(["id", "ts"])] = rng.choice(["x", 5, None, "2026-13"])
    elif kind == "digest":
        obj["digest"] = f"{rng.getrandbits(256):064x}"
    elif kind == "nan":
        return _good_line().replace(b'"text":"ok"', b'"text":"ok","v":NaN')
    return orjson.dumps(obj)


@pytest.fixture(scope="module")
def empty_ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    # One ledger for every example: a rejected import writes nothing, so it stays empty.
    ledger = open_ledger(f"sqlite:///{tmp_path_factory.mktemp('props') / 'ledger.db'}")
    yield ledger
    ledger.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.integers(0, 30),
    st.integers(0, 5),
    st.sampled_from(["json", "kind", "missing", "type", "envelope", "digest", "nan"]),
    st.randoms(),
)
def test_malformed_import_rejected_whole(
    empty_ledger: Ledger, tmp_path: Path, before: int, after: int, kind: str, rng: random.Random
) -> None:
    path = tmp_path / "import.jsonl"
    lines = [_good_line() for _ in range(before)] + [_corrupt(kind, rng)]
    lines += [_good_line() for _ in range(after)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ImportFileError) as info:
        import_jsonl(empty_ledger, path)
    assert info.value.line == before + 1
    assert empty_ledger.count() == 0
