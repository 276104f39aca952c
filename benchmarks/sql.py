"""``ledger sql`` speed: a grouped count over 1M and 10M events once the snapshot exists.

The ledgers are the screening-shaped ones of ``python -m benchmarks report``
(kept outside the clone, built once per generator version), with the snapshot
kept beside them. At each size the snapshot is brought up to date first (timed
and printed on its own, not counted), then the query is timed end to end
through the Python API as `ledger sql` runs it: the snapshot's proof (every
served file re-hashed, the chains checked against the database), the views,
DuckDB; the process's CPU time (DuckDB's threads included) beside it. Goal: ≤ 1 s at 10M.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import time
from pathlib import Path

from ledger import Analytics

from ._common import cpu_seconds, emit, timed
from .report import SIZES, _ledger, default_keep

QUERY = "SELECT run_id, count(*) AS n FROM response_received GROUP BY run_id ORDER BY run_id"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks sql")
    parser.add_argument("--sizes", default="1m,10m", help="Comma-separated: 250k, 1m, 2m, 10m.")
    parser.add_argument("--repeat", type=int, default=3, help="Best of this many query runs.")
    parser.add_argument("--keep", type=Path, default=None, help="Where generated ledgers are kept.")
    args = parser.parse_args()
    keep = args.keep or default_keep()
    keep.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    builds: dict[str, float] = {}
    proofs: dict[str, float] = {}
    cpus: dict[str, float] = {}
    loads: dict[str, float] = {}
    for label in args.sizes.split(","):
        ledger, _ = _ledger(keep, label, SIZES[label])
        snapshots = keep / "snapshots"
        with timed() as build:
            analytics = Analytics(ledger, snapshots)
            analytics.connection()
            analytics.close()
        runs = []
        for _ in range(args.repeat):
            cpu = cpu_seconds()
            with timed() as t:
                analytics = Analytics(ledger, snapshots)
                table = analytics.sql(QUERY)
                analytics.close()
            runs.append((t[0], analytics.proof.seconds, cpu_seconds() - cpu))
        with contextlib.closing(sqlite3.connect(str(ledger.url.database))) as con:
            (responses,) = con.execute(
                "SELECT count(*) FROM events WHERE kind = 'response.received'"
            ).fetchone()
        assert sum(table.column("n").to_pylist()) == responses
        head = ledger.head()
        ledger.close()
        best = min(runs)
        seconds[label], proofs[label], builds[label], cpus[label] = (
            round(best[0], 4),
            round(best[1], 4),
            round(build[0], 3),
            round(best[2], 4),
        )
        loads[label] = round(os.getloadavg()[0], 2)
        print(
            f"{head.seq if head else 0:>10,} events: query {best[0]:.3f} s, {best[2]:.3f} s CPU (best of "
            f"{args.repeat}; the snapshot's proof {best[1]:.3f} s of it); snapshot refresh {build[0]:.2f} s "
            f"(not counted); load {loads[label]:.1f} on {os.cpu_count()} CPUs"
        )
    emit(
        {
            "benchmark": "sql",
            "query": QUERY,
            "seconds": seconds,
            "seconds_10m": seconds.get("10m"),
            "goal_seconds_10m": 1.0,
            "proof_seconds": proofs,
            "cpu_seconds": cpus,
            "load_1min": loads,
            "snapshot_build_seconds": builds,
            "unix_time": int(time.time()),
        }
    )
