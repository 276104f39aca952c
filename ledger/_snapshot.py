"""An incrementally maintained Parquet snapshot of the events table.

DuckDB's sqlite/postgres scanners download at run time and fail offline, so
analytics read Parquet segments instead. Each refresh appends one segment
with the events recorded since the last one; the snapshot remembers the chain
at its last seq and is rebuilt if the ledger no longer has that chain there.

A reader may also ask for *projections*: SQL that maps a segment's ``events``
row by row (filter, extract typed fields from the JSON). Each projection is
kept per segment, next to it, under a name that includes the digest of its
SQL, so the JSON of an event is parsed once when its segment is written, not
on every report; changing the SQL starts a new projection.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from ._store import Ledger

SCHEMA = pa.schema([
    ("seq", pa.int64()), ("id", pa.string()), ("ts", pa.string()), ("kind", pa.string()),
    ("run_id", pa.string()), ("block_id", pa.string()), ("data", pa.string()),
    ("digest", pa.string()), ("chain", pa.string()),
])
_MAX_SEGMENTS = 24
_BATCH = 200_000


def rows_to_table(rows: Iterable[tuple[Any, ...]]) -> pa.Table:
    """Arrow table of stored rows (data kept as canonical JSON text)."""
    batch = list(rows)
    columns = list(zip(*batch, strict=True)) if batch else [() for _ in SCHEMA]
    return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, SCHEMA, strict=True)],
                                schema=SCHEMA)


def sql_literal(path: Path) -> str:
    """A file path as a DuckDB string literal."""
    return "'" + str(path).replace("'", "''") + "'"


def _empty() -> dict[str, Any]:
    return {"seq": 0, "chain": None, "segments": [], "fields": {}}


def segment_fields(path: Path) -> dict[str, dict[str, list[str]]]:
    """Kind → data field → the JSON types its values have in one segment file.

    Kept in the snapshot's state so that opening the views does not rescan
    every event's data; each refresh only looks at the new segment.
    """
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute(
            "WITH k AS (SELECT kind, unnest(json_keys(data)) AS field, data FROM read_parquet(?)) "
            "SELECT kind, field, list(DISTINCT json_type(data, '$.' || '\"' || field || '\"')) "
            "FROM k GROUP BY kind, field", [str(path)]
        ).fetchall()
    finally:
        con.close()
    fields: dict[str, dict[str, list[str]]] = {}
    for kind, field, types in rows:
        fields.setdefault(kind, {})[field] = sorted(types)
    return fields


def _merge_fields(into: dict[str, dict[str, list[str]]], new: dict[str, dict[str, list[str]]]) -> None:
    for kind, fields in new.items():
        known = into.setdefault(kind, {})
        for field, types in fields.items():
            known[field] = sorted(set(known.get(field, [])) | set(types))


def default_root() -> Path:
    base = os.environ.get("KVLEDGER_CACHE") or Path.home() / ".cache" / "kvledger"
    return Path(base) / "snapshots"


@dataclass
class Snapshot:
    """Parquet segments of one ledger under ``directory``."""

    directory: Path

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
            return dict(json.loads(self._state_path.read_text()))
        except (OSError, ValueError):
            return _empty()

    def _save(self, state: dict[str, Any]) -> None:
        tmp = self._state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self._state_path)

    def segments(self) -> list[Path]:
        return [self.directory / name for name in self._state()["segments"]]

    def refresh(self, ledger: Ledger, projections: Mapping[str, str] | None = None) -> list[Path]:
        """Bring the snapshot (and ``projections``, name → SQL over ``events``) up to the
        ledger's head; returns the segment files."""
        self.directory.mkdir(parents=True, exist_ok=True)
        state = self._state()
        if not self._still_valid(ledger, state):
            shutil.rmtree(self.directory)
            self.directory.mkdir(parents=True)
            state = _empty()
        head = ledger.head()
        if head is not None and head.seq > state["seq"]:
            self._append_segments(ledger, state, head.seq)
        if len(state["segments"]) > _MAX_SEGMENTS:
            self._compact(state)
        self._save(state)
        segments = [self.directory / name for name in state["segments"]]
        for sql in (projections or {}).values():
            self._project(sql, segments)
        return segments

    def projection_files(self, sql: str) -> list[Path]:
        """The files of the projection ``sql``, one per segment, in segment order."""
        folder = self._projection_dir(sql)
        return [folder / name for name in self._state()["segments"]]

    def _projection_dir(self, sql: str) -> Path:
        return self.directory / f"projection-{hashlib.sha256(sql.encode()).hexdigest()[:20]}"

    def _project(self, sql: str, segments: list[Path]) -> None:
        folder = self._projection_dir(sql)
        missing = [s for s in segments if not (folder / s.name).exists()]
        if not missing:
            return
        folder.mkdir(exist_ok=True)
        con = duckdb.connect(":memory:")
        try:
            for segment in missing:
                con.execute(f"CREATE OR REPLACE VIEW events AS FROM read_parquet({sql_literal(segment)})")
                tmp = folder / f"{segment.name}.{os.getpid()}.tmp"  # readers refreshing at once
                con.execute(f"COPY ({sql}) TO {sql_literal(tmp)} (FORMAT parquet, COMPRESSION zstd)")
                os.replace(tmp, folder / segment.name)
        finally:
            con.close()

    def fields(self) -> dict[str, dict[str, list[str]]]:
        """Each kind's data fields and the JSON types seen in them (kept with the segments)."""
        return dict(self._state().get("fields", {}))

    def _still_valid(self, ledger: Ledger, state: dict[str, Any]) -> bool:
        if state["seq"] == 0:
            return True
        if "fields" not in state:
            return False  # written by an older version: rebuild
        rows = list(ledger.raw_rows(after_seq=state["seq"] - 1, until_seq=state["seq"]))
        return bool(rows) and rows[0][8] == state["chain"]

    def _append_segments(self, ledger: Ledger, state: dict[str, Any], until: int) -> None:
        start = state["seq"]
        while start < until:
            stop = min(start + _BATCH * 5, until)
            table = rows_to_table(ledger.raw_rows(after_seq=start, until_seq=stop))
            name = f"events-{start + 1:012d}-{stop:012d}.parquet"
            pq.write_table(table, self.directory / name, compression="zstd")
            state["segments"].append(name)
            _merge_fields(state["fields"], segment_fields(self.directory / name))
            state["seq"], state["chain"] = stop, table.column("chain")[-1].as_py()
            start = stop

    def _compact(self, state: dict[str, Any]) -> None:
        # Projections of the old segments go too; the next reader projects the merged one.
        for folder in self.directory.glob("projection-*"):
            shutil.rmtree(folder)
        files = [self.directory / n for n in state["segments"]]
        table = pa.concat_tables(pq.read_table(f) for f in files)
        name = f"events-{1:012d}-{state['seq']:012d}.parquet"
        tmp = self.directory / (name + ".tmp")
        pq.write_table(table, tmp, compression="zstd")
        for f in files:
            f.unlink()
        os.replace(tmp, self.directory / name)
        state["segments"] = [name]
