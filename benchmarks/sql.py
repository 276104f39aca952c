"""``ledger sql`` speed: a grouped count over 1M, 2M and 4M events once the snapshot exists.

The ledger grows in place (SQLite); at each size the Parquet snapshot is
brought up to date first (timed and printed on its own), then the query is
timed end to end through the Python API: refresh check, views, DuckDB.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ledger import Analytics, open_ledger

from ._common import emit, fill, timed

QUERY = "SELECT run_id, count(*) AS n FROM response_received GROUP BY run_id ORDER BY run_id"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks sql")
    parser.add_argument(
        "--sizes", default="1000000,2000000,4000000", help="Comma-separated ledger sizes, ascending."
    )
    parser.add_argument("--repeat", type=int, default=3, help="Best of this many query runs.")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    seconds: dict[str, float] = {}
    builds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="kvledger-bench-") as tmp:
        ledger = open_ledger(f"sqlite:///{Path(tmp) / 'ledger.db'}")
        snapshots = Path(tmp) / "snapshots"
        have = 0
        for size in sizes:
            fill_s = fill(ledger, size - have)
            have = size
            with timed() as build:
                analytics = Analytics(ledger, snapshots)
                analytics.connection()
                analytics.close()
            runs = []
            for _ in range(args.repeat):
                with timed() as t:
                    analytics = Analytics(ledger, snapshots)
                    table = analytics.sql(QUERY)
                    analytics.close()
                runs.append(t[0])
            assert sum(table.column("n").to_pylist()) == size
            seconds[str(size)] = round(min(runs), 4)
            builds[str(size)] = round(build[0], 3)
            print(
                f"{size:>10,} events: query {min(runs):.3f} s (best of {args.repeat}); "
                f"snapshot refresh {build[0]:.2f} s; fill {fill_s:.1f} s (not counted)"
            )
        ledger.close()
    emit(
        {
            "benchmark": "sql",
            "query": QUERY,
            "seconds": seconds,
            "snapshot_build_seconds": builds,
            "unix_time": int(time.time()),
        }
    )
