"""Verification: recompute every digest and chain link, check seq and recorded heads.

Each link is checked against the *stored* chain of the row before it, so any
range of rows can be verified on its own: large ledgers are split into seq
ranges checked side by side, and the first bad seq is the smallest one any
range reports (a range also reports rows missing at its end, so a gap at a
boundary is not lost).

SQLite files are checked by the native scanner (``ledger/_cverify.c``, built
at install where a C compiler and the SQLite and OpenSSL headers exist) in
threads; other databases, or an install without it, by :func:`scan_rows` in
worker processes. ``KVLEDGER_VERIFIER=python`` forces the Python path.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import re
import sqlite3
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ._events import GENESIS
from ._events import _json_str as _quoted

_cverify: ModuleType | None
try:
    from . import _cverify
except ImportError:  # installed without a C compiler or headers: the Python path serves
    _cverify = None

# Below this many events a single process is faster than starting workers.
PARALLEL_THRESHOLD = 200_000
# The native scanner splits at this size; threads start in microseconds.
NATIVE_PARALLEL_THRESHOLD = 50_000
# seq is never below this (SQLite's smallest integer): "no lower bound" for the native scan.
_NO_LOWER_BOUND = -(2**63)


@dataclass(frozen=True)
class Verification:
    """What ``verify`` found. ``first_bad_seq`` is None when ``ok``."""

    ok: bool
    count: int
    first_bad_seq: int | None
    problem: str | None
    head_seq: int | None
    head_chain: str | None


@dataclass(frozen=True)
class RangeResult:
    """The outcome of checking the rows of one seq range."""

    last_seq: int
    last_chain: str
    bad_seq: int | None = None
    problem: str | None = None


_DELETED = "seq {seq} found where {expected} was expected (rows deleted or reordered)"
_EDITED = "digest does not match the recomputed canonical envelope (content edited)"
_RELINKED = "chain does not follow from the previous link (rows edited, inserted or reordered)"


# Printable ASCII but the quote and the backslash: JSON needs no escape for these.
_SAFE = re.compile(r"[ !#-\[\]-~]*")


def _envelope_text(row: tuple[Any, ...]) -> str:
    """The canonical envelope of a stored row whatever its strings hold (the slow path)."""
    _, id_, ts, kind, run_id, block_id, data, _, _ = row
    return (
        f'{{"block_id":{_quoted(block_id)},"data":{data},"id":{_quoted(id_)},'
        f'"kind":{_quoted(kind)},"run_id":{_quoted(run_id)},"ts":{_quoted(ts)}}}'
    )


def scan_rows(rows: Iterable[tuple[Any, ...]], start_seq: int, previous_chain: str) -> RangeResult:
    """Check rows (in seq order) from ``start_seq`` on, each against the chain before it."""
    expected, chain = start_seq, previous_chain
    sha256 = hashlib.sha256
    safe = _SAFE.fullmatch
    for row in rows:
        seq, id_, ts, kind, run_id, block_id, data, digest, stored_chain = row
        if seq != expected:
            return RangeResult(
                expected - 1, chain, min(expected, int(seq)), _DELETED.format(seq=seq, expected=expected)
            )
        if type(data) is not str:
            data = bytes(data).decode()
        run_text = "null" if run_id is None else f'"{run_id}"'
        block_text = "null" if block_id is None else f'"{block_id}"'
        # One pattern match tells whether plain quoting is canonical for all five strings.
        if safe(f"{id_}{ts}{kind}{run_id or ''}{block_id or ''}") is not None:
            text = (
                f'{{"block_id":{block_text},"data":{data},"id":"{id_}",'
                f'"kind":"{kind}","run_id":{run_text},"ts":"{ts}"}}'
            )
        else:
            text = _envelope_text((seq, id_, ts, kind, run_id, block_id, data, digest, stored_chain))
        if sha256(text.encode()).hexdigest() != digest:
            return RangeResult(expected - 1, chain, seq, _EDITED)
        if sha256(f"{chain}{digest}".encode()).hexdigest() != stored_chain:
            return RangeResult(expected - 1, chain, seq, _RELINKED)
        chain = stored_chain
        expected += 1
    return RangeResult(expected - 1, chain)


def check_range(rows: Iterable[tuple[Any, ...]], first: int, last: int, previous_chain: str) -> RangeResult:
    """Check that rows ``first..last`` are all there and each links to the one before."""
    return _missing_tail(scan_rows(rows, first, previous_chain), last)


def _missing_tail(result: RangeResult, last: int) -> RangeResult:
    """A clean scan that stopped before ``last``: the rows after it are missing."""
    if result.bad_seq is None and result.last_seq < last:
        # The rows stopped early: the next ones are missing (sequentially they would
        # have shown up as a gap before the following range's first row).
        missing = result.last_seq + 1
        return RangeResult(
            result.last_seq, result.last_chain, missing, f"seq {missing} is missing (rows deleted)"
        )
    return result


def check_heads(
    heads: Iterable[tuple[int, str]], chains_at: dict[int, str], last_seq: int
) -> tuple[int | None, str | None]:
    """Compare recorded heads to the events; a head past the end means a truncated tail."""
    for seq, chain in heads:
        if seq > last_seq:
            return last_seq + 1, (
                f"a head was recorded at seq {seq} but the ledger ends at {last_seq} (tail truncated)"
            )
        if chains_at.get(seq) != chain:
            return seq, f"recorded head at seq {seq} does not match the event's chain"
    return None, None


def conclude(
    scan: RangeResult, heads: list[tuple[int, str]], chains_at: dict[int, str], expected_head: str | None
) -> Verification:
    """Combine the row scan, the recorded heads and an expected head into the verdict."""
    bad, problem = scan.bad_seq, scan.problem
    last_seq, last_chain = scan.last_seq, scan.last_chain
    if bad is None:
        bad, problem = check_heads(heads, chains_at, last_seq)
    if bad is None and expected_head is not None and expected_head != last_chain:
        bad, problem = last_seq, f"the ledger's head {last_chain} is not the expected {expected_head}"
    return Verification(
        ok=bad is None,
        count=last_seq if bad is None else max(bad - 1, 0),
        first_bad_seq=bad,
        problem=problem,
        head_seq=last_seq or None,
        head_chain=last_chain if last_seq else None,
    )


def merge(results: list[RangeResult]) -> RangeResult:
    """The sequential outcome of consecutive ranges: the first bad one, else the last."""
    for result in results:
        if result.bad_seq is not None:
            return result
    return results[-1]


def worker_count(rows: int) -> int:
    """How many processes to verify ``rows`` rows with (1: do it in this process)."""
    if rows < PARALLEL_THRESHOLD:
        return 1
    configured = os.environ.get("KVLEDGER_VERIFY_WORKERS")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, int(configured) if configured else min(cpus, 8))


def pool(workers: int) -> ProcessPoolExecutor:
    """Worker processes; fork where available, so they start without re-importing."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method))


