"""The whole ledger's report and audit derived group of runs by group of runs say, byte for byte,
what the whole ledger's tables say.

The team ledger of tests/reports/_team.py mixes sim runs (validation, a clean
screening, its replay, a leaky screening), a committed GPU study with replays and validation runs
of its own, GPU probe records and an imported result file. Its runs are split every way that
matters: each linked set of runs a group of its own, a few groups, one group.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from ledger import Ledger, NewEvent, open_ledger
from ledger._cli import cli
from reports import derive_report, open_source, to_json
from reports._audit import audit_json
from reports._source import Source, run_scope
from reports._stream import groups_of_runs, report_and_audit, report_and_audit_by_groups
from tests.reports._team import Team, copy_of, edited_copy

pytestmark = pytest.mark.slow


def _whole(led: Ledger, root: Path, verify: bool) -> tuple[str, bytes]:
    src = open_source(led, root, verify=verify)
    try:
        return to_json(derive_report(src, None, pool_replays=True)), orjson.dumps(
            audit_json(src)["findings"], option=orjson.OPT_SORT_KEYS
        )
    finally:
        src.close()


def _scoped_sources(led: Ledger, root: Path, groups: list[list[str]], verify: bool) -> Iterator[Source]:
    """One source per group, each closed before the next is opened."""
    for group in groups:
        src = open_source(led, root, verify=verify, runs=group)
        try:
            yield src
        finally:
            src.close()


def _by_groups(led: Ledger, root: Path, groups: list[list[str]], verify: bool) -> tuple[str, bytes]:
    report, findings = report_and_audit_by_groups(
        _scoped_sources(led, root, groups, verify), groups, pool_replays=True
    )
    return to_json(report), orjson.dumps([f.as_dict() for f in findings], option=orjson.OPT_SORT_KEYS)


@pytest.mark.parametrize("verify", [True, False], ids=["verified", "snapshot"])
@pytest.mark.parametrize("events_per_group", [1, 3_000, 10**9], ids=["each", "few", "one"])
def test_the_report_and_audit_by_groups_are_the_whole_ledgers(
    team_ledger: Ledger, tmp_path: Path, verify: bool, events_per_group: int
) -> None:
    groups = groups_of_runs(team_ledger, events_per_group)
    if events_per_group == 1:
        assert len(groups) >= 8  # every linked set of runs apart
    elif events_per_group == 3_000:
        assert 2 <= len(groups) < len(groups_of_runs(team_ledger, 1))
    else:
        assert len(groups) == 1
    whole = _whole(team_ledger, tmp_path, verify)
    assert _by_groups(team_ledger, tmp_path, groups, verify) == whole
    # Not vacuous: the report has paired cells, the audit blocks on the leaky screening.
    assert b"namespace-leak" in whole[1] and '"matched"' in whole[0]


def test_groups_keep_runs_linked_by_replay_together_in_start_order(team: Team, team_ledger: Ledger) -> None:
    groups = groups_of_runs(team_ledger, 1)
    runs = [run for group in groups for run in group]
    assert sorted(runs) == sorted(team.runs) and len(runs) == len(set(runs))
    assert runs == team.runs or [g[0] for g in groups] == sorted((g[0] for g in groups), key=team.runs.index)
    for group in groups:
        linked = run_scope(team_ledger, group).runs
        validation = run_scope(team_ledger, []).runs
        # A group's scope adds the validation runs and nothing of another group.
        assert linked - validation <= set(group)
    together = next(g for g in groups if team.screening in g)
    assert team.replay in together


def test_a_row_edited_blocks_every_way_alike(team: Team, tmp_path: Path) -> None:
    """A tampered row: the groups' audit names it as the whole ledger's does (chain-broken, once)."""
    url, seq = edited_copy(team, tmp_path, team.screening)
    led = open_ledger(url, create=False)
    try:
        groups = groups_of_runs(led, 3_000)
        whole = _whole(led, tmp_path / "whole", True)
        by_groups = _by_groups(led, tmp_path / "groups", groups, True)
    finally:
        led.close()
    assert by_groups == whole
    findings = orjson.loads(whole[1])
    assert [f["target"] for f in findings if f["code"] == "chain-broken"] == [str(seq)]


def test_groups_are_refused_when_they_overlap_or_miss_a_source(team_ledger: Ledger, tmp_path: Path) -> None:
    groups = groups_of_runs(team_ledger, 3_000)
    with pytest.raises(ValueError, match="in two groups"):
        report_and_audit_by_groups([], [groups[0], groups[0]])
    with pytest.raises(ValueError, match="sources for"):
        report_and_audit_by_groups(_scoped_sources(team_ledger, tmp_path, groups[:1], True), groups)
    with pytest.raises(ValueError, match="at least 1"):
        groups_of_runs(team_ledger, 0)


def test_report_and_audit_streams_past_its_size_and_says_the_same(
    team_ledger: Ledger, tmp_path: Path
) -> None:
    whole = report_and_audit(team_ledger, tmp_path, pool_replays=True)
    assert whole.groups == 1  # a small ledger: the whole ledger's tables at once
    streamed = report_and_audit(team_ledger, tmp_path, pool_replays=True, events_per_group=3_000)
    assert streamed.groups == len(groups_of_runs(team_ledger, 3_000)) >= 2
    assert to_json(streamed.report) == to_json(whole.report)
    assert streamed.findings == whole.findings and streamed.head == whole.head == team_ledger.head()


def test_the_cli_by_groups_prints_what_it_prints_whole(team: Team, tmp_path: Path) -> None:
    """``--events-per-group``: ``ledger audit``, ``ledger report`` and ``ledger report --html``
    print and write the same bytes as from the whole ledger's tables (Markdown is rendered from the
    report that ``--json`` prints)."""

    def invoke(*args: str) -> Any:
        result = CliRunner().invoke(cli, [*args, "--db", team.url], catch_exceptions=False)
        assert result.exit_code in (0, 1), result.output
        return result

    for command in (["audit", "--json"], ["report", "--json", "--pool-replays"]):
        whole = invoke(*command)
        grouped = invoke(*command, "--events-per-group", "3000")
        assert grouped.output == whole.output and grouped.exit_code == whole.exit_code
    assert invoke("audit", "--publish", "--events-per-group", "3000").exit_code == 1  # the leaky run
    invoke("report", "--html", str(tmp_path / "whole.html"))
    invoke("report", "--html", str(tmp_path / "groups.html"), "--events-per-group", "3000")
    assert (tmp_path / "groups.html").read_bytes() == (tmp_path / "whole.html").read_bytes()
    refused = CliRunner().invoke(cli, ["audit", "--events-per-group", "0", "--db", team.url])
    assert refused.exit_code == 2 and "--events-per-group" in refused.output


@pytest.mark.parametrize("verify", [True, False], ids=["verified", "snapshot"])
def test_observations_of_a_run_that_never_started_are_derived_whole(
    team: Team, team_ledger: Ledger, tmp_path: Path, verify: bool
) -> None:
    """A request of a run with no run.started belongs to no group: the whole ledger's tables hold
    it, so the report and audit are derived from them, not from groups that would leave it out."""
    led = open_ledger(copy_of(team, tmp_path / "orphan.db"), create=False)
    try:
        sent = next(iter(led.events(kind="request.sent")))
        data = {**sent.data, "request_id": "request-of-a-run-never-started"}
        led.append_many([NewEvent("request.sent", data, run_id="run-never-started", block_id=sent.block_id)])
        whole = _whole(led, tmp_path / "whole", verify)
        derived = report_and_audit(
            led, tmp_path / "groups", verify=verify, pool_replays=True, events_per_group=3_000
        )
    finally:
        led.close()
    assert derived.groups == 1 and derived.report is not None
    findings = orjson.dumps([f.as_dict() for f in derived.findings], option=orjson.OPT_SORT_KEYS)
    assert (to_json(derived.report), findings) == whole
    # Not vacuous: the request changes what the ledger's derivation says.
    assert _whole(team_ledger, tmp_path / "before", verify)[0] != whole[0]
