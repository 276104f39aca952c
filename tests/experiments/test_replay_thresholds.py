"""A replay holds its exact-value checks to the limit its original registered.

The plan (``plan.registered``) records the largest prompt whose answers the checks hold, which a
real run takes from the served model's card, and a card's limit grows with its evidence. A replay
re-executes the registered plan as it re-executes the recorded source: after the card has grown it
still registers the original's plan, applies the same checks and pools with it; a fresh run of
the same params under the grown card registers another plan. The sim stands for the card by
``sim_exact_values_up_to_tokens``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from .._cli import ledger_cli, param_args
from .conftest import SMALL, events, replayed_with, run_ids

SHAPE = {**SMALL, "sizes": [1000, 2000], "workloads": ["micro"], "chains": 1, "warmups": 1}
#: Between the two sizes' prompts: the 2,000-token ones are past it, the 1,000-token ones within.
LIMIT = 1500
GROWN = 4000


def _plan(url: str, run: str) -> dict[str, Any]:
    (plan,) = [e.data for e in events(url, "plan.registered") if e.run_id == run]
    return dict(plan)


def _exact_checks(url: str, run: str) -> Counter[int]:
    """How many exact-value checks the run applied, by the nominal size of the request."""
    sent = events(url, "request.sent", run_id=run)
    sizes = {e.data["request_id"]: e.data["nominal_tokens"] for e in sent}
    return Counter(
        sizes[e.data["request_id"]]
        for e in events(url, "assertion.evaluated")
        if e.run_id == run and e.data["check"] == "exact_values"
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str, str]:
    """The original (limit 1,500), its replay and a fresh run of its params, both under the grown
    card (4,000)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('thresholds') / 'ledger.db'}"
    run = ("run", "screening", "--db", url, "--no-progress", *param_args(SHAPE))
    assert ledger_cli(*run, *param_args({"sim_exact_values_up_to_tokens": LIMIT})).exit_code == 0
    (original,) = run_ids(url)
    comparison = replayed_with(url, original, sim_exact_values_up_to_tokens=GROWN)
    assert ledger_cli(*run, *param_args({"sim_exact_values_up_to_tokens": GROWN})).exit_code == 0
    (fresh,) = [r for r in run_ids(url) if r not in (original, comparison.replay_run)]
    return url, original, comparison.replay_run, fresh


def test_the_replay_registers_the_originals_limit_and_applies_the_same_checks(
    runs: tuple[str, str, str, str],
) -> None:
    url, original, replayed, _ = runs
    assert _plan(url, replayed) == _plan(url, original)
    assert _plan(url, original)["thresholds"]["exact_values_up_to_tokens"] == LIMIT
    checks = _exact_checks(url, original)
    assert checks[1000] > 0 and checks[2000] == 0  # the limit held: none past it
    assert _exact_checks(url, replayed) == checks
    (started,) = [e.data for e in events(url, "run.started") if e.run_id == replayed]
    assert started["params"]["sim_exact_values_up_to_tokens"] == GROWN  # the card as it is now
    (note,) = [
        e.data
        for e in events(url, "note.added")
        if e.run_id == replayed and e.data.get("topic") == "answers_meaningful"
    ]
    assert note["meaningful_up_to_tokens"] == LIMIT and f"gives {GROWN} now" in note["text"]


def test_a_fresh_run_under_the_grown_card_registers_another_plan(runs: tuple[str, str, str, str]) -> None:
    url, original, _, fresh = runs
    plan, theirs = _plan(url, fresh), _plan(url, original)
    assert plan["plan_sha256"] != theirs["plan_sha256"]
    assert plan["thresholds"]["exact_values_up_to_tokens"] == GROWN
    assert _exact_checks(url, fresh)[2000] > 0


def test_the_replay_pools_with_its_original_and_the_fresh_one_does_not(
    runs: tuple[str, str, str, str],
) -> None:
    url, original, replayed, fresh = runs
    result = ledger_cli("report", "--db", url, "--json", "--pool-replays")
    assert result.exit_code == 0, result.output
    tables = json.loads(result.output)["tables"]
    assert {tuple(c["runs"]) for c in tables["ttft_series"]} == {(original, replayed)}
    assert tables["replays_not_pooled"] == []
    assert fresh not in {r for c in tables["ttft_series"] for r in c["runs"]}


@pytest.mark.parametrize("limit", [0, -5, "big", True, 1.5])
def test_a_bad_limit_is_refused_before_anything_is_written(tmp_path: Any, limit: object) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    args = param_args({**SHAPE, "sim_exact_values_up_to_tokens": limit})
    result = ledger_cli("run", "screening", "--db", url, "--no-progress", *args)
    assert result.exit_code == 2 and "sim_exact_values_up_to_tokens" in result.output
    assert run_ids(url) == []
