"""Verify throughput: recompute every digest and chain link of 1,000,000 events (SQLite)."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ledger import open_ledger
from ledger._verify import verify_ledger, worker_count

from ._common import emit, fill, timed


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks verify")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--single", action="store_true", help="Also time one process, for comparison.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvledger-bench-") as tmp:
        ledger = open_ledger(f"sqlite:///{Path(tmp) / 'ledger.db'}")
        fill_s = fill(ledger, args.events)
        print(f"filled {args.events:,} events in {fill_s:.1f} s (not counted)")
        workers = worker_count(args.events)
        with timed() as t:
            result = ledger.verify()
        assert result.ok and result.count == args.events, result
        print(f"verify: {args.events / t[0]:>12,.0f} events/s ({t[0]:.2f} s, {workers} processes)")
        figures = {"benchmark": "verify", "events": args.events, "workers": workers,
                   "events_per_s": round(args.events / t[0]), "unix_time": int(time.time())}
        if args.single:
            with timed() as one:
                assert verify_ledger(ledger, workers=1).ok
            print(f"verify, one process: {args.events / one[0]:>12,.0f} events/s")
            figures["single_process_events_per_s"] = round(args.events / one[0])
        ledger.close()
    emit(figures)
