"""Verify throughput: recompute every digest and chain link of 1,000,000 events (SQLite).

The native scanner (ledger/_cverify.c, threads) and the Python verifier
(worker processes) are measured side by side on the same ledger.
Goal: ≥ 500,000 events/s.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from ledger import open_ledger
from ledger._verify import native_path, verify_ledger, worker_count

from ._common import emit, fill, timed

GOAL_EVENTS_PER_S = 500_000


def _rate(ledger: object, events: int, verifier: str, workers: int | None = None) -> float:
    with timed() as t:
        result = verify_ledger(ledger, workers=workers, verifier=verifier)
    assert result.ok and result.count == events, result
    return events / t[0]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks verify")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--single", action="store_true", help="Also time one thread/process, for comparison.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvledger-bench-") as tmp:
        ledger = open_ledger(f"sqlite:///{Path(tmp) / 'ledger.db'}")
        fill_s = fill(ledger, args.events)
        print(f"filled {args.events:,} events in {fill_s:.1f} s (not counted)")
        workers = worker_count(args.events)
        assert native_path(ledger) is not None, "the native verifier is not built (see setup.py)"
        native = _rate(ledger, args.events, "native")
        python = _rate(ledger, args.events, "python")
        print(f"verify, native: {native:>12,.0f} events/s ({workers} threads)")
        print(
            f"verify, Python: {python:>12,.0f} events/s ({workers} processes); native/Python "
            f"{native / python:.2f}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        figures = {
            "benchmark": "verify",
            "events": args.events,
            "workers": workers,
            "events_per_s": round(native),
            "python_events_per_s": round(python),
            "ratio_native_to_python": round(native / python, 3),
            "goal_events_per_s": GOAL_EVENTS_PER_S,
            "goal_met": native >= GOAL_EVENTS_PER_S,
            "unix_time": int(time.time()),
        }
        if args.single:
            one = _rate(ledger, args.events, "native", workers=1)
            print(f"verify, native, one thread: {one:>12,.0f} events/s")
            figures["single_thread_events_per_s"] = round(one)
        ledger.close()
    emit(figures)
