"""Where reports read from: one DuckDB connection over the ledger's snapshot, with our views.

Reports never write the database. :class:`ledger.Analytics` keeps a Parquet
snapshot outside the database and serves it through an in-memory DuckDB of its
own; our views are tables and views of that database. The head a report names is the
snapshot's last event, so the numbers and the head always agree even while
others append.

The snapshot is proven against the database when the source opens (every file
re-hashed, every segment's last chain compared with the stored one); files
that fail are rebuilt and listed in :attr:`Source.snapshot_mismatches`, which
the audit reports as ``snapshot-mismatch``. With ``verify``, the snapshot
stops at the head read before the verification started, and the report's
tables are derived from the database's rows up to that head, not from the
cache's projection files. On SQLite with the native reader those rows are
checked link by link from GENESIS as they are read, and that read is the
verification of seq 1..head (the rows appended since are scanned after it);
elsewhere, or where a check fails, the rows are read beside a verification of
their own, which names the first bad seq as ``ledger verify`` does. A cache file
forged together with its recorded digest cannot reach a number that ``ledger
audit --publish`` or ``ledger attest`` publishes. Once the views are built, the
derived projections that only they read are dropped (the views hold copies); the
audit's re-derivations are built on a second cursor while the report is derived
(DuckDB works off the GIL), where DuckDB's memory leaves room for both: past half its
limit, or once it has moved tables to disk, two builds side by side can pin all of it at
once and fail (an out-of-memory error, not a spill), so they are built one after the other.

A whole ledger too large for its tables to be held at once is read group of runs by group of
runs: :func:`open_group_sources` reads and checks every row once, and gives one source per group
whose tables are those ``open_source(..., verify=True, runs=group)`` gives, one group's at a time.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import duckdb

import ledger as ledger_api
from ledger import Analytics, Event, Head, Ledger, Verification, open_ledger
from ledger._analytics import RunScope, checked_source
from ledger._partition import GroupAnalytics, Partition
from ledger._row_sources import RowSource
from ledger._snapshot import Mismatch, Proof
from ledger._verify import read_heads, verify_after

from ._gc import no_cycle_collection
from ._views import create_audit_views, create_views, projections, release_extractions

T = TypeVar("T")

# The kinds a report about some runs reads for those runs alone (and rows without a run): a
# request, its response, hit record, assertions and scrapes, and the sessions and windows that
# group them, nearly every row of a ledger. Every other kind (runs, blocks, launches, plans,
# probes, checkpoints, fixtures, certificates) is read ledger-wide, as it is few rows and what
# a run's checks look up across runs (a probe covering its config, a fixture it was sent). A view or
# check that reads one of these kinds across runs must widen run_scope: tests/reports/
# test_run_scope.py derives every run of a mixed ledger both ways and fails on any difference.
SCOPED_KINDS = frozenset(
    {
        "request.sent",
        "response.received",
        "hits.observed",
        "assertion.evaluated",
        "metrics.scraped",
        "session.finished",
        "window.finished",
    }
)


def run_scope(ledger: Ledger, runs: Collection[str], until_seq: int | None = None) -> RunScope:
    """What a report and audit of ``runs`` derive from: the observations of those runs, of every
    run linked to one of them by replay (either way, and on: ``--pool-replays`` pools a run with
    its replays as one series), of every validation run (the service regression of the
    configs a run measures), and of the run of each config's latest isolation certificate
    recorded as passed where one of them launched that config without a certificate of its own
    (the audit re-derives that certificate from its run's probes); see :data:`SCOPED_KINDS`. Read from the
    runs' start events, certificates and launches, which the derivation then checks with every
    other row (a scope told wrong by an edited row leaves a certificate out: it then certifies
    nothing)."""
    return Started.read(ledger, until_seq).scope(runs)


@dataclass(frozen=True)
class Started:
    """The ledger's runs as their run.started events say (read once, for as many scopes or
    families as are asked of them): each run's start seq and data, in the order they started.
    A scope also asks the ledger's isolation certificates and the scoped runs' launched config
    digests (read when first asked, and kept), which tell what runs certify the configs of a run
    without a certificate of its own."""

    runs: dict[str, tuple[int, dict[str, Any]]]
    ledger: Ledger = field(compare=False, repr=False)
    until_seq: int | None = None
    _read: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # Past this many runs not yet asked, every run's launches are read at once (one query by kind)
    # rather than run by run (one indexed query each).
    _LAUNCHES_RUN_BY_RUN = 16

    @classmethod
    def read(cls, ledger: Ledger, until_seq: int | None = None) -> Started:
        return cls(
            {
                event.run_id: (event.seq, event.data)
                for event in ledger.events(kind="run.started", until_seq=until_seq)
                if event.run_id is not None
            },
            ledger,
            until_seq,
        )

    def _events(self, kind: str, run_id: str | None = None) -> Iterator[Event]:
        return self.ledger.events(kind=kind, run_id=run_id, until_seq=self.until_seq)

    def certificates(self) -> dict[str, tuple[set[str], str | None]]:
        """Each config digest's certificates: the runs that took one, and the run of the latest
        recorded as passed (None: none is)."""
        if "certificates" not in self._read:
            found: dict[str, tuple[set[str], str | None]] = {}
            for event in self._events("isolation.certified"):
                config = event.data.get("config_sha256")
                if event.run_id is not None and isinstance(config, str):
                    runs, latest = found.get(config, (set(), None))
                    runs.add(event.run_id)
                    found[config] = (runs, event.run_id if event.data.get("passed") is True else latest)
            self._read["certificates"] = found
        certificates: dict[str, tuple[set[str], str | None]] = self._read["certificates"]
        return certificates

    def launched(self, runs: Collection[str], every_run: bool = False) -> dict[str, set[str]]:
        """The config digests each of ``runs`` launched in a block (deployment.launched with a
        block id: what an ON block's results are judged by); with ``every_run`` every run's are
        read at once (for the scopes of many groups)."""
        known: dict[str, set[str]] = self._read.setdefault("launched", {})
        missing = [run for run in runs if run not in known]
        if missing and (every_run or len(missing) > self._LAUNCHES_RUN_BY_RUN):
            for run in self.runs:
                known.setdefault(run, set())
            for event in self._events("deployment.launched"):
                config = event.data.get("config_sha256")
                if event.run_id is not None and event.block_id is not None and isinstance(config, str):
                    known.setdefault(event.run_id, set()).add(config)
        else:
            for run in missing:
                known[run] = {
                    e.data["config_sha256"]
                    for e in self._events("deployment.launched", run)
                    if e.block_id is not None and isinstance(e.data.get("config_sha256"), str)
                }
        return {run: known.get(run, set()) for run in runs}

    def certifying(self, runs: Collection[str]) -> set[str]:
        """The runs whose certificate certifies a config that one of ``runs`` launched with no
        certificate of its own for it: the config's latest certificate recorded as passed (audit:
        isolation-missing re-derives that one)."""
        certificates = self.certificates()
        if not certificates:
            return set()
        found: set[str] = set()
        for run, configs in self.launched(runs).items():
            for config in configs:
                certified, latest = certificates.get(config, (set(), None))
                if run not in certified and latest is not None:
                    found.add(latest)
        return found

    def linked(self) -> dict[str, set[str]]:
        """Each run's runs linked to it by replay, either way (a replayed run may be absent)."""
        links: dict[str, set[str]] = {}
        for run, (_, data) in self.runs.items():
            original = data.get("replay_of")
            if isinstance(original, str):
                links.setdefault(run, set()).add(original)
                links.setdefault(original, set()).add(run)
        return links

    def family(self, runs: Collection[str], links: dict[str, set[str]] | None = None) -> set[str]:
        """``runs`` and every run linked to one of them by replay, and on."""
        links = self.linked() if links is None else links
        found, todo = set(), list(runs)
        while todo:
            run = todo.pop()
            if run not in found:
                found.add(run)
                todo.extend(links.get(run, ()))
        return found

    def scope(self, runs: Collection[str], links: dict[str, set[str]] | None = None) -> RunScope:
        """:func:`run_scope` of ``runs``: their family, every validation run, and the runs whose
        certificates certify the family's configs that it has none of its own for."""
        validation = {run for run, (_, data) in self.runs.items() if data.get("experiment") == "validation"}
        family = self.family(runs, links)
        return RunScope(SCOPED_KINDS, frozenset(family | validation | self.certifying(family)))

    def families(self) -> list[list[str]]:
        """The started runs in families (a run with every run linked to it by replay), each in
        start order, the families in the order of their first run's start."""
        links, placed = self.linked(), set()
        out = []
        for run in self.runs:
            if run not in placed:
                family = sorted(self.family([run], links) & self.runs.keys(), key=lambda r: self.runs[r][0])
                placed.update(family)
                out.append(family)
        return out


