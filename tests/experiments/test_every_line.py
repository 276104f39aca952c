"""Every-line questions (``asked_lines=every``, and ``dense`` over a stream with a value line in
every chunk): fixtures, runs, the audit's reading of their answers, and the wrong chunks that only
they see."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from experiments import fixture_text
from experiments.fixtures import FixtureFactory
from experiments.targets.sim import SimConfig, count_tokens, render_chat
from ledger import open_ledger
from reports import audit, open_source

from .._cli import ledger_cli, param_args
from .conftest import SMALL, local_tokens


def test_the_asked_names_are_the_spot_lines_or_every_value_line() -> None:
    k = 1000
    assert fixture_text.asked_names(k) == fixture_text.asked_names(k, "spot")
    assert fixture_text.asked_names(k, "spot") == ["value_000", "value_012", "end_value"]
    every = fixture_text.asked_names(k, "every")
    assert every == [*fixture_text.marks(k), "end_value"]
    # One name a value line: line i is a value line where line() writes one.
    assert len(every) - 1 == sum(fixture_text.line("k", i).startswith("value_") for i in range(k))
    dense = fixture_text.asked_names(k, "dense")
    assert dense == [*fixture_text.marks(k, fixture_text.DENSE_EVERY), "end_value"]
    every_dense = fixture_text.DENSE_EVERY
    assert len(dense) - 1 == sum(
        fixture_text.line("k", i, every_dense).startswith("value_") for i in range(k)
    )
    assert len(dense) > 3 * len(every)
    with pytest.raises(ValueError, match="asked lines must be one of spot, every, dense, got 'all'"):
        fixture_text.asked_names(k, "all")


@pytest.mark.parametrize("asked", ["every", "dense"])
def test_every_line_fixtures_ask_every_value_line_and_know_their_answers_length(asked: str) -> None:
    async def build() -> list[Any]:
        every = FixtureFactory(local_tokens, asked_lines=asked)
        spot = FixtureFactory(local_tokens)
        return [
            await every.fixture("314159:micro:0", 4000),
            await every.fixture("314159:micro:0", 16000),
            await spot.fixture("314159:micro:0", 16000),
        ]

    small, large, spot = asyncio.run(build())
    for fx in (small, large):
        assert abs(fx.prompt_tokens - fx.nominal_tokens) <= 8
        names = [*fixture_text.marks(fx.lines, fixture_text.marks_every(asked)), "end_value"]
        assert list(fx.expected) == names and len(names) > 3
        assert all(fx.expected[n] == fixture_text.value(fx.key, n) for n in names[:-1])
        assert fx.question == fixture_text.question(names)
        # The answer's own tokens, and at most the assistant turn's few template tokens more.
        alone = count_tokens(fx.expected_json)
        assert fx.answer_tokens is not None and alone <= fx.answer_tokens <= alone + 8
        assert fx.answer_limit is not None and fx.answer_limit > fx.answer_tokens
        assert fx.answer_chars is not None and fx.answer_chars > len(fx.expected_json)
        assert fx.event_data("ns")["asked_lines"] == asked
        assert fx.event_data("ns")["answer_tokens"] == fx.answer_tokens
    assert large.answer_tokens > 3 * small.answer_tokens  # it grows with the prompt
    # The seed's question is another fixture: its own id, three names, no answer length.
    assert spot.fixture_id != large.fixture_id and len(spot.expected) == 3
    assert spot.answer_tokens is None and spot.answer_limit is None and spot.answer_chars is None
    assert "answer_tokens" not in spot.event_data("ns") and spot.event_data("ns")["asked_lines"] == "spot"
    with pytest.raises(ValueError, match="asked_lines must be one of spot, every, dense"):
        FixtureFactory(local_tokens, asked_lines="most")


def _rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def _run(db: Path, asked: str, **params: Any) -> str:
    result = ledger_cli(
        "run", "screening", "--db", f"sqlite:///{db}", "--no-progress",
        *param_args({**SMALL, **params, "asked_lines": asked}),
    )  # fmt: skip
    assert result.exit_code in (0, 1), result.output
    (run,) = [r for (r,) in _rows(db, "SELECT run_id FROM events WHERE kind = 'run.started'")]
    return str(run)


# What the report's Markdown says of a run that asked each longer question.
_SAID = {"every": "every value line asked", "dense": "dense value lines, every one asked"}


@pytest.mark.parametrize("asked", ["every", "dense"])
def test_an_every_line_run_sends_room_for_its_answers_keeps_them_whole_and_the_audit_reads_them(
    tmp_path: Path, asked: str
) -> None:
    db = tmp_path / "ledger.db"
    _run(db, asked)
    fixtures = {
        fid: json.loads(data)
        for fid, data in _rows(
            db, "SELECT json_extract(data, '$.fixture_id'), data FROM events WHERE kind = 'fixture.created'"
        )
    }
    assert {f["asked_lines"] for f in fixtures.values()} == {asked}
    assert max(len(f["expected"]) for f in fixtures.values()) > 3
    (plan,) = _rows(
        db, "SELECT json_extract(data, '$.thresholds.asked_lines') FROM events WHERE kind = 'plan.registered'"
    )
    assert plan == (asked,)

    led = open_ledger(f"sqlite:///{db}")
    src = open_source(led, tmp_path / "snap", verify=True)
    try:
        src.rederive()
        rows = src.tuples(
            """SELECT r.request_id, q.fixture_id, q.max_tokens, r.answer_text IS NOT NULL,
                      r.recorded_passed, r.derived_passed
               FROM kv_rederived r JOIN kv_requests q USING (request_id)
               WHERE r."check" = 'exact_values'"""
        )
        findings = audit(src)
    finally:
        src.close()
        led.close()
    assert rows, "the run checked exact values"
    for _request, fid, max_tokens, whole, recorded, derived in rows:
        limit = fixtures[fid]["answer_tokens"]
        # The limit the fixture's answer needs (Fixture.answer_limit), or the run's 64 where more.
        assert max_tokens == max(64, limit + limit // 8 + 16)
        assert whole, "the whole answer is in the ledger, read by the audit itself"
        assert recorded is True and derived is True
    assert not [f for f in findings if f.code == "assertion-inconsistent"]
    # The report says what the run's exact-value checks asked.
    report = ledger_cli("report", "--db", f"sqlite:///{db}", "--json")
    assert [r["asked_lines"] for r in json.loads(report.output)["runs"]] == [asked]
    markdown = ledger_cli("report", "--db", f"sqlite:///{db}", "--markdown").output
    assert f"(screening, OFF–ON–ON–OFF, {_SAID[asked]})" in markdown


def _failed_cross_exact(db: Path) -> list[tuple[str, list[str]]]:
    """Each failed exact-value check of a cross-replica reuse: its fixture and the names it got wrong."""
    return [
        (fid, json.loads(mismatched))
        for fid, mismatched in _rows(
            db,
            """SELECT json_extract(q.data, '$.fixture_id'), json_extract(a.data, '$.mismatched')
               FROM events a JOIN events q ON q.kind = 'request.sent'
                AND json_extract(q.data, '$.request_id') = json_extract(a.data, '$.request_id')
               WHERE a.kind = 'assertion.evaluated' AND json_extract(a.data, '$.check') = 'exact_values'
                 AND json_extract(q.data, '$.step') = 'cross' AND NOT json_extract(a.data, '$.passed')""",
        )
    ]


def _token_of(content: str, name: str) -> int:
    """Where a value line's value starts, in the sim's tokens of the chat prompt."""
    rendered = render_chat(
        [{"role": "user", "content": content}], add_generation_prompt=True, enable_thinking=False
    )
    return count_tokens(rendered[: rendered.index(f"\n{name} = ") + len(f"\n{name} = ")])


def test_a_wrong_chunk_outside_the_spot_lines_is_seen_only_by_every_line_questions(tmp_path: Path) -> None:
    """One chunk of each cross-replica load comes in wrong (``unordered-copy:chunk=2``): HTTP 200,
    the hits counted in full. The seed's question passes every cross-replica reuse over it (it
    sees the fault only on the next local reuse, whose later blocks the sim computed over the
    wrong one); the every-line question fails there, naming a value line that lies in that chunk."""
    shape = {"sizes": [8000], "workloads": ["micro"], "sim_fault": "unordered-copy:chunk=2"}
    failed: dict[str, list[tuple[str, list[str]]]] = {}
    for asked in ("spot", "every"):
        db = tmp_path / f"{asked}.db"
        _run(db, asked, **shape)
        failed[asked] = _failed_cross_exact(db)
        full = _rows(
            db,
            """SELECT json_extract(data, '$.passed') FROM events
               WHERE kind = 'assertion.evaluated' AND json_extract(data, '$.check') = 'full_prefix_hit'""",
        )
        assert full and all(passed for (passed,) in full)  # the counters say every load was whole
        launched = "SELECT json_extract(data, '$.config.chunk_size') FROM events WHERE kind = ?"
        (chunk_size,) = {c for (c,) in _rows(db, launched, "deployment.launched")}
        created = "SELECT json_extract(data, '$.fixture_id'), json_extract(data, '$.key') FROM events"
        keys = dict(_rows(db, created + " WHERE kind = ?", "fixture.created"))
    assert failed["spot"] == []
    assert failed["every"], "the every-line question sees the wrong chunk"

    async def content(key: str) -> str:
        return (await FixtureFactory(local_tokens, asked_lines="every").fixture(key, 8000)).content

    for fid, names in failed["every"]:
        text = asyncio.run(content(keys[fid]))
        assert names and {_token_of(text, n) // chunk_size for n in names} == {2}


def test_a_wrong_chunk_holding_no_value_line_is_seen_only_by_dense_questions(tmp_path: Path) -> None:
    """A chunk of the every-line fixture that holds no value line, made wrong in each cross-replica
    load: the every-line question passes every cross-replica reuse over it, the dense one (a value
    line in every chunk) fails there, naming value lines that lie in that chunk."""
    size, key, chunk_size = 8000, "314159:micro:0", SimConfig().chunk_size  # SMALL's micro chain

    async def fixture(asked: str) -> Any:
        return await FixtureFactory(local_tokens, asked_lines=asked).fixture(key, size)

    def chunks(fx: Any) -> set[int]:
        return {_token_of(fx.content, n) // chunk_size for n in list(fx.expected)[:-1]}

    every, dense = asyncio.run(fixture("every")), asyncio.run(fixture("dense"))
    held = chunks(every)
    bare = min(set(range(1, max(held))) - held)  # inside the prompt, and no value line there
    assert bare in chunks(dense)
    failed: dict[str, list[tuple[str, list[str]]]] = {}
    for asked in ("every", "dense"):
        db = tmp_path / f"{asked}.db"
        _run(db, asked, sizes=[size], workloads=["micro"], sim_fault=f"unordered-copy:chunk={bare}")
        launched = "SELECT json_extract(data, '$.config.chunk_size') FROM events WHERE kind = ?"
        assert {c for (c,) in _rows(db, launched, "deployment.launched")} == {chunk_size}
        failed[asked] = _failed_cross_exact(db)
    assert failed["every"] == []
    assert failed["dense"], "the dense question sees the wrong chunk"
    for _fid, names in failed["dense"]:
        assert names and {_token_of(dense.content, n) // chunk_size for n in names} == {bare}
