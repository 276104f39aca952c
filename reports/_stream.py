"""The whole ledger's report and audit, derived group of runs by group of runs.

A team ledger's tables outgrow memory long before its report does: at 10M events every
projection held at once is several times DuckDB's limit, and the views, the derivation
and the re-derivations then move tables to disk and back. Split into groups of runs (a
run with every run linked to it by replay in one group, in the order they started), each
group's observations make a source of their own (:func:`reports._source.open_source` with
``runs``, which keeps the validation runs and the ledger-wide kinds whole), whose tables
are derived, reported, audited and dropped before the next group's are made.

Each group's parts keep the rows of the runs it owns (:meth:`ReportParts.owned`): a run's
rows all come from the one group that holds it whole; rows and findings without a run,
or of a run no group owns, come from the first group, whose tables hold them as every
group's do. Merged (:func:`reports._derive.merge_report`), they are the report the whole
ledger's tables give, byte for byte (tests/reports/test_stream.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger import Analytics, Head, Ledger
from ledger._snapshot_rows import single_kind

from ._audit import Finding, audit, audit_of_source
from ._derive import ReportParts, derive_report, merge_report, report_parts
from ._gc import no_cycle_collection
from ._source import SCOPED_KINDS, GroupSources, Source, Started, open_group_sources, open_source
from ._views import projections

__all__ = ["ReportAndAudit", "groups_of_runs", "report_and_audit", "report_and_audit_by_groups", "streams"]


def groups_of_runs(ledger: Ledger, events_per_group: int, until_seq: int | None = None) -> list[list[str]]:
    """The ledger's runs in groups of about ``events_per_group`` events, in the order they started:
    a run and every run linked to it by replay (either way, and on) in one group, as
    :func:`reports._source.run_scope` links them; a run's size is told by the seq of the next
    run's start (runs that overlap in time are told roughly; the groups only bound memory)."""
    if events_per_group < 1:
        raise ValueError(f"events_per_group must be at least 1, not {events_per_group}")
    started = Started.read(ledger, until_seq)
    head = ledger.head(at_or_before=until_seq) if until_seq is not None else ledger.head()
    starts = [seq for seq, _ in started.runs.values()]
    ends = [*starts[1:], (head.seq if head is not None else 0) + 1]
    size = {run: end - start for run, start, end in zip(started.runs, starts, ends, strict=True)}
    families = started.families()
    # As many groups as events_per_group asks for, about equal: the last is not a remnant.
    weights = [sum(size[r] for r in members) for members in families]
    target = sum(weights) / max(1, -(-sum(weights) // events_per_group))
    groups: list[list[str]] = []
    events = 0.0
    for weight, members in zip(weights, families, strict=True):
        if not groups or (events > 0 and events + weight / 2 > target):
            groups.append([])
            events = 0.0
        groups[-1].extend(members)
        events += weight
    return groups


def report_and_audit_by_groups(
    sources: Iterable[Source],
    groups: Sequence[Collection[str]],
    run: str | None = None,
    pool_replays: bool = False,
    with_report: bool = True,
    with_audit: bool = True,
) -> tuple[dict[str, Any] | None, list[Finding]]:
    """The report and the audit of every run, from ``sources``: one per group of ``groups``, in
    that order, each holding its group's observations (every run linked to one of its runs by
    replay in the same group). Each source is read as it comes (and may be closed once the next
    is asked for). ``run``: the report's scope as :func:`reports._derive.derive_report` names it
    (None for the whole ledger). ``with_report``: False for the audit alone (the report None);
    ``with_audit``: False for the report alone (no findings)."""
    owner: dict[str, int] = {}
    for index, group in enumerate(groups):
        for member in group:
            if owner.setdefault(member, index) != index:
                raise ValueError(f"run {member} is in two groups ({owner[member]} and {index})")
    parts: list[ReportParts] = []
    findings: list[Finding] = []
    count = 0
    with no_cycle_collection():
        for index, src in enumerate(sources):
            if index >= len(groups):
                raise ValueError(f"more sources than the {len(groups)} groups")
            keep = _owned_by(owner, index)
            if with_report:
                parts.append(report_parts(src, run, pool_replays).owned(keep))
            if with_audit:
                findings.extend(f for f in audit_of_source(src, run) if keep(f.run_id))
            count += 1
        if count != len(groups) or not groups:
            raise ValueError(f"{count} sources for {len(groups)} groups")
        # Still paused: the groups' parts are millions of live objects, which each collection the
        # merge's fresh rows set off would walk (at 10M events 1.40 s of merge against 0.23 s).
        report = merge_report(parts, run) if with_report else None
        return report, sorted(findings, key=Finding.sort_key)


def _owned_by(owner: dict[str, int], index: int) -> Callable[[str | None], bool]:
    """Whether a row of a run is the ``index``-th group's to give: its run is in that group, or
    the group is the first and the row has no run or one of no group."""
    return lambda run: owner.get(run, 0) == index if run is not None else index == 0


# Past this many events, a whole-ledger report and audit derive group of runs by group of runs:
# up to 2M events the checked read's tables are held as it made them (ledger/_analytics.py
# _HELD_ROWS_MAX); past it they are copied into DuckDB, which moves them to disk past its limit.
STREAM_PAST_EVENTS = 2_000_000
# At most 1.6M events a group (as many groups as that asks for, about equal: at 10M, seven of
# 1.43M). Each group derives the ledger-wide projections again (fixtures, blocks, launches...), so
# fewer groups cost less: at 10M 27.19 and 28.11 s against 30.50 and 30.41 s in groups of about
# 1M, peak RSS 1,597 and 1,628 MB against 1,266 and 1,273 MB (six groups of 1.67M: 1,737 MB).
EVENTS_PER_GROUP = 1_600_000


@dataclass
class ReportAndAudit:
    """The whole ledger's report and audit findings, and the verified head they were derived at."""

    report: dict[str, Any] | None  # None: asked for the audit alone
    findings: list[Finding]
    head: Head | None
    groups: int  # how many groups of runs the tables were derived in (1: the whole ledger's at once)


def streams(ledger: Ledger, verify: bool = True) -> bool:
    """Whether a whole-ledger report and audit derive group of runs by group of runs by default:
    verified (every row checked as read, the tables from the database's rows) and past
    :data:`STREAM_PAST_EVENTS`. A report from the snapshot's proven projection files reads them
    where they lie, whatever the ledger's size: by groups it took 35.80 s against 15.18 s at 10M
    events (763 against 1,407 MB; docs/performance.md), so it groups only when asked."""
    head = ledger.head()
    return verify and head is not None and head.seq > STREAM_PAST_EVENTS


def report_and_audit(
    ledger: Ledger,
    snapshot_root: Path | None = None,
    verify: bool = True,
    pool_replays: bool = False,
    events_per_group: int | None = None,
    with_report: bool = True,
    with_audit: bool = True,
) -> ReportAndAudit:
    """The whole ledger's report and audit. Up to :data:`STREAM_PAST_EVENTS` events (or with
    ``events_per_group`` None and a small ledger) from the whole ledger's tables at once; past it,
    group of runs by group of runs (:func:`report_and_audit_by_groups`), the same bytes in
    bounded memory. ``verify``: every row checked as it is read (the tables then come from the
    database's rows, never from the cache), as ``ledger audit`` and ``ledger report --html`` read."""
    groups: list[list[str]] = []
    if events_per_group is not None or streams(ledger, verify):
        groups = groups_of_runs(ledger, events_per_group or EVENTS_PER_GROUP)
    if len(groups) >= 2 and (verify or not _runs_never_started(ledger, snapshot_root)):
        heads: list[Head | None] = []
        with group_sources(ledger, groups, snapshot_root, verify) as sources:
            # Observations of a run that never started (no run.started) belong to no group: the
            # whole ledger's tables hold them, so they derive it.
            if not isinstance(sources, GroupSources) or not sources.rows_of_no_group:
                report, findings = report_and_audit_by_groups(
                    _noting_heads(sources, heads), groups, None, pool_replays, with_report, with_audit
                )
                if len(set(heads)) != 1:
                    raise RuntimeError(
                        f"the groups were derived at different heads: {sorted(map(str, heads))}"
                    )
                return ReportAndAudit(report, findings, heads[0], len(groups))
    src = open_source(ledger, snapshot_root, verify=verify)
    try:
        report = derive_report(src, None, pool_replays=pool_replays) if with_report else None
        return ReportAndAudit(report, audit(src) if with_audit else [], src.head, 1)
    finally:
        src.close()


def _runs_never_started(ledger: Ledger, snapshot_root: Path | None) -> int:
    """Rows of the kinds a group keeps by run whose run has no run.started, in the snapshot's proven
    projection files (what a report from the snapshot reads): no group would hold them. (A verified
    read counts them as it splits the rows: :attr:`GroupSources.rows_of_no_group`.)"""
    analytics = Analytics(ledger, snapshot_root, projections())
    try:
        con = analytics.connection()
        scoped = [
            name
            for name, sql in projections().items()
            if single_kind(sql) in SCOPED_KINDS
            and "run_id" in {row[0] for row in con.execute(f"DESCRIBE {name}").fetchall()}
        ]
        rows = " UNION ALL ".join(f"SELECT run_id FROM {name} WHERE run_id IS NOT NULL" for name in scoped)
        ((count,),) = con.execute(
            f"SELECT count(*) FROM ({rows}) WHERE run_id NOT IN (SELECT run_id FROM kv_src_run_started)"
        ).fetchall()
        return int(count)
    finally:
        analytics.close()


def _noting_heads(sources: Iterable[Source], heads: list[Head | None]) -> Iterator[Source]:
    for src in sources:
        heads.append(src.head)
        yield src


@contextlib.contextmanager
def group_sources(
    ledger: Ledger, groups: Sequence[Collection[str]], snapshot_root: Path | None, verify: bool
) -> Iterator[Iterable[Source]]:
    """One source per group, each closed before the next is made. Verified: every row read and
    checked once for all groups (:func:`reports._source.open_group_sources`); from the snapshot:
    each group's source reads the proven projection files, keeping its runs' rows."""
    if verify:
        with open_group_sources(ledger, groups, snapshot_root) as verified:
            yield verified
        return

    def each() -> Generator[Source]:
        for group in groups:
            src = open_source(ledger, snapshot_root, runs=group)
            try:
                yield src
            finally:
                src.close()

    sources = each()
    try:
        yield sources
    finally:
        sources.close()
