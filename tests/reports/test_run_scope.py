"""A run's report and audit derive that run's observations only, and say exactly what the whole
ledger's derivation says about it.

A team ledger holds many studies; ``ledger report --run R``, ``ledger audit --run R`` and
``ledger attest --run R`` derive the requests, responses, hit records, assertions, scrapes,
sessions and windows of R, of the runs linked to R by replay and of the validation runs
(reports/_source.py ``run_scope``), while every row of the ledger is still read and its chain
checked. The ledger here mixes sim runs (validation, a clean screening, its replay, a screening
with a planted namespace leak), a committed GPU study (replays and validation runs of their own),
GPU probe records and another tool's imported result file. For every run, the scoped report and
audit equal the whole ledger's, on the native checked read, the snapshot's projections, the
driver path and PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from ledger import Ledger, open_ledger
from ledger._cli import cli
from ledger._jsonl import read_jsonl
from reports import derive_report, open_source, to_json
from reports._audit import audit_json
from reports._source import SCOPED_KINDS, run_scope
from tests.reports._sim_shape import SMALL
from tests.reports._team import Team, _invoke, _run, edited_copy

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent.parent / "data"


@pytest.fixture
def ledger(team: Team) -> Iterator[Ledger]:
    led = open_ledger(team.url, create=False)
    yield led
    led.close()


def _derived(led: Ledger, root: Path, run: str, scoped: bool, verify: bool) -> tuple[str, bytes]:
    """The report and the audit of ``run`` (JSON), from a source of that run only or of all."""
    src = open_source(led, root, verify=verify, runs=[run] if scoped else None)
    try:
        return to_json(derive_report(src, run, pool_replays=True)), orjson.dumps(
            audit_json(src, run), option=orjson.OPT_SORT_KEYS
        )
    finally:
        src.close()


def test_the_team_ledger_mixes_what_a_scope_must_get_right(team: Team, ledger: Ledger) -> None:
    """Several studies, replays both ways, validation runs of two origins, probes and an import."""
    started = {e.run_id: e.data for e in ledger.events(kind="run.started")}
    assert len(started) >= 12
    assert sum(d.get("experiment") == "validation" for d in started.values()) >= 3
    assert sum(isinstance(d.get("replay_of"), str) for d in started.values()) >= 4
    assert started[team.replay]["replay_of"] == team.screening
    assert any(str(d.get("experiment", "")).startswith("probe.") for d in started.values())
    assert team.imported


@pytest.mark.parametrize("verify", [True, False], ids=["verified", "snapshot"])
def test_every_run_scoped_says_what_the_whole_ledger_says(
    team: Team, ledger: Ledger, tmp_path: Path, verify: bool
) -> None:
    whole = open_source(ledger, tmp_path, verify=verify)
    try:
        expected = {
            run: (
                to_json(derive_report(whole, run, pool_replays=True)),
                orjson.dumps(audit_json(whole, run), option=orjson.OPT_SORT_KEYS),
            )
            for run in [*team.runs, *team.imported]
        }
    finally:
        whole.close()
    differ = [
        run for run, derived in expected.items() if _derived(ledger, tmp_path, run, True, verify) != derived
    ]
    assert differ == []
    # Not vacuous: the leaky screening's audit blocks, the clean one's report has paired rows.
    assert b"namespace-leak" in expected[team.leaky][1]
    assert '"matched"' in expected[team.screening][0] or '"pairs"' in expected[team.screening][0]


def test_the_scope_holds_the_run_its_replays_and_the_validation_runs(team: Team, ledger: Ledger) -> None:
    scope = run_scope(ledger, [team.replay])
    started = {e.run_id: e.data for e in ledger.events(kind="run.started")}
    validations = {r for r, d in started.items() if d.get("experiment") == "validation"}
    assert scope.kinds == SCOPED_KINDS
    assert scope.runs == {team.replay, team.screening} | validations
    assert team.leaky not in scope.runs
    # The replay family is followed on: a run replayed twice, from any of them, is one family.
    pooled = {r for r, d in started.items() if isinstance(d.get("replay_of"), str) and r != team.replay}
    assert pooled
    for run in pooled:
        scoped = run_scope(ledger, [started[run]["replay_of"]]).runs
        assert run in scoped and team.screening not in scoped


def test_a_scoped_source_holds_only_its_runs_observations(team: Team, ledger: Ledger, tmp_path: Path) -> None:
    """The rows left out are left out of the tables (not merely filtered by the report)."""
    counts = {}
    for scoped in (False, True):
        src = open_source(ledger, tmp_path, verify=True, runs=[team.screening] if scoped else None)
        try:
            counts[scoped] = dict(
                src.tuples("SELECT run_id, count(*) FROM kv_requests GROUP BY run_id ORDER BY run_id")
            )
            assert src.analytics.checked is not None  # the native checked read, not the driver path
        finally:
            src.close()
    assert team.leaky in counts[False]
    assert set(counts[True]) <= set(run_scope(ledger, [team.screening]).runs)
    assert counts[True][team.screening] == counts[False][team.screening]
    assert counts[True][team.replay] == counts[False][team.replay]


def test_a_scoped_source_refuses_to_derive_about_other_runs(
    team: Team, ledger: Ledger, tmp_path: Path
) -> None:
    src = open_source(ledger, tmp_path, runs=[team.screening])
    try:
        with pytest.raises(ValueError, match="not for run " + team.leaky):
            derive_report(src, team.leaky)
        with pytest.raises(ValueError, match="not for the whole ledger"):
            audit_json(src, None)
    finally:
        src.close()


def test_a_row_of_another_run_edited_still_blocks_the_runs_audit(team: Team, tmp_path: Path) -> None:
    """The scope spares copies, not checks: the chain is verified over every row."""
    url, seq = edited_copy(team, tmp_path, team.leaky)
    result = _invoke("audit", "--run", team.screening, "--publish", "--db", url)
    assert result.exit_code == 1, result.output
    assert "chain-broken" in result.output and str(seq) in result.output


def test_the_cli_reports_a_run_as_the_whole_ledger_derives_it(
    team: Team, ledger: Ledger, tmp_path: Path
) -> None:
    scoped = _invoke("report", "--run", team.screening, "--json", "--db", team.url)
    assert scoped.exit_code == 0, scoped.output
    whole = open_source(ledger, tmp_path)
    try:
        assert scoped.output.strip() == to_json(derive_report(whole, team.screening)).strip()
    finally:
        whole.close()
    audited = _invoke("audit", "--run", team.screening, "--json", "--db", team.url)
    assert audited.exit_code == 0, audited.output
    compared = _invoke("compare", team.screening, team.replay, "--json", "--db", team.url)
    assert compared.exit_code == 0, compared.output
    assert team.screening in compared.output and team.replay in compared.output


def test_the_driver_path_keeps_the_same_rows(
    team: Team, ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the native reader (``KVLEDGER_READER=python``), the scope is kept in Python."""
    expected = {run: _derived(ledger, tmp_path, run, False, True) for run in (team.screening, team.leaky)}
    monkeypatch.setenv("KVLEDGER_READER", "python")
    for run, derived in expected.items():
        src = open_source(ledger, tmp_path, verify=True, runs=[run])
        try:
            assert src.analytics.checked is None  # derived apart from the check, on the driver path
            assert (
                to_json(derive_report(src, run, pool_replays=True)),
                orjson.dumps(audit_json(src, run), option=orjson.OPT_SORT_KEYS),
            ) == derived
        finally:
            src.close()


