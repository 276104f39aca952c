"""An incrementally maintained Parquet snapshot of the events table, proven on every read.

DuckDB's sqlite/postgres scanners download at run time and fail offline, so
analytics read Parquet segments instead. Each refresh appends one segment
with the events recorded since the last one.

A reader may also ask for *projections*: SQL that maps a segment's ``events``
row by row (filter, extract typed fields from the JSON). Each projection is
kept per segment, next to it, under a name that includes the digest of its
SQL, so the JSON of an event is parsed once when its segment is written, not
on every report; changing the SQL starts a new projection.

The proof. The snapshot lives outside the database, so nothing in it is
trusted for being there:

- When a segment is written, its rows are read from the database natively
  into Arrow and each row is checked link by link as it is read, in the same
  pass (each digest recomputed from the envelope, ledger/_snapshot_rows.py);
  the rows read must be that range, with no gap, ending on the chain the check
  ended on. Where only the reader is native, the native verifier checks the
  database's range beside the read; without either, the rows read are checked
  in Python. Its first and last seq, the chain at its last seq
  and its data fields go into the file's own Parquet metadata; the
  projections are derived from the rows while they are in memory. A segment
  whose rows fail that check is served (the report shows the database as it
  is; the audit's chain verification names the row) but marked unproven, and
  read again from the database on every refresh.
- ``state.json`` lists the segments with the SHA-256 of each file, and for
  each projection file the SHA-256 of its bytes and of the segment it was
  derived from.
- Every refresh checks each file it will serve against its recorded digest,
  checks that the segments tile seq 1..S with no gap or overlap, and that the
  chain each segment ends on is the chain the database stores at that seq.
  A file is read and hashed again unless its inode, size and change time
  (ctime: set by every write and rename, and not settable by a user) are
  those recorded when it was last hashed, so a refresh of a large snapshot
  costs a stat per file, not a read of every byte.

A file that differs from its recorded digest (or does not tile) is a
:class:`Mismatch`: it is rebuilt from the database, and the mismatch is
reported (the audit's ``snapshot-mismatch``). Missing or stale files (an
older format, a deleted file, a ledger replaced at the same path) are rebuilt
without one: nothing served differed from the ledger.

What that proves is bounded by the folder: whoever can rewrite a file can
rewrite its digest in ``state.json``. So the snapshot serves plain reads
(``ledger report``, ``ledger sql``, exports), and the commands that publish
(``ledger audit``, ``ledger attest``) derive their tables from the database's
own rows instead (ledger/_analytics.py ``from_rows``); ``ledger verify
--snapshot`` (:meth:`Snapshot.check`) proves every file's content.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import mmap
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ._events import GENESIS
from ._row_sources import row_source
from ._rows import SCHEMA, read_rows, rows_to_table
from ._snapshot_rows import CheckedRows, _carrow, by_kind, columns_read, read_checked, single_kind
from ._store import Ledger
from ._typed import NativeSpecs, native_specs
from ._verify import RangeResult, _native_range, native_path, scan_rows

__all__ = [
    "SCHEMA",
    "Mismatch",
    "Proof",
    "Snapshot",
    "file_sha256",
    "rows_to_table",
    "sql_literal",
    "table_fields",
]

_MAX_SEGMENTS = 24
# Rows per segment written: a segment is read into memory whole when it is written.
_SEGMENT_ROWS = 500_000
_VERSION = 2
_META_KEY = b"kvledger.segment"
# The raw segment's columns with few distinct values (dictionary-encoded) and those worth
# statistics (a reader may filter on them).
_DICTIONARY = ["kind", "run_id", "block_id"]
_STATISTICS = ["seq", "ts", "kind", "run_id", "block_id"]
_log = logging.getLogger(__name__)


_DUCK: tuple[int, duckdb.DuckDBPyConnection] | None = None
_DUCK_LOCK = threading.Lock()


def _duck() -> duckdb.DuckDBPyConnection:
    """A new cursor on this process's in-memory DuckDB. Opening a database costs about 25 ms of
    CPU, a cursor next to nothing; what a cursor registers stays its own. A forked child opens
    its own database (the parent's threads are not in it)."""
    global _DUCK
    with _DUCK_LOCK:
        if _DUCK is None or _DUCK[0] != os.getpid():
            _DUCK = (os.getpid(), duckdb.connect(":memory:"))
        return _DUCK[1].cursor()


def sql_literal(path: Path) -> str:
    """A file path as a DuckDB string literal."""
    return "'" + str(path).replace("'", "''") + "'"


def table_fields(table: pa.Table) -> dict[str, dict[str, list[str]]]:
    """Kind → data field → the JSON types its values have in ``table`` (a segment's rows).

    Kept in each segment's metadata so that opening the views does not rescan
    every event's data. Per kind, its keys first, then the types of all of them
    in one parse per row (``json_type`` over a list of paths).
    """
    con = _duck()
    try:
        con.register("segment", table)
        keys = con.execute(
            "SELECT kind, list(DISTINCT field ORDER BY field) "
            "FROM (SELECT kind, unnest(json_keys(data)) AS field FROM segment) GROUP BY kind"
        ).fetchall()
        fields: dict[str, dict[str, list[str]]] = {}
        for kind, names in keys:
            paths = ", ".join(f"'{key_path(name)}'" for name in names)
            found = con.execute(
                f"SELECT DISTINCT i, t FROM (SELECT unnest(range({len(names)})) AS i, "
                f"unnest(json_type(data, [{paths}])) AS t FROM segment WHERE kind = $kind) "
                "WHERE t IS NOT NULL",
                {"kind": kind},
            ).fetchall()
            types: dict[str, set[str]] = {}
            for index, json_type in found:
                types.setdefault(names[index], set()).add(json_type)
            fields[kind] = {name: sorted(types[name]) for name in names if name in types}
    finally:
        con.close()
    return fields


def key_path(name: str) -> str:
    """The JSON path of top-level key ``name`` as the text of an SQL string literal (without
    its quotes): backslashes and double quotes escaped for the path, single quotes doubled."""
    step = name.replace("\\", "\\\\").replace('"', '\\"')
    return ('$."' + step + '"').replace("'", "''")


def _merge_fields(into: dict[str, dict[str, list[str]]], new: dict[str, dict[str, list[str]]]) -> None:
    for kind, fields in new.items():
        known = into.setdefault(kind, {})
        for name, types in fields.items():
            known[name] = sorted(set(known.get(name, [])) | set(types))


def default_root() -> Path:
    base = os.environ.get("KVLEDGER_CACHE") or Path.home() / ".cache" / "kvledger"
    return Path(base) / "snapshots"


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes (mapped, not copied: about 1.5 GB/s here)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return hashlib.sha256(b"").hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return hashlib.sha256(mapped).hexdigest()


@dataclass(frozen=True)
class Mismatch:
    """A snapshot file whose content is not what was proven when it was written."""

    file: Path
    problem: str


@dataclass(frozen=True)
class Segment:
    """One proven raw segment: its file, digest and what its metadata says it holds."""

    path: Path
    sha256: str
    first: int
    last: int
    chain: str
    fields: dict[str, dict[str, list[str]]]
    proven: bool


@dataclass
class Proof:
    """What the last refresh checked and what it cost (wall and this thread's CPU seconds)."""

    files: int = 0  # files proven against their recorded digests
    bytes: int = 0  # bytes read and hashed to do so
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    mismatches: list[Mismatch] = field(default_factory=list)
    head_seq: int = 0
    head_chain: str | None = None
    stale: int = 0  # listed segments left to be read again (the ledger changed under them)
    rows_checked: int = 0  # rows verified as they were written into new segments
    write_check_seconds: float = 0.0  # reading and checking the rows of new segments (wall)
    write_seconds: float = 0.0  # writing new raw segments (wall, beside the projections)
    derive_seconds: float = 0.0  # deriving the projections of new segments (wall)
    fields_by_duckdb: int = 0  # new segments whose fields DuckDB typed (the native read could not)
    projected_natively: int = 0  # projection files written from the read's typed tables, not by DuckDB
    unchanged: int = 0  # files whose digest stood: same inode, size and ctime as when last hashed
    # path → [inode, size, ctime_ns, sha256] of files hashed before; empty: hash every file.
    known: dict[str, list[Any]] = field(default_factory=dict)
    seen: dict[str, list[Any]] = field(default_factory=dict)

    @contextmanager
    def timed(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - wall
            self.cpu_seconds += time.thread_time() - cpu

    def remember(self, path: Path, digest: str) -> None:
        """Record a file just written with the digest of its bytes (so no refresh reads it again
        while its inode, size and ctime stay)."""
        status = path.stat()
        self.seen[str(path)] = [status.st_ino, status.st_size, status.st_ctime_ns, digest]

    def hashed(self, path: Path) -> str:
        """The file's SHA-256: read again unless its inode, size and change time (ctime, which
        every write or rename sets and no user can set back) are those of its last hashing."""
        status = path.stat()
        stamp = [status.st_ino, status.st_size, status.st_ctime_ns]
        known = self.seen.get(str(path)) or self.known.get(str(path))
        self.files += 1
        if isinstance(known, list) and len(known) == 4 and known[:3] == stamp:
            self.unchanged += 1
            self.seen[str(path)] = known
            return str(known[3])
        self.bytes += status.st_size
        digest = file_sha256(path)
        self.seen[str(path)] = [*stamp, digest]
        return digest


def _is_segment_name(name: Any) -> bool:
    """A segment file's own name (state.json is not trusted to name anything else)."""
    return isinstance(name, str) and re.fullmatch(r"events-\d{12}-\d{12}\.parquet", name) is not None


def _empty() -> dict[str, Any]:
    return {"version": _VERSION, "segments": [], "projections": {}}


def _segment_meta(path: Path) -> dict[str, Any] | None:
    try:
        raw = (pq.read_metadata(path).metadata or {}).get(_META_KEY)
        meta = json.loads(raw) if raw else None
    except (OSError, ValueError, pa.ArrowException):
        return None
    keys = {"first", "last", "chain", "fields", "proven"}
    return meta if isinstance(meta, dict) and keys <= meta.keys() else None


@dataclass
class Snapshot:
    """Parquet segments of one ledger under ``directory``."""

    directory: Path
    proof: Proof = field(default_factory=Proof)
    _segments: list[Segment] = field(default_factory=list)
    # SQL → the bytes and digest of the projection file it gives for no rows.
    _empty: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    # Two raw writes may run side by side (the last two segments of a build): their seconds add up
    # under it.
    _writes_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def for_ledger(cls, ledger: Ledger, root: Path | None = None) -> Snapshot:
        key = ledger.url.render_as_string(hide_password=True)
        if ledger.url.get_backend_name() == "sqlite" and ledger.url.database:
            key = str(Path(ledger.url.database).resolve())
        digest = hashlib.sha256(key.encode()).hexdigest()[:20]
        return cls((root or default_root()) / digest)

    @property
    def _state_path(self) -> Path:
        return self.directory / "state.json"

    def _state(self) -> dict[str, Any]:
        try:
            state = json.loads(self._state_path.read_text())
        except (OSError, ValueError):
            return _empty()
        if (
            not isinstance(state, dict)
            or state.get("version") != _VERSION
            or not isinstance(state.get("segments"), list)
            or not isinstance(state.get("projections"), dict)
        ):
            return _empty()  # an older format or not ours: rebuilt, nothing was served from it
        return state

    def _save(self, state: dict[str, Any]) -> None:
        tmp = self._state_path.with_suffix(f".{os.getpid()}.tmp")
        # Compact: at 10M events the state lists about 600 files (270 kB); indented, its encoding
        # took 6 ms of every refresh against 2.4 ms.
        tmp.write_text(json.dumps(state, separators=(",", ":")))
        os.replace(tmp, self._state_path)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # One refresher at a time per snapshot: a state file always describes the files beside it.
        with open(self.directory / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def unbuilt(self) -> bool:
        """Whether nothing of this snapshot has ever been written (no folder, or an empty one)."""
        return not self.directory.is_dir() or not any(self.directory.iterdir())

    def segments(self) -> list[Path]:
        """The segment files the last refresh proved (in seq order)."""
        return [s.path for s in self._segments]

    def fields(self) -> dict[str, dict[str, list[str]]]:
        """Each kind's data fields and the JSON types seen in them (from the proven segments)."""
        merged: dict[str, dict[str, list[str]]] = {}
        for segment in self._segments:
            _merge_fields(merged, segment.fields)
        return merged

    def refresh(
        self, ledger: Ledger, projections: Mapping[str, str] | None = None, up_to_seq: int | None = None
    ) -> list[Path]:
        """Prove the snapshot against the ledger, rebuild what fails, bring it (and
        ``projections``, name → SQL over ``events``) up to the ledger's head (or
        ``up_to_seq``, where a verification in progress covers that far); returns the
        segment files. :attr:`proof` says what was checked and what it cost."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proof = Proof()
        with self._locked():
            state = self._state()
            known = state.pop("hashed", None)
            self.proof.known = known if isinstance(known, dict) else {}
            kept, dropped = self._prove(ledger, state)
            for entry in dropped:
                if _is_segment_name(entry.get("name") if isinstance(entry, dict) else None):
                    (self.directory / entry["name"]).unlink(missing_ok=True)
            state["segments"] = [{"name": s.path.name, "sha256": s.sha256} for s in kept]
            head = ledger.head()
            until = 0 if head is None else head.seq if up_to_seq is None else min(head.seq, up_to_seq)
            if until > (kept[-1].last if kept else 0):
                kept += self._append_segments(ledger, kept, until, projections or {}, state)
            if len(kept) > _MAX_SEGMENTS and all(s.proven for s in kept):
                kept = self._compact(kept, state)
            state["segments"] = [{"name": s.path.name, "sha256": s.sha256} for s in kept]
            self._segments = kept
            for sql in (projections or {}).values():
                self._project(sql, kept, state)
            state["hashed"] = self.proof.seen
            self._save(state)
        if kept:
            self.proof.head_seq, self.proof.head_chain = kept[-1].last, kept[-1].chain
        for m in self.proof.mismatches:
            _log.warning("snapshot file %s: %s; rebuilt from the ledger", m.file, m.problem)
        return self.segments()

    def check(self, ledger: Ledger) -> Proof:
        """The full proof of the snapshot as it stands, changing nothing (``ledger verify --snapshot``).

        Besides what every refresh checks, each listed segment's rows are verified again
        (digests recomputed, links followed from GENESIS) and each recorded projection file
        is derived again from its segment and compared: so a file forged together with its
        digest in state.json is found too. About half a minute per million events.
        """
        self.proof = Proof()
        if not self._state_path.exists():
            return self.proof
        state = self._state()
        kept, dropped = self._prove(ledger, state)
        with self.proof.timed():
            previous = GENESIS
            for segment in kept:
                table = pq.read_table(segment.path)
                rows = zip(*(column.to_pylist() for column in table.columns), strict=True)
                scan = scan_rows(rows, segment.first, previous)
                ends = (scan.last_seq, scan.last_chain) == (segment.last, segment.chain)
                if scan.bad_seq is not None or not ends:
                    problem = (
                        f"seq {scan.bad_seq}: {scan.problem}"
                        if scan.bad_seq is not None
                        else f"its rows do not chain to seq {segment.last}'s stored chain"
                    )
                    self.proof.mismatches.append(Mismatch(segment.path, problem))
                    kept = kept[: kept.index(segment)]
                    break
                previous = segment.chain
            for digest in sorted(state["projections"]):
                self._check_projection(digest, state["projections"][digest], kept)
        self.proof.stale = len(dropped)
        if kept:
            self.proof.head_seq, self.proof.head_chain = kept[-1].last, kept[-1].chain
        return self.proof

    def _check_projection(self, digest: str, entry: Any, segments: list[Segment]) -> None:
        folder = self.directory / f"projection-{digest}"
        sql = entry.get("sql") if isinstance(entry, dict) else None
        files = entry.get("files") if isinstance(entry, dict) else None
        if not isinstance(sql, str) or self._sql_digest(sql) != digest or not isinstance(files, dict):
            self.proof.mismatches.append(
                Mismatch(folder, "state.json does not record the SQL it was derived with")
            )
            return
        con = _duck()
        try:
            for segment in segments:
                path, record = folder / segment.path.name, files.get(segment.path.name)
                if not isinstance(record, dict) or record.get("from") != segment.sha256 or not path.exists():
                    continue  # stale: the next reader derives it again, nothing is served from it
                if self.proof.hashed(path) != record.get("sha256"):
                    self.proof.mismatches.append(
                        Mismatch(path, "content differs from the digest recorded when it was derived")
                    )
                    continue
                differing = rows_differing(con, sql, segment.path, path)
                if differing is None or differing:
                    count = "?" if differing is None else differing
                    self.proof.mismatches.append(
                        Mismatch(path, f"{count} rows differ from its segment derived again")
                    )
        finally:
            con.close()

    def _prove(self, ledger: Ledger, state: dict[str, Any]) -> tuple[list[Segment], list[dict[str, Any]]]:
        """The listed segments that prove out, in order, and the entries dropped after them."""
        kept: list[Segment] = []
        entries = list(state["segments"])
        with self.proof.timed():
            for index, entry in enumerate(entries):
                segment, problem = self._segment(entry, kept[-1].last + 1 if kept else 1)
                if segment is None:
                    if problem is not None:
                        path = self.directory / str(entry.get("name"))
                        self.proof.mismatches.append(Mismatch(path, problem))
                    return kept, entries[index:]
                kept.append(segment)
            stored = self._stored_chains(ledger, [s.last for s in kept])
            for index, segment in enumerate(kept):
                if stored.get(segment.last) != segment.chain or not segment.proven:
                    # The ledger there is not what the segment holds (replaced, rewritten), or
                    # its rows did not verify when written: read them again.
                    return kept[:index], entries[index:]
        return kept, []

    def _segment(self, entry: Any, first: int) -> tuple[Segment | None, str | None]:
        """The segment of one state entry, or None with the problem (None: missing, rebuilt quietly)."""
        if not isinstance(entry, dict) or not _is_segment_name(entry.get("name")):
            return None, "state.json lists a segment that is not one"
        path = self.directory / entry["name"]
        if not path.is_file():
            return None, None
        if self.proof.hashed(path) != entry.get("sha256"):
            return None, "content differs from the digest recorded when it was written"
        meta = _segment_meta(path)
        if meta is None:
            return None, "no segment metadata (first, last, chain, fields)"
        if meta["first"] != first or meta["last"] < meta["first"]:
            return None, f"holds seq {meta['first']}..{meta['last']} where seq {first} comes next"
        return Segment(
            path,
            entry["sha256"],
            int(meta["first"]),
            int(meta["last"]),
            str(meta["chain"]),
            dict(meta["fields"]),
            bool(meta["proven"]),
        ), None

    @staticmethod
    def _stored_chains(ledger: Ledger, seqs: list[int]) -> dict[int, str]:
        if not seqs:
            return {}
        listed = ", ".join(str(int(s)) for s in seqs)
        with ledger.database.connect() as conn:
            rows = conn.exec_driver_sql(f"SELECT seq, chain FROM events WHERE seq IN ({listed})").all()
        return {int(seq): str(chain) for seq, chain in rows}

    def projection_files(self, sql: str) -> list[Path]:
        """The files of the projection ``sql``, one per proven segment, in segment order."""
        folder = self._projection_dir(sql)
        return [folder / s.path.name for s in self._segments]

    def _projection_dir(self, sql: str) -> Path:
        return self.directory / f"projection-{self._sql_digest(sql)}"

    @staticmethod
    def _sql_digest(sql: str) -> str:
        return hashlib.sha256(sql.encode()).hexdigest()[:20]

    def _projection_entry(self, sql: str, state: dict[str, Any]) -> dict[str, Any] | None:
        """The state's record of ``sql``'s files, where it is one for this very SQL."""
        entry = state["projections"].get(self._sql_digest(sql))
        if not isinstance(entry, dict) or entry.get("sql") != sql or not isinstance(entry.get("files"), dict):
            return None
        return entry

    def _project(self, sql: str, segments: list[Segment], state: dict[str, Any]) -> None:
        """Prove each projection file of ``sql`` or derive it again from its proven segment."""
        folder = self._projection_dir(sql)
        entry = self._projection_entry(sql, state) or {"sql": sql, "files": {}}
        records: dict[str, Any] = entry["files"]
        missing = []
        with self.proof.timed():
            for segment in segments:
                path, record = folder / segment.path.name, records.get(segment.path.name)
                if not isinstance(record, dict) or record.get("from") != segment.sha256 or not path.exists():
                    missing.append(segment)  # never derived from this segment: derive it
                elif self.proof.hashed(path) != record.get("sha256"):
                    self.proof.mismatches.append(
                        Mismatch(path, "content differs from the digest recorded when it was derived")
                    )
                    missing.append(segment)
        entry["files"] = {
            s.path.name: records[s.path.name] for s in segments if s.path.name in records and s not in missing
        }
        state["projections"][self._sql_digest(sql)] = entry
        if not missing:
            return
        folder.mkdir(exist_ok=True)
        con = _duck()
        try:
            for segment in missing:
                source = sql_literal(segment.path)
                con.execute(f"CREATE OR REPLACE TEMP VIEW events AS FROM read_parquet({source})")
                digest, rows = _copy_parquet(con, sql, folder / segment.path.name)
                self.proof.remember(folder / segment.path.name, digest)
                entry["files"][segment.path.name] = {"sha256": digest, "from": segment.sha256, "rows": rows}
        finally:
            con.close()

    def _write(
        self,
        table: pa.Table,
        first: int,
        last: int,
        chain: str,
        proven: bool,
        fields: dict[str, dict[str, list[str]]],
    ) -> Segment:
        name = f"events-{first:012d}-{last:012d}.parquet"
        meta = {"first": first, "last": last, "chain": chain, "fields": fields, "proven": proven}
        table = table.replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})
        tmp = self.directory / f"{name}.{os.getpid()}.tmp"
        # Dictionary pages only where values repeat (the others fall back to plain after a page
        # of hashing), statistics only on the columns a reader filters: 5 % less CPU, same size.
        pq.write_table(
            table,
            tmp,
            compression="zstd",
            use_dictionary=_DICTIONARY,
            write_statistics=_STATISTICS,
        )
        digest = file_sha256(tmp)
        os.replace(tmp, self.directory / name)
        self.proof.remember(self.directory / name, digest)
        return Segment(self.directory / name, digest, first, last, chain, fields, proven)

    def _timed_write(self, *args: Any) -> Segment:
        wall = time.perf_counter()
        try:
            return self._write(*args)
        finally:
            took = time.perf_counter() - wall
            with self._writes_lock:
                self.proof.write_seconds += took

    def _append_segments(
        self,
        ledger: Ledger,
        kept: list[Segment],
        until: int,
        derive: Mapping[str, str],
        state: dict[str, Any],
    ) -> list[Segment]:
        """Segments of the rows after the last kept one, up to ``until``, each projected (``derive``:
        SQL over ``events``) from its rows while they are in memory."""
        start = kept[-1].last if kept else 0
        previous = kept[-1].chain if kept else GENESIS
        written = []
        # Where a segment's rows are read and checked in one native pass (an SQLite file, or
        # PostgreSQL's binary COPY), else None: rows are read, then checked apart.
        reader = row_source(ledger)
        native = native_path(ledger) if reader is None else None
        specs = _native_specs(derive) if reader is not None else None

        def stop_after(start: int) -> int:
            stop = min(start + _SEGMENT_ROWS, until)
            # A few rows left after this segment (up to an eighth of one) join it rather than make
            # one of their own: each segment costs a write and a COPY per projection, whatever its size.
            return until if until - stop <= _SEGMENT_ROWS // 8 else stop

        def read(start: int, previous: str) -> tuple[CheckedRows, float]:
            # The rows are checked as they are written: a segment holds only rows whose digests
            # and links were recomputed, or says that it does not.
            stop = stop_after(start)
            wall = time.perf_counter()
            if reader is not None:
                # Natively, each row is checked as it is read, in the same pass.
                return read_checked(reader, start, stop, previous, specs=specs), time.perf_counter() - wall
            # Else the database's range is verified beside the read (natively, off the GIL) and
            # the rows read must be those rows: the same seqs, ending on the same chain.
            with ThreadPoolExecutor(1, thread_name_prefix="kvledger-snapshot-check") as checker:
                check = checker.submit(_native_range, native, start + 1, stop) if native else None
                table = read_rows(ledger, start, stop)
                wall = time.perf_counter()
                checked = check.result() if check else _scan_table(table, start + 1, previous)
            return CheckedRows(table, checked, None), time.perf_counter() - wall

        # The raw write of the segment before the last waits to run beside the last one's: a raw
        # write is one thread (Arrow's Parquet writer) and longer than the projections beside it, so
        # the last segment's alone left a core idle at the end (at 1M events 0.45 s of a 3.4 s
        # build). Only that one waits: the rows it holds are those the last read overlapped anyway.
        # (the write's arguments, the projections derived from its rows)
        waiting: tuple[tuple[Any, ...], list[tuple[str, str, int]]] | None = None

        def record(raw: Future[Segment], derived: list[tuple[str, str, int]]) -> None:
            segment = raw.result()
            self._record(segment, derived, state)
            written.append(segment)

        with ThreadPoolExecutor(2, thread_name_prefix="kvledger-snapshot") as pool:
            pending = pool.submit(read, start, previous) if start < until else None
            try:
                while pending is not None:
                    rows, took = pending.result()
                    table, checked, fields = rows.table, rows.checked, rows.fields
                    pending = None
                    self.proof.write_check_seconds += took
                    if table.num_rows == 0:
                        break
                    self.proof.rows_checked += table.num_rows
                    last = int(table.column("seq")[-1].as_py())
                    chain = str(table.column("chain")[-1].as_py())
                    proven = (
                        checked.bad_seq is None
                        and checked.last_seq == last == start + table.num_rows
                        and checked.last_chain == chain
                        and _seqs_follow(table, start + 1)
                    )
                    if proven and last < until:
                        # The next segment's rows are read and checked while this one is written.
                        pending = pool.submit(read, last, chain)
                    if not proven or fields is None:
                        self.proof.fields_by_duckdb += 1
                        fields = table_fields(table)
                    args = (table, start + 1, last, chain, proven, fields)
                    earlier = None
                    if waiting is not None:  # the segment before this one, written beside it
                        earlier = (pool.submit(self._timed_write, *waiting[0]), waiting[1])
                        waiting = None
                    # The raw segment is written (Arrow, off the GIL) while DuckDB derives the
                    # projections from the same rows; their records name the segment's digest.
                    wall = time.perf_counter()
                    wait = pending is not None and stop_after(last) == until
                    raw = None if wait else pool.submit(self._timed_write, *args)
                    try:
                        derived = self._derive(
                            rows if proven else CheckedRows(table, checked, None),
                            derive,
                            f"events-{start + 1:012d}-{last:012d}.parquet",
                            state,
                        )
                        self.proof.derive_seconds += time.perf_counter() - wall
                    finally:
                        if earlier is not None:
                            record(*earlier)  # the records keep the segments' order
                        if raw is not None:
                            raw.result()
                    if raw is None:
                        waiting = (args, derived)
                    else:
                        record(raw, derived)
                    start = last
                    # This segment's rows and typed tables go now, not when the next read is done:
                    # the next segment's are being made beside them (at 10M events 400 MB of the peak).
                    del rows, table, args
                    if not proven:
                        break  # the next refresh reads from here again
            finally:
                if waiting is not None:  # the last segment's read failed or gave no rows
                    record(pool.submit(self._timed_write, *waiting[0]), waiting[1])
        return written

    def _derive(
        self, rows: CheckedRows, derive: Mapping[str, str], name: str, state: dict[str, Any]
    ) -> list[tuple[str, str, int]]:
        """Each projection of ``derive`` for the segment ``name`` from its rows in memory; returns
        (SQL, file digest, rows) triples. A projection the read filled natively (``rows.projected``,
        where DuckDB reads its table with the SQL's own columns and types) is written as it is; any
        other that reads one kind is given only that kind's rows; where there are none, its file is
        the one it gave for no rows before."""
        if not derive:
            return []
        table = rows.table
        kinds = {sql: single_kind(sql) for sql in derive.values()}
        filled = {
            derive[n]: projected
            for n, projected in rows.projected.items()
            if n in derive and _reads_as(derive[n], projected, table)
        }
        # Split by kind only for what DuckDB derives from rows the segment holds (a stable sort and a
        # copy of the columns it reads); the kinds present are the read's, where it says.
        one_kind = [
            sql
            for sql, kind in kinds.items()
            if kind is not None and sql not in filled and (rows.kinds is None or kind in rows.kinds)
        ]
        parts = by_kind(table, columns_read(one_kind)) if one_kind else {}
        present = rows.kinds if rows.kinds is not None else frozenset(parts)

        def project(sql: str) -> tuple[str, str, int]:
            kind = kinds[sql]
            folder = self._projection_dir(sql)
            folder.mkdir(exist_ok=True)
            if sql in filled:
                digest, count = _write_parquet(filled[sql], folder / name)
                return sql, digest, count
            if kind is not None and kind not in present:
                empty = self._empty.get(sql) or self._empty_file(sql, state)
                if empty is not None:
                    # A DuckDB COPY of no rows costs 4 ms or more of CPU; its bytes do not
                    # depend on the segment, so the bytes proven before are written again.
                    _write_bytes(folder / name, empty[0])
                    return sql, empty[1], 0
            rows = table if kind is None else parts.get(kind, parts_empty(table, parts))
            con = _duck()
            try:
                con.register("events", rows)
                try:
                    digest, count = _copy_parquet(con, sql, folder / name)
                except duckdb.BinderException:
                    if rows is table:
                        raise
                    # A column the SQL reads but does not name as a word: give it every row.
                    con.unregister("events")
                    con.register("events", table)
                    digest, count = _copy_parquet(con, sql, folder / name)
            finally:
                con.close()
            if rows.num_rows == 0:
                self._empty[sql] = ((folder / name).read_bytes(), digest)
            return sql, digest, count

        # Two at a time: DuckDB runs each off the GIL, and most projections are too small for
        # its own threads (a refresh's few rows per kind), so one core would otherwise idle. The
        # largest first, so that the last to finish is a small one, not one core's long tail.
        def size(sql: str) -> int:
            kind = kinds[sql]
            if sql in filled:
                return filled[sql].num_rows
            return table.num_rows if kind is None else parts[kind].num_rows if kind in parts else 0

        order = sorted(kinds, key=size, reverse=True)
        with ThreadPoolExecutor(2, thread_name_prefix="kvledger-snapshot-derive") as pool:
            done = dict(zip(order, pool.map(project, order), strict=True))
        self.proof.projected_natively += len(filled)
        return [done[sql] for sql in kinds]

    def _empty_file(self, sql: str, state: dict[str, Any]) -> tuple[bytes, str] | None:
        """The bytes and digest of a file ``sql`` gave for no rows, as recorded and still proven."""
        entry = self._projection_entry(sql, state)
        if entry is None:
            return None
        for name, record in entry["files"].items():
            if not (_is_segment_name(name) and isinstance(record, dict) and record.get("rows") == 0):
                continue
            try:
                data = (self._projection_dir(sql) / name).read_bytes()
            except OSError:
                continue
            digest = hashlib.sha256(data).hexdigest()
            if digest == record.get("sha256"):
                self._empty[sql] = (data, digest)
                return data, digest
        return None

    def _record(self, segment: Segment, derived: list[tuple[str, str, int]], state: dict[str, Any]) -> None:
        """Record the projection files just derived from ``segment`` with their digests."""
        for sql, digest, rows in derived:
            entry = self._projection_entry(sql, state)
            if entry is None:
                entry = {"sql": sql, "files": {}}
                state["projections"][self._sql_digest(sql)] = entry
            path = self._projection_dir(sql) / segment.path.name
            self.proof.remember(path, digest)
            entry["files"][segment.path.name] = {"sha256": digest, "from": segment.sha256, "rows": rows}

    def _compact(self, segments: list[Segment], state: dict[str, Any]) -> list[Segment]:
        """Merge runs of consecutive small segments into segments of at most _SEGMENT_ROWS rows.
        Projection files of the merged segments go; the next reader projects the new ones."""
        groups: list[list[Segment]] = []
        for segment in segments:
            if groups and segment.last - groups[-1][0].first + 1 <= _SEGMENT_ROWS:
                groups[-1].append(segment)
            else:
                groups.append([segment])
        out = []
        for group in groups:
            if len(group) == 1:
                out.append(group[0])
                continue
            table = pa.concat_tables(pq.read_table(s.path).replace_schema_metadata(None) for s in group)
            fields: dict[str, dict[str, list[str]]] = {}
            for segment in group:
                _merge_fields(fields, segment.fields)
            merged = self._write(table, group[0].first, group[-1].last, group[-1].chain, True, fields)
            for segment in group:
                for folder in self.directory.glob("projection-*"):
                    (folder / segment.path.name).unlink(missing_ok=True)
                if segment.path != merged.path:
                    segment.path.unlink(missing_ok=True)
            out.append(merged)
        return out


def rows_differing(con: duckdb.DuckDBPyConnection, sql: str, segment: Path, file: Path) -> int | None:
    """The rows of the projection ``file`` not in what ``sql`` gives over the raw ``segment``, and of
    that not in the file, counted with their repeats (0: the same rows; None: no count came back).
    Leaves ``events`` on ``con`` a view of the segment."""
    con.execute(f"CREATE OR REPLACE TEMP VIEW events AS FROM read_parquet({sql_literal(segment)})")
    stored = f"FROM read_parquet({sql_literal(file)})"
    differing = con.execute(
        f"SELECT (SELECT count(*) FROM ({stored} EXCEPT ALL ({sql}))) + "
        f"(SELECT count(*) FROM (({sql}) EXCEPT ALL {stored}))"
    ).fetchone()
    return None if differing is None else int(differing[0])


def _native_specs(derive: Mapping[str, str]) -> NativeSpecs | None:
    """The projections of ``derive`` (name → SQL) a segment's read fills natively, or None where
    the build cannot."""
    if _carrow is None or not hasattr(_carrow, "TYPED_ROWS"):
        return None
    kinds: dict[str, list[str]] = {}
    for name, sql in derive.items():
        kind = single_kind(sql)
        if kind is not None:
            kinds.setdefault(kind, []).append(name)
    return native_specs(kinds, derive, with_entries=True)


def relation_read_as(relation: duckdb.DuckDBPyRelation) -> list[tuple[str, str]]:
    """The column names and DuckDB types of a relation's output (bound, not run: what DESCRIBE says)."""
    return list(zip(relation.columns, (str(kind) for kind in relation.types), strict=True))


def columns_read_as(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[str, str]]:
    """The column names and DuckDB types of ``sql``'s output (bound, not run)."""
    return relation_read_as(con.sql(sql))


# An Arrow schema (serialized: every field, type, nesting and metadata) → the names and types DuckDB
# reads a table of it with, which the schema alone decides.
_ARROW_READ_AS: dict[bytes, list[tuple[str, str]]] = {}


def arrow_read_as(con: duckdb.DuckDBPyConnection, table: pa.Table) -> list[tuple[str, str]]:
    """The column names and types DuckDB reads ``table`` with (its schema alone is registered: a
    slice of no rows, not ``Schema.empty_table``, whose Python values make pyarrow import pandas),
    asked once per schema in a process."""
    key = table.schema.serialize().to_pybytes()
    known = _ARROW_READ_AS.get(key)
    if known is not None:
        return list(known)
    con.register("kv_arrow_read_as_probe", table.slice(0, 0))
    try:
        read_as = columns_read_as(con, "SELECT * FROM kv_arrow_read_as_probe")
    finally:
        con.unregister("kv_arrow_read_as_probe")
    _ARROW_READ_AS[key] = read_as
    return list(read_as)


# (SQL, the native table's schema) → whether DuckDB reads that table with the SQL's columns and types.
_READS_AS: dict[tuple[str, str], bool] = {}


def _reads_as(sql: str, projected: pa.Table, rows: pa.Table) -> bool:
    """Whether DuckDB reads ``projected`` (a natively filled projection) with exactly the column
    names and types that ``sql`` gives over ``rows``: only then is it written in place of the SQL's
    own output. Asked once per SQL and schema (a query over no rows each)."""
    key = (sql, projected.schema.to_string(show_schema_metadata=False))
    known = _READS_AS.get(key)
    if known is not None:
        return known
    con = _duck()
    try:
        # (A slice, not Schema.empty_table: its Python values make pyarrow import pandas.)
        con.register("events", rows.slice(0, 0))
        _READS_AS[key] = same = arrow_read_as(con, projected) == columns_read_as(con, sql)
    finally:
        con.close()
    return same


def _write_parquet(table: pa.Table, path: Path) -> tuple[str, int]:
    """Write ``table`` to ``path`` (atomically) as the projection's file; returns its SHA-256 and
    rows. zstd at level 1, as DuckDB's COPY writes the others (the same size, less CPU); Arrow's
    dictionary pages and statistics kept: without them the file cost a fifth less to write and
    DuckDB a third more to join on its ids (0.234 against 0.165 s for the requests and their
    responses of 500k events; 0.185 s with them)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp, compression="zstd", compression_level=1)
    digest = file_sha256(tmp)
    os.replace(tmp, path)
    return digest, table.num_rows


def _copy_parquet(con: duckdb.DuckDBPyConnection, sql: str, path: Path) -> tuple[str, int]:
    """Write the rows of ``sql`` to ``path`` (atomically); returns the file's SHA-256 and its rows."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    # Level 1: the same size as DuckDB's default level 3 on these files, 15 % less CPU.
    written = con.execute(
        f"COPY ({sql}) TO {sql_literal(tmp)} (FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1)"
    ).fetchone()
    digest = file_sha256(tmp)
    os.replace(tmp, path)
    return digest, int(written[0]) if written else -1


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def parts_empty(table: pa.Table, parts: Mapping[str, pa.Table]) -> pa.Table:
    """No rows, with the columns of the kind tables of ``parts`` (all of ``table``'s if none)."""
    some = next(iter(parts.values()), table)
    return some.slice(0, 0)


def _seqs_follow(table: pa.Table, first: int) -> bool:
    """``table``'s seqs are first, first + 1, ... with no gap."""
    # Each chunk starts where the one before ended and steps by one (a list of Python ints to
    # compare with cost 40 ms per 500k rows, on the path between one segment's read and the next).
    expected = first
    for chunk in table.column("seq").chunks:
        if len(chunk) == 0:
            continue
        if chunk.null_count or chunk[0].as_py() != expected:
            return False
        # Steps of one: the least and greatest step both 1. (Not ``pc.equal(steps, 1)``: a Python
        # int made an Arrow scalar makes pyarrow import pandas, 0.15 to 0.2 s of CPU the first
        # time, between one segment's read and the next one's.)
        if len(chunk) > 1 and pc.min_max(pc.pairwise_diff(chunk)).as_py() != {"min": 1, "max": 1}:
            return False
        expected += len(chunk)
    return expected == first + table.num_rows


def _scan_table(table: pa.Table, first: int, previous: str) -> RangeResult:
    """:func:`scan_rows` over a table's rows (where the native verifier does not serve)."""
    rows = zip(*(column.to_pylist() for column in table.columns), strict=True)
    return scan_rows(rows, first, previous)