@dataclass
class Source:
    """A ledger opened for reading, its DuckDB connection and the head derived from."""

    ledger: Ledger
    analytics: Analytics
    con: duckdb.DuckDBPyConnection
    head: Head | None
    _cache: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _verification: Future[Verification] | None = None
    _rederivation: Future[float] | None = None
    _once: dict[str, Any] = field(default_factory=dict)
    # Whether the audit's re-derivations were built beside the derivation (started at open, and
    # not built again alone after running out of memory there).
    rederived_beside: bool = False
    # The runs whose observations the tables hold (open_source's ``runs``), or None for all.
    scope: RunScope | None = None

    def require(self, *runs: str | None) -> None:
        """Refuse to derive about ``runs`` (None: the whole ledger) from tables that hold only
        other runs' observations: the figures would be silently short."""
        if self.scope is None:
            return
        missing = [run for run in runs if run is None or run not in self.scope.runs]
        if missing:
            what = "the whole ledger" if None in missing else "run " + ", ".join(map(str, missing))
            raise ValueError(f"this source was opened for runs {sorted(self.scope.runs)}, not for {what}")

    def once(self, key: str, build: Callable[[], T]) -> T:
        """``build()``, run once per source and key: for what several checks derive from the same
        tables (the snapshot under a source does not change)."""
        if key not in self._once:
            self._once[key] = build()
        value: T = self._once[key]
        return value

    def rederive(self) -> float:
        """Build the audit's re-derivations (reports/_views.py AUDIT_VIEWS) once per source
        (started at open when asked: then this waits for them); the seconds building took."""
        if self._rederivation is not None:
            try:
                return self._rederivation.result()
            except duckdb.OutOfMemoryException:
                # Beside the derivation, the two pinned all of DuckDB's memory between them (its
                # statements fail whole, so nothing of theirs is left): built again, alone.
                self.rederived_beside = False
        self._rederivation = _settled(lambda: _build_alone(self.con))
        return self._rederivation.result()

    def verification(self) -> Verification:
        """The ledger's full chain verification, run once per source (started at open when
        asked: it then runs beside the views, off the GIL on SQLite)."""
        if self._verification is None:
            self._verification = _settled(lambda: ledger_api.verify(self.ledger))
        return self._verification.result()

    @property
    def snapshot_proof(self) -> Proof:
        """What proving the snapshot checked when the source opened, and what it cost."""
        return self.analytics.proof

    @property
    def snapshot_mismatches(self) -> list[Mismatch]:
        """Snapshot files that differed from what was proven when they were written (rebuilt)."""
        return list(self.analytics.proof.mismatches)

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows of ``sql`` as dicts (ORDER BY in ``sql`` keeps them deterministic)."""
        cursor = self.con.execute(sql, params or {})
        names = [d[0] for d in cursor.description or []]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def tuples(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` as tuples, for large results read positionally."""
        return self.con.execute(sql, params or {}).fetchall()

    def rows_once(self, sql: str) -> list[dict[str, Any]]:
        """:meth:`rows`, run once per source: for small ledger-wide queries that the report
        and the audit both ask (the snapshot under a source does not change). Each call
        gets its own copies of the rows."""
        if sql not in self._cache:
            self._cache[sql] = self.rows(sql)
        return [dict(row) for row in self._cache[sql]]

    def scalar(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        row = self.con.execute(sql, params or {}).fetchone()
        return row[0] if row else None

    def close(self) -> None:
        # Work started at open finishes before the ledger and the connection close; its error,
        # if any, is raised by verification() or rederive(), never from here (close runs in
        # finally blocks).
        started: list[Future[Any]] = [f for f in (self._verification, self._rederivation) if f is not None]
        wait(started)
        self.analytics.close()


def _settled(work: Callable[[], T]) -> Future[T]:
    """``work()`` run here, as a finished future: its result, or the error it raised (raised
    again by ``result()``). A future left without either would keep :meth:`Source.close`, which
    waits for every future, waiting for ever."""
    future: Future[T] = Future()
    try:
        future.set_result(work())
    except Exception as error:
        future.set_exception(error)
    return future


def _verify_in_background(ledger: Ledger) -> Future[Verification]:
    executor = ThreadPoolExecutor(1, thread_name_prefix="kvledger-verify")
    try:
        return executor.submit(ledger_api.verify, ledger, beside_other_work=True)
    finally:
        executor.shutdown(wait=False)


def _build_audit_views(con: duckdb.DuckDBPyConnection) -> float:
    started = time.perf_counter()
    create_audit_views(con)
    return time.perf_counter() - started


def _build_alone(con: duckdb.DuckDBPyConnection) -> float:
    """:func:`_build_audit_views` with nothing beside it; a statement that still runs out of
    memory is built again on one thread, and what is left after it. DuckDB's joins and
    aggregates pin blocks per thread, and pinned blocks are not moved to disk: on a 10M-event
    ledger ``kv_rederived`` failed alone under the 1 GB limit on two threads, and took 22 s on
    one."""
    started = time.perf_counter()
    try:
        create_audit_views(con)
    except duckdb.OutOfMemoryException:
        ((threads,),) = con.execute("SELECT current_setting('threads')").fetchall()
        con.execute("SET threads = 1")
        try:
            create_audit_views(con, skip_built=True)
        finally:
            con.execute(f"SET threads = {int(threads)}")
    return time.perf_counter() - started


# DuckDB's memory units as its settings print them (``953.6 MiB``).
_MEMORY_UNITS = {
    "byte": 1,
    "bytes": 1,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}


def room_beside(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether DuckDB's memory leaves room to build the audit's re-derivations beside the
    derivation: nothing moved to disk, and at most half the memory limit in use. Past that,
    the two builds side by side can each pin what the other needs and one of them fails."""
    # One statement, fetched whole: a result left half-read on the source's connection would make
    # DuckDB refuse a later register or unregister there.
    ((used, spilled, setting),) = con.execute(
        "SELECT coalesce(sum(memory_usage_bytes), 0), coalesce(sum(temporary_storage_bytes), 0), "
        "current_setting('memory_limit') FROM duckdb_memory()"
    ).fetchall()
    match = re.fullmatch(r"([\d.]+)\s*(\w+)", str(setting).strip())
    if match is None or match.group(2) not in _MEMORY_UNITS:
        return False  # a limit not read: one after the other, which fits whatever it is
    limit = float(match.group(1)) * _MEMORY_UNITS[match.group(2)]
    return int(spilled) == 0 and int(used) <= limit / 2


def _rederive_in_background(cursor: duckdb.DuckDBPyConnection) -> Future[float]:
    """Build the audit's re-derivations on ``cursor`` (a connection of its own to the source's
    in-memory database) on a thread of their own; closes it when done."""

    def build() -> float:
        try:
            return _build_audit_views(cursor)
        finally:
            cursor.close()

    executor = ThreadPoolExecutor(1, thread_name_prefix="kvledger-rederive")
    try:
        return executor.submit(build)
    finally:
        executor.shutdown(wait=False)


def open_source(
    url_or_ledger: str | Ledger,
    snapshot_root: Path | None = None,
    until_seq: int | None = None,
    verify: bool = False,
    rederive_beside: bool | None = None,
    runs: Collection[str] | None = None,
    rows: RowSource | None = None,
) -> Source:
    """Open a ledger for reading and prepare the report views.

    ``until_seq`` derives as of that event (attestation checks re-derive at
    the attested head even after the ledger has grown). ``verify`` starts the
    full chain verification now, beside the views, and once the views are built,
    the audit's re-derivations beside whatever the caller does next (the audit and
    ``ledger attest`` ask for it). ``rederive_beside``: build those beside the derivation (True)
    or when the audit first asks, after it (False); by default beside where DuckDB's memory
    leaves room for both (:func:`room_beside`). ``runs``: derive the observations of those runs
    only (:func:`run_scope`), for a report or audit of them; every row is still verified.
    ``rows``: where a verified read takes the rows it checks (default: the ledger's own,
    ledger/_row_sources.py); a test double wraps the real one to count what is read.
    """
    ledger = open_ledger(url_or_ledger, create=False) if isinstance(url_or_ledger, str) else url_or_ledger
    with no_cycle_collection():
        return _open(ledger, snapshot_root, until_seq, verify, rederive_beside, runs, rows)


def _open(
    ledger: Ledger,
    snapshot_root: Path | None,
    until_seq: int | None,
    verify: bool,
    rederive_beside: bool | None,
    runs: Collection[str] | None,
    rows: RowSource | None = None,
) -> Source:
    started, verified_from, heads_read = None, None, None
    views = projections()
    checked_path = checked_source(ledger, views, rows) if verify else None
    if verify:
        # The verification reads the ledger's last seq after this: it covers at least this head,
        # and the snapshot goes no further.
        head_now = ledger.head()
        verified_from = head_now.seq if head_now else 0
        if checked_path is None:
            started = _verify_in_background(ledger)
        else:
            # The rows the tables are derived from are checked as they are read: that read is the
            # verification of seq 1..head, and only what was appended since is scanned after it.
            heads_read = read_heads(ledger)
    # Verified sources derive their tables from the database's rows, never from the cache's
    # projection files: those are proven only against digests kept beside them.
    scope = None if runs is None else run_scope(ledger, runs, until_seq)
    analytics = Analytics(
        ledger, snapshot_root, views, up_to_seq=verified_from, from_rows=verify, scope=scope, rows=rows
    )
    con = analytics.connection()
    if checked_path is not None and heads_read is not None:
        if analytics.checked is not None:
            checked = analytics.checked
            started = _settled(lambda: verify_after(checked_path, heads_read, checked))
        else:
            # A check failed (or nothing to read): the tables came from the rows as the database
            # holds them, and the ledger is verified apart, which names the first bad seq.
            started = _verify_in_background(ledger)
    return _with_views(ledger, analytics, con, until_seq, verify, rederive_beside, started, scope)


def _with_views(
    ledger: Ledger,
    analytics: Analytics,
    con: duckdb.DuckDBPyConnection,
    until_seq: int | None,
    verify: bool,
    rederive_beside: bool | None,
    verification: Future[Verification] | None,
    scope: RunScope | None,
) -> Source:
    """The source of ``analytics``' projections (derived on ``con``): the views built, the
    projections only they read released, the head they were derived at, and the audit's
    re-derivations started beside where asked and there is room."""
    create_views(con, until_seq, hold=analytics.hold_view)
    for name in release_extractions(con, analytics.held):
        analytics.release(name)
    derived = analytics.derived
    if derived is not None and until_seq is None:
        head = Head(derived.head_seq, derived.head_chain) if derived.head_chain is not None else None
    elif derived is not None and until_seq is not None:
        # Tables from the database's rows: the head as of ``until_seq`` is the database's own row,
        # which the derivation read (the cache may not hold it: such a reader never builds one).
        head = ledger.head(at_or_before=min(until_seq, derived.head_seq))
    else:
        bound = "" if until_seq is None else f"WHERE seq <= {int(until_seq)}"
        row = con.execute(f"SELECT seq, chain FROM events {bound} ORDER BY seq DESC LIMIT 1").fetchone()
        head = Head(int(row[0]), str(row[1])) if row else None
    # Beside the derivation where DuckDB has the memory for both; otherwise the audit builds
    # them when it first asks (Source.rederive), after the derivation.
    beside = verify and (room_beside(con) if rederive_beside is None else rederive_beside)
    rederivation = _rederive_in_background(analytics.cursor()) if beside else None
    return Source(
        ledger,
        analytics,
        con,
        head,
        _verification=verification,
        _rederivation=rederivation,
        rederived_beside=rederivation is not None,
        scope=scope,
    )


def open_group_sources(
    ledger: Ledger,
    groups: Sequence[Collection[str]],
    snapshot_root: Path | None = None,
    rows: RowSource | None = None,
) -> GroupSources:
    """One verified source per group of runs, from ONE checked read of the ledger's rows.

    Each source, as iterated (in the order of ``groups``), has the tables that
    ``open_source(ledger, snapshot_root, verify=True, runs=group)`` derives (the same rows, in seq
    order, of the same names and types), its :attr:`Source.scope` that group's
    :func:`run_scope`, and the head that read verified; its :meth:`Source.verification` is that
    read's verification of the whole ledger (one, shared by every group) and its
    :meth:`Source.rederive` builds the audit's re-derivations of its own tables. The snapshot is
    proven once, by the read (its proof and mismatches are every group's).

    Every row is read and checked once in all (ledger/_analytics.py ``derive_checked``; a part with
    a row the native parse is not sure of is read again for DuckDB to parse, as in any checked
    read, and no more for many groups than for one): the rows of :data:`SCOPED_KINDS` go to the
    groups whose scope keeps them, written to spill files (Arrow IPC, in a private temporary
    folder) and read back memory-mapped when the group's source is made; the projections of the
    other kinds are held once and served to every group (ledger/_partition.py). Making a group's
    source closes the one before it and removes its files, so one group's tables are in memory at
    a time; closing the :class:`GroupSources` closes the last and removes the folder.

    Where the checked native read is not available (the driver path, a database the native reader
    does not read) or a chunk's check fails (a row edited, deleted or moved), each group's source
    is ``open_source(ledger, snapshot_root, verify=True, runs=group)`` instead: a read of every row
    per group, slow but the same tables, and a verification that names the first bad seq as
    ``ledger verify`` does.

    ``rows``: where the read takes the rows it checks, as :func:`open_source` takes it.

    Raises ValueError, before any row is read, for a run of ``groups`` that is not in the ledger.
    """
    listed = [list(dict.fromkeys(group)) for group in groups]
    known = {
        event.run_id
        for event in ledger.events(kind=["run.started", "import.recorded"])
        if event.run_id is not None
    }
    for index, group in enumerate(listed):
        for run in group:
            if run not in known:
                raise ValueError(f"no run {run!r} in the ledger (group {index})")
    with no_cycle_collection():
        sources = GroupSources(ledger, listed, snapshot_root, rows)
        try:
            sources.read()
        except BaseException:
            sources.close()
            raise
        return sources


class GroupSources:
    """The sources of :func:`open_group_sources`: iterated once, each made as it is asked for and
    closed when the next is; a context manager whose exit closes the last and removes every
    spill file."""

    def __init__(
        self,
        ledger: Ledger,
        groups: list[list[str]],
        snapshot_root: Path | None,
        rows: RowSource | None = None,
    ) -> None:
        self.ledger = ledger
        self.rows = rows
        self.groups = groups
        self.snapshot_root = snapshot_root
        started = Started.read(ledger)
        links = started.linked()
        if started.certificates():
            started.launched(started.runs, every_run=True)  # one read for every group's scope
        self.scopes = [started.scope(group, links) for group in groups]
        # The spill files' folder (beside DuckDB's own spill folders), None until the read.
        self.folder: Path | None = None
        # The one checked read's reader (its snapshot, figures and check), its rows by group, and
        # its verification; all None where each group's source is opened apart instead.
        self.shared: Analytics | None = None
        self._partition: Partition | None = None
        self._verification: Future[Verification] | None = None
        self._current: Source | None = None
        self._iterated = False

    def read(self) -> None:
        """Read and check every row once, splitting the projections' rows by group (or, where that
        read is not available or fails, leave each group to :func:`open_source`)."""
        views = projections()
        checked_path = checked_source(self.ledger, views, self.rows)
        if checked_path is None or not self.groups:
            return
        # As open_source: the snapshot stops at the head read before the verification starts, and
        # what was appended after the checked read is scanned after it.
        head_now = self.ledger.head()
        heads_read = read_heads(self.ledger)
        self.folder = Path(tempfile.mkdtemp(prefix="kvledger-groups-"))
        # Removed on close, or when this object goes (sources left open, the interpreter ending).
        weakref.finalize(self, shutil.rmtree, self.folder, True)
        partition = Partition(self.folder, self.scopes, views)
        # Every row is kept by the read and handed to the partition, which drops (and counts) those
        # of a run no group holds: a report of every run from the groups would miss them.
        shared = Analytics(
            self.ledger,
            self.snapshot_root,
            views,
            up_to_seq=head_now.seq if head_now else 0,
            from_rows=True,
            sink=partition,
            rows=self.rows,
        )
        try:
            shared.connection()
        finally:
            shared.close()  # its own tables are empty: the rows went to the partition
        checked = shared.checked
        if checked is None:
            # A check failed (or nothing to read): each group is opened apart, and verified there.
            partition.close()
            return
        partition.finish()
        self.shared, self._partition = shared, partition
        self._verification = _settled(lambda: verify_after(checked_path, heads_read, checked))

    def __iter__(self) -> Iterator[Source]:
        if self._iterated:
            raise RuntimeError("a group's sources are made once: open them again to read them again")
        self._iterated = True
        for index in range(len(self.groups)):
            self._close_current()
            self._current = self._open(index)
            yield self._current
        self._close_current()

    def _open(self, index: int) -> Source:
        if self.shared is None or self._partition is None:
            return open_source(
                self.ledger, self.snapshot_root, verify=True, runs=self.groups[index], rows=self.rows
            )
        partition = self._partition
        analytics = GroupAnalytics(
            self.shared, self.scopes[index], partition.tables(index), lambda: partition.discard(index)
        )
        try:
            with no_cycle_collection():
                con = analytics.connection()
                return _with_views(
                    self.ledger, analytics, con, None, True, None, self._verification, self.scopes[index]
                )
        except BaseException:
            analytics.close()
            raise

    def _close_current(self) -> None:
        if self._current is not None:
            current, self._current = self._current, None
            current.close()

    def close(self) -> None:
        """Close the source in use, if any, and remove every spill file."""
        try:
            self._close_current()
        finally:
            if self._partition is not None:
                self._partition.close()
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def rows_of_no_group(self) -> int:
        """Rows of the scoped kinds whose run no group's scope holds (checked, not kept: a report of
        every run from these groups would miss them); 0 where each group is opened apart."""
        return 0 if self._partition is None else self._partition.rows_of_no_group

    def __enter__(self) -> GroupSources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
