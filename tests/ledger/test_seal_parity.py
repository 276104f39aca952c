"""The native sealer (ledger/_cseal.c) against the Python one, the reference: byte-identical
canonical data, digests, chains and recorded events, and the same errors, over random data
(escapes, non-ASCII, floats of every magnitude, big integers, deep nesting, odd envelopes)."""

from __future__ import annotations

import string
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import GENESIS, EventError, NewEvent, new_id, utc_now
from ledger._events import _cseal, link, seal, seal_many
from ledger._vocabulary import KINDS

# Every control character, the two JSON specials, DEL, the line separators JavaScript
# escapes and orjson does not, and characters of two, three and four UTF-8 bytes.
awkward = st.sampled_from(
    [chr(c) for c in range(0x20)] + ['"', "\\", "/", "\x7f", "\u2028", "\u2029", "é", "€", "\U0001f600"]
)
texts = st.text(st.one_of(awkward, st.characters()), max_size=12)
floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1e6, max_value=1e6).map(lambda f: round(f, 6)),
    st.integers(-(10**9), 10**9).flatmap(lambda m: st.integers(0, 20).map(lambda k: m / 10**k)),
    st.sampled_from([0.0, -0.0, 1e-5, -1.5e-5, 1e-7, 1e15, 1e16, 1e-4, 9.999999999999999e-5, 5e-324]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.integers(),  # past 64 bits: both refuse alike
    floats,
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    texts,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(texts, inner, max_size=4),
    ),
    max_leaves=30,
)


@st.composite
def deep(draw: st.DrawFn) -> Any:
    """A value nested past the native path's limit and past orjson's, at times."""
    value: Any = draw(scalars)
    for _ in range(draw(st.integers(0, 300))):
        value = {draw(texts): value} if draw(st.booleans()) else [value]
    return value


names = st.one_of(st.none(), st.just(""), texts, st.text(string.ascii_letters, min_size=1, max_size=8))


@st.composite
def events(draw: st.DrawFn) -> NewEvent:
    """Mostly well-formed events of any kind, some with a required field off or an odd envelope."""
    kind = draw(st.sampled_from([*sorted(KINDS), "no.such.kind"]))
    data: dict[Any, Any] = draw(st.dictionaries(texts, values, max_size=6))
    for field, types in KINDS.get(kind, {}).items():
        if draw(st.integers(0, 9)) == 0:
            continue  # left out
        example = {str: "ON", int: 3, float: 0.5, bool: True, dict: {}, list: [], None: None}
        data[field] = example[draw(st.sampled_from(types))]
    if draw(st.integers(0, 9)) == 0:
        data[draw(st.sampled_from([1, (1, 2), None]))] = 1  # a non-string key
    if draw(st.booleans()):
        data["deep"] = draw(deep())
    odd = draw(st.integers(0, 19))
    return NewEvent(
        kind,
        data,
        run_id=draw(names),
        block_id=draw(names),
        id=new_id() if odd else draw(st.sampled_from(["NOT-A-UUID", new_id().upper(), 7])),
        ts=utc_now() if odd != 1 else draw(st.sampled_from(["2024-01-01", "٢٠٢٤-01-01T00:00:00.000000Z"])),
    )


def _outcome(function: Any, event: NewEvent) -> Any:
    try:
        sealed = function(event)
    except Exception as exc:  # the same error, type and words, on both paths
        return type(exc), str(exc)
    # Key order and value types of the recorded data too, not only equality.
    return sealed, orjson.dumps(sealed.data)


def _text_outcome(function: Any, event: NewEvent) -> Any:
    """What a seal without the parsed data must agree on: the error, or every field but the data."""
    try:
        return tuple(function(event)[:7])
    except Exception as exc:
        return type(exc), str(exc)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events())
