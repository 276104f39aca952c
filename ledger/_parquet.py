"""Parquet export: the whole events table plus one flattened file per kind."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from ._analytics import Analytics, view_name
from ._store import Ledger


def export_parquet(ledger: Ledger, directory: str | Path) -> dict[str, int]:
    """Write ``events.parquet`` and ``<kind>.parquet`` files; returns rows per file."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    analytics = Analytics(ledger)
    written: dict[str, int] = {}
    try:
        events = analytics.sql("SELECT * FROM events ORDER BY seq")
        pq.write_table(events, out / "events.parquet", compression="zstd")
        written["events.parquet"] = events.num_rows
        kinds = analytics.sql("SELECT DISTINCT kind FROM events ORDER BY kind").column(0)
        for kind in kinds.to_pylist():
            name = view_name(kind)
            table = analytics.sql(f'SELECT * FROM "{name}" ORDER BY seq')
            pq.write_table(table, out / f"{name}.parquet", compression="zstd")
            written[f"{name}.parquet"] = table.num_rows
    finally:
        analytics.close()
    return written