def _fetch(connection: Any, after: int | None, last: int) -> Iterable[tuple[Any, ...]]:
    """Rows with ``after < seq <= last`` in seq order (no lower bound when ``after`` is None)."""
    sql = "SELECT seq, id, ts, kind, run_id, block_id, data, digest, chain FROM events WHERE "
    sql += f"seq <= {int(last)}" + ("" if after is None else f" AND seq > {int(after)}") + " ORDER BY seq"
    cursor = connection.cursor()
    try:
        cursor.execute(sql)
        while batch := cursor.fetchmany(10_000):
            yield from batch
    finally:
        cursor.close()


def _scan_connection(connection: Any, first: int, last: int) -> RangeResult:
    if first == 1:
        # No lower bound: a row slipped in below seq 1 is tampering too.
        return check_range(_fetch(connection, None, last), 1, last, GENESIS)
    rows = iter(_fetch(connection, first - 2, last))
    before = next(rows, None)
    if before is not None and before[0] == first - 1:
        return check_range(rows, first, last, before[8])
    # The row before this range is gone; the range before reports it. Check the rest anyway.
    chained = rows if before is None else iter([before, *rows])
    return check_range(chained, first, last, "")


def _verify_range(url: str, first: int, last: int) -> RangeResult:
    """Worker: check seq ``first..last`` over a connection of its own."""
    from ._backends import normalise_url, open_database

    database = open_database(normalise_url(url))
    try:
        connection = database.raw_connection()
        try:
            return _scan_connection(connection, first, last)
        finally:
            connection.close()
    finally:
        database.dispose()


