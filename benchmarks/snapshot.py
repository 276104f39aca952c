"""The Parquet snapshot: its first build after a fresh import, and an incremental refresh.

On the screening-shaped 1M-event ledger of ``python -m benchmarks report`` (kept
outside the clone, built once per generator version), the report's Analytics
builds the snapshot from scratch into an empty folder: every row read natively
into Arrow (ledger/_carrow.c), each checked (digest and chain link) and its
data's fields typed in that same pass, the raw segments written while every
projection the report reads is written from the typed tables of that pass
(DuckDB derives from the rows in memory what the pass could not type). Then ``--new`` events
(default 10k, seed-shaped runs) are appended to a copy of that ledger and the
refresh that brings the snapshot up to date is timed: proving the files already
there, writing one new segment and projecting it. Goals at 1M: first build
≤ 3 s, refresh of 10k ≤ 0.2 s. ``--reader python`` times the driver path
(Python's sqlite3 and Python checking) for comparison.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ledger import Analytics, open_ledger
from reports._views import projections

from ._common import cpu_seconds, emit, timed
from .report import SIZES, _ledger, default_keep, envelopes, fill


def _build(ledger: Any, root: Path) -> tuple[float, float, Any]:
    cpu = cpu_seconds()
    with timed() as wall:
        analytics = Analytics(ledger, root, projections())
        analytics.connection()
        analytics.close()
    return wall[0], cpu_seconds() - cpu, analytics.proof


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks snapshot")
    parser.add_argument("--size", default="1m", choices=sorted(SIZES), help="The ledger size.")
    parser.add_argument("--new", type=int, default=10_000, help="Events appended before the refresh.")
    parser.add_argument("--keep", type=Path, default=None, help="Where generated ledgers are kept.")
    parser.add_argument("--reader", choices=("native", "python"), default="native")
    args = parser.parse_args()
    if args.reader == "python":
        os.environ["KVLEDGER_READER"] = "python"
        os.environ["KVLEDGER_VERIFIER"] = "python"
    keep = args.keep or default_keep()
    keep.mkdir(parents=True, exist_ok=True)
    ledger, setup = _ledger(keep, args.size, SIZES[args.size])
    head = ledger.head()
    events = head.seq if head else 0
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="kvledger-bench-snapshot-") as tmp:
        # Built and refreshed on a copy of the kept ledger, which stays as generated.
        source = Path(str(ledger.url.database))
        ledger.close()
        copy = Path(tmp) / "ledger.db"
        shutil.copyfile(source, copy)
        ledger = open_ledger(f"sqlite:///{copy}")
        first_s, first_cpu, first = _build(ledger, Path(tmp) / "snapshots")
        assert not first.mismatches and first.rows_checked == events
        later: list[dict[str, Any]] = []
        for run in envelopes(args.new, seed=2718):
            later += run
        appended = fill(ledger, iter([later[: args.new]]))
        refresh_s, refresh_cpu, refresh = _build(ledger, Path(tmp) / "snapshots")
        assert not refresh.mismatches and refresh.rows_checked == appended, (refresh, appended)
        segments = len(list((Path(tmp) / "snapshots").glob("*/events-*.parquet")))
        ledger.close()
    print(
        f"{events:,} events ({args.reader} reader): first build {first_s:.2f} s wall, {first_cpu:.2f} s CPU "
        f"(rows read and checked {first.write_check_seconds:.2f} s, raw segments written "
        f"{first.write_seconds:.2f} s beside projections derived {first.derive_seconds:.2f} s, "
        f"{first.projected_natively} projection files written from the read's typed tables, segments "
        f"typed by DuckDB {first.fields_by_duckdb}); refresh after {appended:,} new "
        f"events {refresh_s:.3f} s wall, {refresh_cpu:.3f} s CPU (proof of the files there: "
        f"{refresh.seconds:.3f} s over {refresh.files} files, {refresh.bytes / 1e6:.0f} MB); "
        f"{segments} segments; load {load:.1f} before, {os.getloadavg()[0]:.1f} after, "
        f"on {os.cpu_count()} CPUs"
        + "".join(f"; {k.removesuffix('_s')} {v:.1f} s (not counted)" for k, v in setup.items())
    )
    figures: dict[str, Any] = {
        "benchmark": "snapshot",
        "reader": args.reader,
        "events": events,
        "first_build_seconds": round(first_s, 3),
        "first_build_cpu_seconds": round(first_cpu, 3),
        "first_read_check_seconds": round(first.write_check_seconds, 3),
        "first_write_seconds": round(first.write_seconds, 3),
        "first_derive_seconds": round(first.derive_seconds, 3),
        "first_fields_by_duckdb": first.fields_by_duckdb,
        # Projection files written from the tables the segments' own read typed (the others by
        # DuckDB's COPY: a kind the native parse was not sure of, or none of its rows).
        "first_projected_natively": first.projected_natively,
        "goal_first_build_seconds_1m": 3.0,
        "refresh_events": appended,
        "refresh_seconds": round(refresh_s, 4),
        "refresh_cpu_seconds": round(refresh_cpu, 4),
        "refresh_proof_seconds": round(refresh.seconds, 4),
        "goal_refresh_seconds_10k": 0.2,
        "cpus": os.cpu_count(),
        "load_1min": round(load, 2),
        "load_1min_after": round(os.getloadavg()[0], 2),
        "unix_time": int(time.time()),
    }
    emit(figures)
