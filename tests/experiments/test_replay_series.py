"""A run and its replays pooled into one sample of block pairs (`ledger report --pool-replays`).

A sim screening of two block pairs, replayed twice, is one series of six pairs: the pooled Table 3
counts every pair of the three runs, each per-pair change being the one its own run's Table 3
gives, and from six pairs it carries an interval. An independent run of the same params, not a
replay, is a series of its own; without the flag the report is unchanged.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from experiments.replay import replay
from ledger import ReplayError, open_ledger

from .._cli import ledger_cli, param_args
from .conftest import SMALL, replayed_with, run_ids

SHAPE = {**SMALL, "sizes": [1000, 2000], "workloads": ["micro"], "chains": 1, "warmups": 1}


def _report(url: str, *extra: str) -> dict[str, Any]:
    result = ledger_cli("report", "--db", url, "--json", *extra)
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.output)
    return report


OTHER_DEVICE = "NVIDIA H200"


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, list[str], str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('series') / 'ledger.db'}"
    run = ("run", "screening", "--db", url, "--no-progress", *param_args(SHAPE))
    assert ledger_cli(*run).exit_code == 0
    (original,) = run_ids(url)
    for _ in range(2):
        result = ledger_cli("replay", original, "--db", url, "--no-progress")
        assert result.exit_code == 0 and "all matched" in result.output, result.output
    replays = [r for r in run_ids(url) if r != original]
    assert ledger_cli(*run).exit_code == 0  # the same params again, not a replay
    (independent,) = [r for r in run_ids(url) if r not in (original, *replays)]
    return url, original, replays, independent


@pytest.fixture(scope="module")
def elsewhere(series: tuple[str, str, list[str], str]) -> str:
    """The original replayed once more, its replicas reporting another device: the same requests
    and config on other hardware."""
    url, original, *_ = series
    return replayed_with(url, original, sim_device=OTHER_DEVICE).replay_run


def test_a_run_and_its_replays_are_one_sample_of_block_pairs(series: tuple[str, str, list[str], str]) -> None:
    url, original, replays, independent = series
    report = _report(url, "--pool-replays")
    pooled = report["tables"]["ttft_series"]
    by_run = {
        (c["run_id"], c["nominal_tokens"], c["locality"]): c["inference"]["per_pair_change_pct"]
        for c in report["tables"]["ttft"]
    }
    assert pooled and {c["series"] for c in pooled} == {original}
    for cell in pooled:
        assert cell["runs"] == [original, *replays]
        assert cell["matched_units"] == 6 and cell["inference"]["n_block_pairs"] == 6
        # Each pooled pair's change is its own run's, nothing recomputed across runs.
        own = [x for r in cell["runs"] for x in by_run[r, cell["nominal_tokens"], cell["locality"]]]
        assert Counter(cell["inference"]["per_pair_change_pct"]) == Counter(own)
        assert "wilcoxon_ci" in cell["inference"] and cell["inference"]["mode"] != "descriptive"
    # Each run alone stays descriptive (two pairs), and the independent run pools with nothing.
    assert all(c["inference"]["mode"] == "descriptive" for c in report["tables"]["ttft"])
    assert independent not in {r for c in pooled for r in c["runs"]}


def test_without_the_flag_the_report_is_unchanged(series: tuple[str, str, list[str], str]) -> None:
    url, *_ = series
    plain, pooled = _report(url), _report(url, "--pool-replays")
    assert "ttft_series" not in plain["tables"]
    del pooled["tables"]["ttft_series"], pooled["tables"]["replays_not_pooled"]
    assert plain == pooled
    markdown = ledger_cli("report", "--db", url, "--markdown", "--pool-replays").output
    assert "## Table 3, pooled" in markdown and "## Table 3, pooled" not in _markdown(url)


def _markdown(url: str) -> str:
    result = ledger_cli("report", "--db", url, "--markdown")
    assert result.exit_code == 0, result.output
    return str(result.output)


def test_a_run_scope_pools_the_series_that_holds_it(series: tuple[str, str, list[str], str]) -> None:
    url, original, replays, independent = series
    scoped = _report(url, "--pool-replays", "--run", replays[-1])["tables"]["ttft_series"]
    assert scoped and {c["series"] for c in scoped} == {original}
    assert _report(url, "--pool-replays", "--run", independent)["tables"]["ttft_series"] == []


def test_only_a_replay_of_the_same_plan_config_and_hardware_joins_its_originals_series() -> None:
    """kv_series' rule over hand-made runs: a replay joins its original's series only with the same
    plan digest, the same validated config and the same hardware; a replay of a replay joins the
    first run's series; units number the series' pairs run by run."""
    import duckdb

    from reports._views import VIEWS

    con = duckdb.connect(":memory:")
    con.execute(
        "CREATE TABLE kv_runs (run_id VARCHAR, seq BIGINT, replay_of VARCHAR, validated_config VARCHAR)"
    )
    con.execute("CREATE TABLE kv_plans (run_id VARCHAR, plan_sha256 VARCHAR)")
    con.execute("CREATE TABLE kv_blocks (run_id VARCHAR, pair BIGINT)")
    con.execute("CREATE TABLE kv_run_hardware (run_id VARCHAR, hardware VARCHAR[])")
    h100, h200 = ["NVIDIA H100 80GB HBM3"], ["NVIDIA H200"]
    runs = [  # run, seq, replay_of, config, plan, hardware
        ("a", 1, None, "c1", "p1", h100),
        ("b", 2, "a", "c1", "p1", h100),  # a replay: pooled with a
        ("c", 3, "b", "c1", "p1", h100),  # a replay of the replay: pooled with a
        ("d", 4, "a", "c2", "p1", h100),  # another config: its own series
        ("e", 5, "a", "c1", "p2", h100),  # another plan: its own series
        ("f", 6, "a", "c1", None, h100),  # no plan: its own series
        ("g", 7, None, "c1", "p1", h100),  # the same requests, not a replay: its own series
        ("h", 8, "a", "c1", "p1", h200),  # the same plan and config on another GPU: its own series
        ("i", 9, "h", "c1", "p1", h200),  # a replay of h, on h's hardware: pooled with h
    ]
    for run, seq, replay_of, config, plan, hardware in runs:
        con.execute("INSERT INTO kv_runs VALUES (?, ?, ?, ?)", [run, seq, replay_of, config])
        if plan is not None:
            con.execute("INSERT INTO kv_plans VALUES (?, ?)", [run, plan])
        con.execute("INSERT INTO kv_run_hardware VALUES (?, ?)", [run, hardware])
        con.execute("INSERT INTO kv_blocks VALUES (?, 0), (?, 0), (?, 1), (?, 1)", [run] * 4)
    views = dict(VIEWS)
    for view in ("kv_pooling_keys", "kv_replay_links"):
        con.execute(f"CREATE VIEW {view} AS {views[view]}")
    sql = views["kv_series"]
    rows = con.execute(f"SELECT run_id, series, pair, unit FROM ({sql}) ORDER BY run_id, pair").fetchall()
    series = {run: s for run, s, _, _ in rows}
    assert series == {
        "a": "a", "b": "a", "c": "a", "d": "d", "e": "e", "f": "f", "g": "g", "h": "h", "i": "h"
    }  # fmt: skip
    units = {(run, pair): unit for run, _, pair, unit in rows}
    assert [units[r, p] for r in "abc" for p in (0, 1)] == [0, 1, 2, 3, 4, 5]
    assert units["d", 0] == 0 and units["d", 1] == 1


def test_a_replay_on_other_hardware_is_not_pooled_and_the_report_says_why(
    series: tuple[str, str, list[str], str], elsewhere: str
) -> None:
    """The same requests and config replayed where the replicas report another device: the series
    keeps its three runs on the sim's device, and the replay left out is named with both."""
    url, original, replays, _ = series
    report = _report(url, "--pool-replays")
    pooled = report["tables"]["ttft_series"]
    assert pooled and {c["series"] for c in pooled} == {original}
    assert all(c["runs"] == [original, *replays] and c["hardware"] == ["sim"] for c in pooled)
    assert all(c["inference"]["n_block_pairs"] == 6 for c in pooled)
    (left_out,) = report["tables"]["replays_not_pooled"]
    assert left_out == {
        "run_id": elsewhere,
        "replay_of": original,
        "differs": ["hardware"],
        "hardware": [OTHER_DEVICE],
        "original_hardware": ["sim"],
    }
    # What the replicas reported is what the requests record too.
    led = open_ledger(url)
    try:
        devices = {e.data["gpu"]["name"] for e in led.events(run_id=elsewhere, kind="request.sent")}
    finally:
        led.close()
    assert devices == {OTHER_DEVICE}
    markdown = ledger_cli("report", "--db", url, "--markdown", "--pool-replays").output
    assert any(line.startswith("- series") and line.endswith(" on sim") for line in markdown.splitlines()), (
        markdown
    )
    assert f"hardware differs ({OTHER_DEVICE} against sim)" in markdown
    # Scoped to the replay left out, its own run's report pools nothing and says why.
    scoped = _report(url, "--pool-replays", "--run", elsewhere)["tables"]
    assert scoped["ttft_series"] == [] and [r["run_id"] for r in scoped["replays_not_pooled"]] == [elsewhere]