def ranges(last: int, parts: int) -> list[tuple[int, int]]:
    """Split seq ``1..last`` into ``parts`` consecutive ranges."""
    step = -(-last // parts)
    return [(start, min(start + step - 1, last)) for start in range(1, last + 1, step)]


def native_path(ledger: Any, verifier: str | None = None) -> str | None:
    """The SQLite file the native scanner reads for ``ledger``, or None for the Python path.

    ``verifier``: ``python`` forces the Python path; anything else uses the native
    scanner where it can. Default: ``$KVLEDGER_VERIFIER``.
    """
    if (verifier or os.environ.get("KVLEDGER_VERIFIER", "auto")) == "python" or _cverify is None:
        return None
    database = ledger.url.database
    if (
        ledger.url.get_backend_name() != "sqlite"
        or not database
        or database == ":memory:"
        or database.startswith("file:")
    ):
        return None
    return str(database)


_NATIVE_PROBLEMS = {2: _EDITED, 3: _RELINKED}


def _native_range(path: str, first: int, last: int) -> RangeResult:
    """Check seq ``first..last`` of the SQLite file at ``path`` natively (as _scan_connection does)."""
    if first == 1:
        after, previous = _NO_LOWER_BOUND, GENESIS
    else:
        after, previous = first - 2, ""
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
            before = connection.execute(
                "SELECT seq, chain FROM events WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT 1",
                (first - 2, last),
            ).fetchone()
        connection.close()
        if before is not None and before[0] == first - 1:
            # A stored chain that is not 64 bytes of text is followed by no chain (the scan takes
            # none other); the range before names that row, as the Python path does.
            stored = before[1]
            after, previous = (
                first - 1,
                stored if isinstance(stored, str) and len(stored.encode()) == 64 else "",
            )
        # Otherwise the row before is gone: scan from the next one with no chain to follow.
    return _native_scan(path, after, last, first, previous)


def _native_scan(path: str, after: int, last: int, first: int, previous: str) -> RangeResult:
    """``_cverify.scan`` of seq ``after``+1..``last`` (``first`` expected first, ``previous`` the
    chain to follow) as a :class:`RangeResult`."""
    assert _cverify is not None
    return _scan_result(_cverify.scan(path, after, last, first, previous), last)


def _scan_result(scanned: tuple[int, int, int, int, str], last: int) -> RangeResult:
    """A native scan's (outcome, bad_seq, found_seq, last_good_seq, last_good_chain) as a
    :class:`RangeResult` of a range ending at ``last`` (outcomes: 0 ok, 1 deleted, 2 edited,
    3 relinked, in _cverify.c and _carrow.c alike)."""
    outcome, bad, found, last_good, chain = scanned
    if outcome == 0:
        return _missing_tail(RangeResult(last_good, chain), last)
    problem = (
        _DELETED.format(seq=found, expected=last_good + 1) if outcome == 1 else _NATIVE_PROBLEMS[outcome]
    )
    return RangeResult(last_good, chain, bad, problem)


def _source_range(source: Any, first: int, last: int) -> RangeResult:
    """Check seq ``first..last`` of a row source (ledger/_row_sources.py) as :func:`_native_range`
    checks an SQLite file's."""
    if first == 1:
        return _scan_result(source.scan(_NO_LOWER_BOUND, last, 1, GENESIS), last)
    stored = source.stored_chains([first - 1])
    if first - 1 in stored:
        chain = stored[first - 1]
        previous = chain if isinstance(chain, str) and len(chain.encode()) == 64 else ""
        return _scan_result(source.scan(first - 1, last, first, previous), last)
    # The row before is gone: scan from the next one with no chain to follow.
    return _scan_result(source.scan(first - 2, last, first, ""), last)


def _scan_source(source: Any, last: int, workers: int | None) -> RangeResult:
    """Every row of a row source, in ranges on two threads (the database's own processes read
    and aggregate them beside this one's checks)."""
    count = workers or (1 if last < NATIVE_PARALLEL_THRESHOLD else 2)
    if count <= 1 or last < 2:
        return _source_range(source, 1, last)
    with ThreadPoolExecutor(count) as executor:
        return merge(list(executor.map(lambda part: _source_range(source, *part), ranges(last, count * 2))))


def _scan_native(path: str, last: int, workers: int | None) -> RangeResult:
    count = workers or (1 if last < NATIVE_PARALLEL_THRESHOLD else worker_count(PARALLEL_THRESHOLD))
    if count <= 1 or last < 2:
        return _native_range(path, 1, last)
    # Twice as many ranges as threads, as the process pool splits: on a shared machine a
    # thread that gets less CPU then holds up less of the whole.
    with ThreadPoolExecutor(count) as executor:
        return merge(list(executor.map(lambda part: _native_range(path, *part), ranges(last, count * 2))))


@dataclass(frozen=True)
class Heads:
    """What a verification reads before its scan: the recorded heads, then the last seq and the
    chains at the heads' seqs (each head is committed with its events, so all of them lie at or
    below the last seq read after them, even while writers append)."""

    heads: list[tuple[int, str]]
    last: int
    chains_at: dict[int, str]


def read_heads(ledger: Any) -> Heads:
    """The recorded heads, then the last seq (see :class:`Heads`)."""
    heads = [(h.seq, h.chain) for h in ledger.recorded_heads()]
    with ledger.database.connect() as conn:
        last = int(conn.exec_driver_sql("SELECT coalesce(max(seq), 0) FROM events").scalar_one())
        chains_at = dict(
            conn.exec_driver_sql("SELECT e.seq, e.chain FROM heads h JOIN events e ON e.seq = h.seq").all()
        )
    return Heads(heads, last, chains_at)


def verify_after(source: Any, read: Heads, scanned: RangeResult) -> Verification:
    """The verification of the ledger whose seq 1..``scanned.last_seq`` were checked clean from
    GENESIS as they were read (``scanned``; ``read`` before that check began), ``source`` its rows
    (ledger/_row_sources.py; an SQLite file's path is taken too): the rows after them up to
    ``read.last`` are checked natively from that chain, then the heads, as :func:`verify_ledger`
    concludes."""
    assert scanned.bad_seq is None
    scan = scanned
    if read.last > scanned.last_seq:
        after = scanned.last_seq
        if isinstance(source, str):
            scan = _native_scan(source, after, read.last, after + 1, scanned.last_chain)
        else:
            scan = _scan_result(source.scan(after, read.last, after + 1, scanned.last_chain), read.last)
    return conclude(scan, read.heads, read.chains_at, None)


def verify_ledger(
    ledger: Any, expected_head: str | None = None, workers: int | None = None, verifier: str | None = None
) -> Verification:
    """Verify ``ledger`` (a :class:`ledger.Ledger`), in parallel when it is large
    (``verifier``: see :func:`native_path`)."""
    read = read_heads(ledger)
    heads, last, chains_at = read.heads, read.last, read.chains_at
    path = native_path(ledger, verifier)
    if path is not None:
        return conclude(_scan_native(path, last, workers), heads, chains_at, expected_head)
    if (verifier or os.environ.get("KVLEDGER_VERIFIER", "auto")) != "python":
        from ._row_sources import PostgresRows, row_source

        source = row_source(ledger)
        if isinstance(source, PostgresRows):
            return conclude(_scan_source(source, last, workers), heads, chains_at, expected_head)
    count = workers or worker_count(last)
    if count <= 1 or last < 2:
        connection = ledger.database.raw_connection()
        try:
            scan = _scan_connection(connection, 1, last)
        finally:
            connection.close()
    else:
        url = ledger.url.render_as_string(hide_password=False)
        parts = ranges(last, count * 2)
        with pool(count) as executor:
            futures = [executor.submit(_verify_range, url, first, end) for first, end in parts]
            scan = merge([f.result() for f in futures])
    return conclude(scan, heads, chains_at, expected_head)
