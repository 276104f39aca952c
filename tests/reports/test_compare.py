"""``ledger compare``: two runs' cells side by side, each change as its own report derives it,
and B − A over the block pairs both runs hold."""

from __future__ import annotations

import json
from typing import Any

from reports import derive_report
from reports._compare import compare
from reports._stats import hodges_lehmann
from tests._synthetic import Shape, generate

from .._cli import ledger_cli

SIX = Shape(pairs=6, chains=1, sizes=(8192,), sessions=1)


def _screenings(events: list[dict[str, Any]]) -> list[str]:
    return [
        e["run_id"] for e in events if e["kind"] == "run.started" and e["data"]["experiment"] == "screening"
    ]


def test_each_side_is_its_own_report_and_the_difference_pairs_block_pairs(build_lite: Any) -> None:
    events, _ = generate(shape=SIX, screenings=2)
    src = build_lite(events)
    a, b = _screenings(events)
    result = compare(src, a, b)
    cross = next(r for r in result["tables"]["ttft"] if r["locality"] == "cross")
    own = {
        run: next(r for r in derive_report(src, run)["tables"]["ttft"] if r["locality"] == "cross")[
            "inference"
        ]
        for run in (a, b)
    }
    for side, run in (("a", a), ("b", b)):
        assert cross[side]["estimate"] == "hodges-lehmann" and cross[side]["n_block_pairs"] == 6
        assert cross[side]["change_pct"] == own[run]["hodges_lehmann_change_pct"]
        assert cross[side]["ci"] == own[run]["wilcoxon_ci"]
    diff = cross["b_minus_a"]
    assert diff["block_pairs"] == list(range(6))
    by_pair = [
        y - x for x, y in zip(own[a]["per_pair_change_pct"], own[b]["per_pair_change_pct"], strict=True)
    ]
    assert abs(diff["difference_pct_points"] - hodges_lehmann(by_pair)) < 1e-5
    assert diff["ci"] is not None and diff["ci"]["low"] <= diff["difference_pct_points"] <= diff["ci"]["high"]


def test_fewer_than_six_pairs_compare_descriptively(build_lite: Any) -> None:
    events, _ = generate(shape=Shape(pairs=2, chains=1, sizes=(8192,), sessions=1), screenings=2)
    result = compare(build_lite(events), *_screenings(events))
    for row in result["tables"]["ttft"]:
        assert row["a"]["estimate"] == row["b"]["estimate"] == "mean (descriptive)" and row["a"]["ci"] is None
        assert row["b_minus_a"]["estimate"] == "mean (descriptive)" and row["b_minus_a"]["ci"] is None
        assert "descriptive only: 2 block pair(s)" in row["b_minus_a"]["note"]


def test_the_command_prints_markdown_or_json_and_refuses_an_unknown_run(
    build_lite: Any, sqlite_url: str
) -> None:
    events, _ = generate(shape=SIX, screenings=2)
    build_lite(events)
    a, b = _screenings(events)
    markdown = ledger_cli("compare", a, b, "--db", sqlite_url)
    assert markdown.exit_code == 0, markdown.output
    assert (
        f"A = run `{a}`, B = run `{b}`" in markdown.output and "(hodges-lehmann, 6 pairs)" in markdown.output
    )
    as_json = ledger_cli("compare", a, b, "--db", sqlite_url, "--json")
    assert json.loads(as_json.output)["runs"] == {"a": a, "b": b}
    unknown = ledger_cli("compare", a, "no-such-run", "--db", sqlite_url)
    assert unknown.exit_code == 2 and "no run 'no-such-run'" in unknown.output
