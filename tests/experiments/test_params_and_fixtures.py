"""Params parsing, bad usage (exit 2, nothing written), fixtures and namespaces."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from experiments._params import ParamError, check_params, parse_param
from experiments.fixtures import FixtureFactory, make_namespace

from .._cli import ledger_cli
from .conftest import local_tokens


def test_param_values_are_json_literals_else_strings() -> None:
    assert parse_param("n=4") == ("n", 4)
    assert parse_param("x=0.5") == ("x", 0.5)
    assert parse_param("on=true") == ("on", True)
    assert parse_param("sizes=[8000,32000]") == ("sizes", [8000, 32000])
    assert parse_param("fault=namespace-leak") == ("fault", "namespace-leak")
    assert parse_param("tag=null") == ("tag", None)
    with pytest.raises(ParamError):
        parse_param("novalue")


def test_check_params_names_the_culprit() -> None:
    with pytest.raises(ParamError, match="bogus"):
        check_params({"n": 1}, {"bogus": 2}, {})
    with pytest.raises(ParamError, match="n must be int"):
        check_params({"n": 1}, {"n": "three"}, {})
    assert check_params({"x": 1.0}, {"x": 2}, {}) == {"x": 2}


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "screening", "--param", "bogus=1"], "bogus"),
        (["run", "screening", "--param", "chains=two"], "chains"),
        (["run", "screening", "--param", 'workloads=["micro","nope"]'], "nope"),
        (["run", "screening", "--param", "sim_fault=no-such-fault"], "no-such-fault"),
        (["run", "no_such_experiment"], "no_such_experiment"),
        (["run", "./missing.py"], "missing.py"),
        (["run", "screening", "--param", "block_pairs=3"], "block_pairs must be even, got 3"),
        (["run", "screening", "--param", "block_pairs=1"], "same mean position"),
        (["run", "screening", "--param", 'order=["OFF","ON","OFF","ON"]'], "OFF–ON–OFF–ON is unbalanced"),
        (["run", "screening", "--param", 'order=["OFF","ON","ON","ON"]'], "each one ON and one OFF"),
        (["run", "needle_eval", "--param", 'fixtures_by_size={"4096": 8}'], "not in sizes: [4096]"),
        (["run", "needle_eval", "--param", 'fixtures_by_size={"1024": 0}'], "positive integers"),
        (["run", "needle_eval", "--param", "fixtures_by_size=[8]"], "object of size: count"),
        (["run", "screening", "--param", "asked_lines=all"], "asked_lines must be one of spot, every"),
    ],
)
def test_bad_usage_exits_2_and_writes_nothing(tmp_path: Path, args: list[str], needle: str) -> None:
    db = tmp_path / "ledger.db"
    result = ledger_cli(*args, "--db", f"sqlite:///{db}", "--no-progress")
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert not db.exists()  # not even a schema: nothing was written


def test_needle_eval_sends_each_sizes_own_fixture_count(tmp_path: Path) -> None:
    """fixtures_by_size gives the sizes it names their own count; the rest keep ``fixtures``.
    The counts are read back from the run's request events."""
    import sqlite3

    db = tmp_path / "ledger.db"
    result = ledger_cli(
        "run", "needle_eval", "--db", f"sqlite:///{db}", "--no-progress",
        "--param", "sizes=[1024, 2048, 3072]", "--param", "fixtures=2",
        "--param", 'fixtures_by_size={"2048": 5}',
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT json_extract(data, '$.nominal_tokens') FROM events"
            " WHERE kind = 'request.sent' AND json_extract(data, '$.workload') = 'needle_eval'"
            " AND NOT json_extract(data, '$.warmup')"
        ).fetchall()
    sizes = [size for (size,) in rows]
    assert {s: sizes.count(s) for s in set(sizes)} == {1024: 2, 2048: 5, 3072: 2}


def test_fixtures_hit_nominal_sizes_and_share_prefixes() -> None:
    factory = FixtureFactory(local_tokens)

    async def build() -> list:
        return [await factory.fixture("314159:micro:0", n) for n in (1000, 4000, 16000)]

    small, mid, large = asyncio.run(build())
    for fx in (small, mid, large):
        assert abs(fx.prompt_tokens - fx.nominal_tokens) <= 8
        assert len(fx.expected) == 3 and all(100_000 <= v < 1_000_000 for v in fx.expected.values())
        assert fx.content.endswith("as JSON. Reply with the JSON object only.")
    # Like real files: the larger fixture starts with the smaller one's text (all but its tail).
    head = small.content[: int(0.9 * len(small.content))]
    assert large.content.startswith(head)
    assert asyncio.run(FixtureFactory(local_tokens).fixture("314159:micro:0", 4000)) == mid


def test_session_history_is_canonical_and_grows_by_turn_growth() -> None:
    factory = FixtureFactory(local_tokens)

    async def build():  # type: ignore[no-untyped-def]
        fx = await factory.fixture("314159:session:0", 2000)
        return fx, await factory.session(fx, 4, 1055)

    fx, history = asyncio.run(build())
    counts = [t.prompt_tokens for t in history.turns]
    assert [b - a for a, b in itertools.pairwise(counts)] == [1055, 1055, 1055]
    last = history.turns[-1].messages
    assert [m["role"] for m in last] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert all(m["content"] == fx.expected_json for m in last if m["role"] == "assistant")


def test_namespaces_are_valid_cache_salts() -> None:
    assert make_namespace("kvl1", "micro", 8000, "c0") == "kvl1-micro-8000-c0"
    for bad in (("a/b",), ("x" * 129,), ("a@b",), ("a\\b",)):
        with pytest.raises(ValueError):
            make_namespace(*bad)
