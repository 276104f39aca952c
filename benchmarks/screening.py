"""The default seed screening on ``sim``, end to end: seconds and requests per second.

``python -m benchmarks screening [--param NAME=VALUE ...]`` (or
``python -m benchmarks.screening``)

Runs ``ledger run screening`` as a researcher would (four blocks OFF-ON-ON-OFF,
6 warmups and 192 measured requests each, fixtures sized through the sim's
``/tokenize``, every event appended to a fresh SQLite ledger), timing it from
start to ``run.finished``. Goal on a 2-core machine: at most 60 s. The last
line is one JSON object with ``seconds``, ``measured`` and ``requests_per_s``.

The isolation certificate and any divergence triage run inside that time; their
own share is read from the run's events (``probe_s``: from each probe's
``request.sent`` to the ``isolation.certified`` or ``divergence.triaged`` that
closes it), so the overhead is measured in the same run as the total, not by
comparing two runs on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks._common import emit, timed
from experiments._loader import load
from experiments._params import parse_params
from experiments.runner import prepare_params, run_sync
from ledger import open_ledger

GOAL_S = 60.0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks screening")
    parser.add_argument("--param", "-p", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    exp = load("screening")
    params = prepare_params(exp, "sim", parse_params(args.param))
    with tempfile.TemporaryDirectory(prefix="kvledger-bench-") as tmp:
        ledger = open_ledger(f"sqlite:///{Path(tmp) / 'ledger.db'}")
        with timed() as t:
            result = run_sync(ledger, exp, params, target_name="sim")
        events = ledger.count()
        probes, probe_s = _probe_seconds(ledger)
        ledger.close()
    c = result.counters
    total = c.measured + c.warmups
    print(
        f"screening on sim: {result.status}, {c.measured} measured + {c.warmups} warmups, "
        f"{c.assertions} assertions ({c.failed_assertions} failed), {events} events"
    )
    print(
        f"isolation certificate and triage: {probes} probe requests, {probe_s:.2f} s ({probe_s / t[0]:.1%})"
    )
    print(
        f"{t[0]:.1f} s, {total / t[0]:.1f} requests/s (goal <= {GOAL_S:.0f} s: "
        f"{'met' if t[0] <= GOAL_S else 'NOT met'})"
    )
    emit(
        {
            "benchmark": "screening",
            "seconds": round(t[0], 2),
            "measured": c.measured,
            "warmups": c.warmups,
            "requests_per_s": round(total / t[0], 2),
            "events": events,
            "probes": probes,
            "probe_s": round(probe_s, 3),
            "status": result.status,
            "failed_assertions": c.failed_assertions,
            "goal_s": GOAL_S,
            "params": json.loads(json.dumps(args.param)),
            "unix_time": int(time.time()),
        }
    )
    return 0 if result.exit_code == 0 else 1


def _probe_seconds(ledger: Any) -> tuple[int, float]:
    """Probe requests, and the seconds from each probe group's first request to the event closing it."""
    kinds = ["request.sent", "isolation.certified", "divergence.triaged"]
    count, seconds, start = 0, 0.0, None
    for e in ledger.events(kind=kinds):
        if e.kind == "request.sent":
            if e.data.get("probe"):
                count += 1
                start = start or _ts(e.ts)
        elif start is not None:
            seconds += _ts(e.ts) - start
            start = None
    return count, seconds


def _ts(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


if __name__ == "__main__":
    sys.exit(main())