def test_postgresql_scoped_says_what_sqlite_says(
    team: Team, ledger: Ledger, pg_url: str, tmp_path: Path
) -> None:
    """The same events in PostgreSQL, read as binary COPY with the scope kept natively."""
    pg = open_ledger(pg_url)
    try:
        pg.append_sealed(read_jsonl(iter(_export_lines(ledger))))
        for run in (team.screening, team.leaky):
            src = open_source(pg, tmp_path / "pg", verify=True, runs=[run])
            try:
                assert src.analytics.checked is not None
                got = (
                    to_json(derive_report(src, run, pool_replays=True)),
                    orjson.dumps(audit_json(src, run), option=orjson.OPT_SORT_KEYS),
                )
            finally:
                src.close()
            want = _derived(ledger, tmp_path / "sqlite", run, False, True)
            # The head differs (another database, sealed again): compare the derived tables.
            assert _without_head(got) == _without_head(want)
    finally:
        pg.close()


def _export_lines(led: Ledger) -> list[bytes]:
    keys = ("id", "ts", "kind", "run_id", "block_id", "data")
    return [orjson.dumps({k: getattr(e, k) for k in keys}) for e in led.events()]


def _without_head(derived: tuple[str, bytes]) -> tuple[Any, Any]:
    report, audited = orjson.loads(derived[0]), orjson.loads(derived[1])
    for doc in (report, audited):
        doc.pop("head", None)
    report.get("ledger", {}).pop("head", None)
    return report, audited


