"""Verify throughput: recompute every digest and chain link of 1,000,000 events (SQLite).

The native scanner (ledger/_cverify.c, threads) and the Python verifier
(worker processes) are measured side by side on the same ledger.
Goal: ≥ 2,000,000 events/s on 2 cores (the two SHA-256 per row alone allow
about 3M/s). Beside the wall-clock rate, the CPU time the native scan took:
on a machine shared with other work the wall clock says how much CPU the
scan got, the CPU time what each event costs. The native scan is timed
``--repeat`` times (default 3) over the same file: the best is the figure, as
timeit takes the least time (what the machine gives when nothing else takes
it), and every rate is printed and kept in the JSON beside the median.
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

GOAL_EVENTS_PER_S = 2_000_000


def _rate(ledger: object, events: int, verifier: str, workers: int | None = None) -> tuple[float, float]:
    """Events per second of wall clock, and per second of this process's CPU time."""
    cpu = time.process_time()
    with timed() as t:
        result = verify_ledger(ledger, workers=workers, verifier=verifier)
    cpu = time.process_time() - cpu
    assert result.ok and result.count == events, result
    return events / t[0], events / cpu


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks verify")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--single", action="store_true", help="Also time one thread/process, for comparison.")
    parser.add_argument("--repeat", type=int, default=3, help="Timed native scans; the best is the figure.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvledger-bench-") as tmp:
        ledger = open_ledger(f"sqlite:///{Path(tmp) / 'ledger.db'}")
        fill_s = fill(ledger, args.events)
        print(f"filled {args.events:,} events in {fill_s:.1f} s (not counted)")
        workers = worker_count(args.events)
        assert native_path(ledger) is not None, "the native verifier is not built (see setup.py)"
        rates = [_rate(ledger, args.events, "native") for _ in range(max(1, args.repeat))]
        native, native_per_cpu_s = max(rates)
        median = sorted(rate for rate, _ in rates)[len(rates) // 2]
        python, _ = _rate(ledger, args.events, "python")  # CPU time is in its worker processes
        print(
            f"verify, native: {native:>12,.0f} events/s ({workers} threads; best of {len(rates)}: "
            + ", ".join(f"{rate:,.0f}" for rate, _ in rates)
            + f"; median {median:,.0f})"
        )
        print(
            f"verify, Python: {python:>12,.0f} events/s ({workers} processes); native/Python "
            f"{native / python:.2f}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        print(
            f"verify, native: {native_per_cpu_s:>12,.0f} events per CPU second "
            f"({1e6 / native_per_cpu_s:.2f} µs of CPU per event)"
        )
        figures = {
            "benchmark": "verify",
            "events": args.events,
            "workers": workers,
            "events_per_s": round(native),
            "events_per_s_runs": [round(rate) for rate, _ in rates],
            "events_per_s_median": round(median),
            "events_per_cpu_s": round(native_per_cpu_s),
            "load_1m": round(os.getloadavg()[0], 2),
            "python_events_per_s": round(python),
            "ratio_native_to_python": round(native / python, 3),
            "goal_events_per_s": GOAL_EVENTS_PER_S,
            "goal_met": native >= GOAL_EVENTS_PER_S,
            "unix_time": int(time.time()),
        }
        if args.single:
            one, one_per_cpu_s = _rate(ledger, args.events, "native", workers=1)
            print(
                f"verify, native, one thread: {one:>12,.0f} events/s ({1e6 / one_per_cpu_s:.2f} µs of CPU "
                f"per event); load {os.getloadavg()[0]:.1f}"
            )
            figures["single_thread_events_per_s"] = round(one)
            figures["single_thread_events_per_cpu_s"] = round(one_per_cpu_s)
        ledger.close()
    emit(figures)