def test_native_seal_matches_python(event: NewEvent) -> None:
    assert _outcome(lambda e: seal_many([e])[0], event) == _outcome(seal, event)
    # Unparsed (Ledger.extend): the same text, digest and errors, without the copy of the data.
    assert _text_outcome(lambda e: seal_many([e], parsed=False)[0], event) == _text_outcome(seal, event)


@pytest.mark.parametrize("field", ["run_id", "block_id"])
def test_a_name_with_a_lone_surrogate_is_refused_alike(field: str) -> None:
    """The failure that random names found once: Python's seal raised orjson's TypeError and the
    native one a UnicodeEncodeError. Both now raise the same EventError naming the field."""
    event = NewEvent("note.added", {"text": "t"}, **{field: "\ud800"})
    expected = _outcome(seal, event)
    assert expected[0] is EventError and expected[1].startswith(f"{field}: not valid Unicode text")
    assert _outcome(lambda e: seal_many([e])[0], event) == expected
    assert _text_outcome(lambda e: seal_many([e], parsed=False)[0], event) == expected
    with pytest.raises(EventError, match=field):
        seal_many([NewEvent("note.added", {"text": "a"}), event])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(texts, values, max_size=5), min_size=1, max_size=30), names)
def test_native_chain_matches_python(datas: list[dict[str, Any]], run_id: str | None) -> None:
    batch = [NewEvent("note.added", {**d, "text": "t"}, run_id=run_id or None) for d in datas]
    try:
        reference = [seal(e) for e in batch]
    except Exception as exc:
        with pytest.raises(type(exc)):
            seal_many(batch)
        return
    native = seal_many(batch)
    assert native == reference
    # After a genesis, or in the middle of a ledger (any 64 hex digits can be the last chain).
    start = (0, GENESIS) if len(batch) % 2 else (41, reference[0].digest)
    rows, recorded, chain = link(native, *start, native=True)
    expected_rows, expected_recorded, expected_chain = link(reference, *start, native=False)
    assert (rows, chain) == (expected_rows, expected_chain)
    assert recorded == expected_recorded
    assert [orjson.dumps(e.data) for e in recorded] == [orjson.dumps(e.data) for e in expected_recorded]
    # Without recorded events (Ledger.extend): the same rows and chain from unparsed seals.
    unparsed = seal_many(batch, parsed=False)
    assert [s[:7] for s in unparsed] == [s[:7] for s in reference]  # data: None where sealed natively
    assert link(unparsed, *start, native=True, events=False) == (expected_rows, None, expected_chain)
    assert link(reference, *start, native=False, events=False) == (expected_rows, None, expected_chain)


def test_native_sealer_is_there() -> None:
    assert _cseal is not None, "ledger/_cseal.c was not built: the tests above compare Python to itself"


@settings(max_examples=30, deadline=None)
@given(st.lists(texts, min_size=33, max_size=200, unique=True))
def test_wide_objects_sort_alike(keys: list[str]) -> None:
    """Past 32 keys the native path sorts another way (qsort): the same bytes still."""
    event = NewEvent("note.added", {"text": "t", **{key: index for index, key in enumerate(keys)}})
    assert _outcome(lambda e: seal_many([e])[0], event) == _outcome(seal, event)


def test_examples_of_both_outcomes() -> None:
    """One event the native path takes whole, one it hands over (NaN) and gets the same error for."""
    fine = NewEvent("note.added", {"text": "é\n\x00", "v": [1.5e-5, 2**64 - 1, None, {"b": 1, "a": 2}]})
    assert seal_many([fine]) == [seal(fine)]
    assert seal_many([fine], parsed=False) == [seal(fine)._replace(data=None)]  # no copy of the data
    refused = NewEvent("note.added", {"text": "x", "v": float("nan")})
    with pytest.raises(Exception, match="NaN") as native_error:
        seal_many([refused])
    with pytest.raises(Exception, match="NaN") as python_error:
        seal(refused)
    assert str(native_error.value) == str(python_error.value)