def test_a_verified_reader_builds_no_cache_where_none_was_built(
    team: Team, ledger: Ledger, tmp_path: Path
) -> None:
    """Its tables come from the database's rows: a cache never built stays unbuilt (a plain
    reader builds it), and the report and audit are the same as over a cache that is there."""
    cold = tmp_path / "cold"
    got = _derived(ledger, cold, team.screening, True, True)
    assert not any(cold.rglob("*.parquet"))
    warm = tmp_path / "warm"
    open_source(ledger, warm).close()
    assert any(warm.rglob("*.parquet"))
    assert _derived(ledger, warm, team.screening, True, True) == got


def test_an_attestation_verifies_at_its_head_after_the_ledger_grew(team: Team, tmp_path: Path) -> None:
    """Made and checked with no cache built: the attested head is read from the database's rows."""
    path = tmp_path / "grown.db"
    with sqlite3.connect(team.url.removeprefix("sqlite:///")) as source, sqlite3.connect(path) as copy:
        source.backup(copy)
    url = f"sqlite:///{path}"
    made = _invoke("attest", "--run", team.screening, "--out", str(tmp_path / "s.json"), "--db", url)
    assert made.exit_code == 0, made.output
    _run(url, "screening", *SMALL)  # the ledger grows past the attested head
    checked = _invoke("attest", "--verify", str(tmp_path / "s.json"), "--db", url)
    assert checked.exit_code == 0, checked.output
    assert "statement matches the ledger" in checked.output


def _findings(*args: str) -> tuple[list[dict[str, Any]], str | None]:
    """``ledger audit ARGS --json``: its findings and head."""
    result = _invoke("audit", *args, "--json")
    assert result.exit_code == 0, result.output
    out = orjson.loads(result.output)
    return out["findings"], out["head"]


def _runs_args(*runs: str) -> list[str]:
    return [arg for run in runs for arg in ("--run", run)]


def _key(finding: dict[str, Any]) -> bytes:
    return orjson.dumps(finding, option=orjson.OPT_SORT_KEYS)


def test_several_runs_audited_at_once_say_what_each_runs_audit_says(team: Team) -> None:
    """``ledger audit --run A --run B``: one source, one verification, and each run's findings as
    its own audit gives them, a finding about the ledger listed once; --publish blocks on any."""
    chosen = [team.leaky, team.screening, team.validation, team.imported[0]]
    each = {run: _findings("--run", run, "--db", team.url) for run in chosen}
    together, head = _findings(*_runs_args(*chosen), "--db", team.url)
    assert head == each[team.screening][1]
    expected = {_key(f) for run in chosen for f in each[run][0]}
    assert sorted(map(_key, together)) == sorted(expected)
    assert len(together) == len(expected)
    # The planted leak blocks the leaky run's audit, so the audit of the four blocks too.
    assert any(f["code"] == "namespace-leak" and f["run_id"] == team.leaky for f in together)
    published = _invoke("audit", *_runs_args(*chosen), "--publish", "--db", team.url)
    assert published.exit_code == 1, published.output
    clean = _invoke("audit", *_runs_args(team.screening, team.replay), "--publish", "--db", team.url)
    assert clean.exit_code == 0, clean.output
    # The same run twice is audited once.
    twice, _ = _findings(*_runs_args(team.screening, team.screening), "--db", team.url)
    assert twice == each[team.screening][0]


def test_a_ledger_edit_is_one_finding_for_several_runs(team: Team, tmp_path: Path) -> None:
    """A finding about the ledger (the chain) is listed once, not once per run audited."""
    url, seq = edited_copy(team, tmp_path)
    findings, _ = _findings(*_runs_args(team.screening, team.replay), "--db", url)
    broken = [f for f in findings if f["code"] == "chain-broken"]
    assert len(broken) == 1 and str(seq) in broken[0]["detail"], broken


def test_an_unknown_run_among_several_is_named(team: Team) -> None:
    result = CliRunner().invoke(cli, ["audit", *_runs_args(team.screening, "no-such-run"), "--db", team.url])
    assert result.exit_code == 2
    assert "no run 'no-such-run' in the ledger" in result.output
