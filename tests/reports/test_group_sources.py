"""One checked read of the ledger, one source per group of runs (reports/_source.py
``open_group_sources``).

A whole-ledger report of a large ledger derives group of runs by group of runs, so that one
group's tables are in memory at a time. Each group's source must be exactly what a source opened
for that group gives (``open_source(..., verify=True, runs=group)``: the same tables, report and
audit), while every row of the ledger is read and checked once for all groups, not once per
group. The ledger is tests/reports/_team.py's mixed team ledger.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pytest

from ledger import Ledger, open_ledger
from ledger._row_sources import SqliteRows
from ledger._verify import native_path
from reports import derive_report, open_source, to_json
from reports._audit import audit_json
from reports._source import Source, open_group_sources, run_scope
from tests.reports._team import Team, edited_copy

pytestmark = pytest.mark.slow


def _groups(team: Team, led: Ledger, count: int = 3) -> list[list[str]]:
    """Every run of the ledger in ``count`` groups, each run with the runs linked to it by replay
    (a family: its scope less the validation runs every scope holds), families dealt in turn."""
    started = {e.run_id: e.data for e in led.events(kind="run.started")}
    validations = {run for run, data in started.items() if data.get("experiment") == "validation"}
    families: list[list[str]] = []
    placed: set[str] = set()
    for run in [*team.runs, *team.imported]:
        if run in placed:
            continue
        family = [run] if run in validations else sorted(run_scope(led, [run]).runs - validations)
        placed.update(family)
        families.append(family)
    groups: list[list[str]] = [[] for _ in range(count)]
    for index, family in enumerate(families):
        groups[index % count].extend(family)
    assert all(groups) and sorted(r for g in groups for r in g) == sorted({*team.runs, *team.imported})
    return groups


def _tables(src: Source) -> dict[str, tuple[list[tuple[str, str]], str]]:
    """Every table and view of ``src`` (the projections held as Arrow tables too): its columns'
    names and types, and its rows (the projections' as they are stored, which is seq order;
    the others sorted), as text so that a NaN equals a NaN."""
    names = {str(r[0]) for r in src.tuples("SELECT table_name FROM duckdb_tables()")}
    names |= {str(r[0]) for r in src.tuples("SELECT view_name FROM duckdb_views() WHERE NOT internal")}
    names |= src.analytics.held
    out = {}
    for name in sorted(names):
        columns = [(str(r[0]), str(r[1])) for r in src.tuples(f'DESCRIBE SELECT * FROM "{name}"')]
        order = "" if name.startswith("kv_src_") else " ORDER BY ALL"
        out[name] = (columns, repr(src.tuples(f'SELECT * FROM "{name}"{order}')))
    return out


def _derived(src: Source, run: str) -> tuple[str, bytes]:
    return to_json(derive_report(src, run, pool_replays=True)), orjson.dumps(
        audit_json(src, run), option=orjson.OPT_SORT_KEYS
    )


def test_each_group_has_the_tables_report_and_audit_of_a_source_opened_for_it(
    team: Team, team_ledger: Ledger, tmp_path: Path
) -> None:
    groups = _groups(team, team_ledger)
    whole = open_source(team_ledger, tmp_path, verify=True)
    try:
        whole_head = whole.head
        whole_requests = whole.scalar("SELECT count(*) FROM kv_requests")
    finally:
        whole.close()
    with open_group_sources(team_ledger, groups, tmp_path) as sources:
        assert sources.shared is not None  # the one checked read, not a source opened per group
        for group, src in zip(groups, sources, strict=True):
            want = open_source(team_ledger, tmp_path, verify=True, runs=group)
            try:
                assert src.scope == want.scope == run_scope(team_ledger, group)
                assert src.head == want.head == whole_head
                # A verified source builds the audit's re-derivations on a thread of its own from
                # open: wait for both, or the listing races that build.
                src.rederive()
                want.rederive()
                got_tables, want_tables = _tables(src), _tables(want)
                assert sorted(got_tables) == sorted(want_tables)
                assert [name for name in want_tables if got_tables[name] != want_tables[name]] == []
                # Not vacuous: the group holds some of the ledger's requests, not all.
                requests = src.scalar("SELECT count(*) FROM kv_requests")
                assert 0 < requests < whole_requests
                assert src.snapshot_mismatches == want.snapshot_mismatches == []
                for run in group:
                    assert _derived(src, run) == _derived(want, run), run
            finally:
                want.close()


class _CountedRows:
    """The ledger's own row source, counting the rows each checked read by kind stepped through
    (injected where the read takes its rows: ``rows=``)."""

    def __init__(self, led: Ledger) -> None:
        path = native_path(led)
        assert path is not None
        self.inner = SqliteRows(path)
        self.stepped: list[int] = []

    def by_kind(self, *args: Any) -> tuple[Any, ...]:
        got = self.inner.by_kind(*args)
        self.stepped.append(int(got[0]))
        return got

    def scan(self, after: int, until: int, expected: int, previous: str) -> Any:
        return self.inner.scan(after, until, expected, previous)

    def rows(self, *args: Any) -> tuple[Any, ...]:
        return self.inner.rows(*args)

    def stored_chains(self, seqs: list[int]) -> dict[int, str]:
        return self.inner.stored_chains(seqs)


def test_every_row_is_read_and_checked_once_for_all_groups(
    team: Team, team_ledger: Ledger, tmp_path: Path
) -> None:
    """The rows the native checked read stepped through, counted at the reader (the real one):
    the team_ledger's rows once (and the parts whose rows the native parse was not sure of once
    more, as a source of the whole ledger reads them), however many groups."""
    counted = _CountedRows(team_ledger)
    stepped = counted.stepped
    groups = _groups(team, team_ledger)
    head = team_ledger.head()
    assert head is not None
    with open_group_sources(team_ledger, groups, tmp_path, rows=counted) as sources:
        read_by_open = sum(stepped)
        verifications = []
        for src in sources:
            verifications.append(src.verification())
            assert src.analytics.derived is not None
            assert src.analytics.derived.rows_checked == head.seq
        assert sum(stepped) == read_by_open  # no group read a row of its own
        assert sources.shared is not None and sources.shared.derived is not None
        derived = sources.shared.derived
    assert derived.rows_checked == head.seq
    assert read_by_open == head.seq + derived.rows_read_again
    # One verification of the whole ledger, shared by every group.
    assert verifications[0].ok and all(v is verifications[0] for v in verifications)
    # What a source opened per group reads, for comparison: every row per group.
    stepped.clear()
    for group in groups:
        open_source(team_ledger, tmp_path, verify=True, runs=group, rows=counted).close()
    assert sum(stepped) >= len(groups) * head.seq


def test_one_groups_tables_are_open_at_a_time_and_the_spill_goes(
    team: Team, team_ledger: Ledger, tmp_path: Path
) -> None:
    groups = _groups(team, team_ledger)
    with open_group_sources(team_ledger, groups, tmp_path) as sources:
        folder = sources.folder
        assert folder is not None and folder.is_dir()
        before: Source | None = None
        for index, src in enumerate(sources):
            owners = {int(path.name.split(".")[0]) for path in folder.iterdir()}
            # This group's files and those of the groups after it; the ones before are removed.
            assert index in owners and min(owners) == index, owners
            assert src.scalar("SELECT count(*) FROM kv_requests") > 0
            if before is not None:
                # The group before is closed: its connection, and the tables served on it, gone.
                with pytest.raises(duckdb.ConnectionException):
                    before.scalar("SELECT count(*) FROM kv_requests")
                assert before.analytics.held == frozenset()
            before = src
        assert before is not None
        with pytest.raises(duckdb.ConnectionException):
            before.scalar("SELECT 1")  # the last is closed once the iteration ends
        assert folder.is_dir() and not any(folder.iterdir())
    assert not folder.exists()


def test_repeating_text_is_spilled_dictionary_encoded_and_read_as_the_projections_text(
    team: Team, team_ledger: Ledger, tmp_path: Path
) -> None:
    """The spill files keep a projection's repeating text columns (run and block ids...) as Arrow
    dictionaries; a group's source serves them so, and DuckDB reads them with the projection's own
    types and values (the tables of a source opened for the group, above, compare equal)."""
    groups = _groups(team, team_ledger)
    with open_group_sources(team_ledger, groups, tmp_path) as sources:
        for group, src in zip(groups, sources, strict=True):
            derived = src.analytics.derived
            assert derived is not None
            responses = derived.held["kv_src_response_received"]
            assert pa.types.is_dictionary(responses.schema.field("run_id").type)
            # Ids of requests are (nearly) all distinct: left as they are.
            assert pa.types.is_string(responses.schema.field("request_id").type)
            described = dict(
                src.tuples("SELECT column_name, column_type FROM (DESCRIBE kv_src_response_received)")
            )
            assert described["run_id"] == described["request_id"] == "VARCHAR"
            runs = {str(r[0]) for r in src.tuples("SELECT DISTINCT run_id FROM kv_src_response_received")}
            assert src.scope is not None and runs and runs <= src.scope.runs and set(group) & runs


def test_a_tampered_row_blocks_every_groups_audit_naming_its_seq(team: Team, tmp_path: Path) -> None:
    url, seq = edited_copy(team, tmp_path, team.leaky)
    led = open_ledger(url, create=False)
    try:
        groups = _groups(team, led)
        whole = open_source(led, tmp_path, verify=True)
        try:
            (want,) = [f for f in audit_json(whole)["findings"] if f["code"] == "chain-broken"]
        finally:
            whole.close()
        assert str(seq) in want["detail"] and want["severity"] == "blocking"
        with open_group_sources(led, groups, tmp_path) as sources:
            assert sources.shared is None  # the check failed: each group is opened and verified apart
            for group, src in zip(groups, sources, strict=True):
                for run in group:
                    broken = [f for f in audit_json(src, run)["findings"] if f["code"] == "chain-broken"]
                    assert broken == [want], run
    finally:
        led.close()


def test_an_unknown_run_is_named_before_any_row_is_read(
    team: Team, team_ledger: Ledger, tmp_path: Path
) -> None:
    counted = _CountedRows(team_ledger)
    groups = [[team.screening], [team.leaky, "no-such-run"]]
    with pytest.raises(ValueError, match="no run 'no-such-run' in the ledger"):
        open_group_sources(team_ledger, groups, tmp_path / "snapshots", rows=counted)
    assert counted.stepped == []
    # The same counter sees the read of groups that are all in the ledger.
    known = [[team.screening], [team.leaky]]
    open_group_sources(team_ledger, known, tmp_path / "known", rows=counted).close()
    head = team_ledger.head()
    assert head is not None and sum(counted.stepped) >= head.seq
    assert not (tmp_path / "snapshots").exists()  # nor the snapshot proven