def test_a_replay_changes_only_the_targets_options(series: tuple[str, str, list[str], str]) -> None:
    """What shapes the requests is not an option a replay may change: the experiment's params and
    the client's (asked_lines, ttft_method) are refused before anything is written."""
    url, original, *_ = series
    led = open_ledger(url)
    try:
        before = led.head()
        for options in ({"sizes": [1000]}, {"asked_lines": "every"}, {"ttft_method": "httpx-read"}):
            with pytest.raises(ReplayError, match="not options of the sim target"):
                replay(led, original, target_options=options)
        assert led.head() == before
    finally:
        led.close()


def test_compare_names_each_runs_hardware_and_says_when_they_differ(
    series: tuple[str, str, list[str], str], elsewhere: str
) -> None:
    url, original, replays, _ = series
    result = ledger_cli("compare", original, elsewhere, "--db", url, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["hardware"] == {"a": ["sim"], "b": [OTHER_DEVICE]}
    markdown = ledger_cli("compare", original, elsewhere, "--db", url).output
    assert f"A = run `{original}` on sim, B = run `{elsewhere}` on {OTHER_DEVICE}." in markdown
    assert "ran on different hardware" in markdown
    same = ledger_cli("compare", original, replays[0], "--db", url).output
    assert "on sim, B = run" in same and "ran on different hardware" not in same
