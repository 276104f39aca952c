"""Report + audit over screening-shaped ledgers of 250k, 1M and 2M events (SQLite).

Ledgers come from reports/_synthetic.py: one validation run, then as many
seed-shaped screening runs (four blocks, 192 measured requests and six
warmups each) as fill the size. Filling and the Parquet snapshot are timed
separately and not counted; the timed part is what `ledger report --json`
and `ledger audit` do on a warm snapshot: derive every table, render JSON,
and run every audit check including the full chain verification.
Goal: ≤ 2 s at 1M events, growing linearly.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from ledger import Ledger, NewEvent, open_ledger
from reports import audit, derive_report, open_source, to_json
from reports._synthetic import Generator

from ._common import emit, timed

SIZES = {"250k": 250_000, "1m": 1_000_000, "2m": 2_000_000}


def envelopes(count: int, seed: int = 314159) -> list[dict[str, Any]]:
    """At least ``count`` screening-shaped bare envelopes, cut at a run boundary after ``count``."""
    from reports._synthetic import Screening

    gen = Generator(seed)
    gen.validation()
    while len(gen.out) < count:
        Screening(gen).run()
    return gen.out


def fill(ledger: Ledger, events: list[dict[str, Any]], batch: int = 50_000) -> None:
    """Through the ledger's own append path (validated, sealed, chained)."""
    for start in range(0, len(events), batch):
        ledger.append_many([NewEvent(e["kind"], e["data"], e["run_id"], e["block_id"], e["id"], e["ts"])
                            for e in events[start:start + batch]])


def measure(directory: Path, label: str, count: int) -> dict[str, Any]:
    with timed() as gen_t:
        events = envelopes(count)
    ledger = open_ledger(f"sqlite:///{directory / f'{label}.db'}")
    with timed() as fill_t:
        fill(ledger, events)
    snapshot_root = directory / "snapshots"
    with timed() as snap_t:
        open_source(ledger, snapshot_root).close()  # builds the Parquet snapshot (not counted)
    with timed() as report_t:
        src = open_source(ledger, snapshot_root)
        text = to_json(derive_report(src))
    with timed() as audit_t:
        findings = audit(src)
    with timed() as verify_t:
        ledger.verify()
    src.close()
    ledger.close()
    blocking = sum(f.severity == "blocking" for f in findings)
    assert blocking == 0, [f for f in findings if f.severity == "blocking"][:3]
    total = report_t[0] + audit_t[0]
    print(f"{label:>5}: {len(events):>9,} events  report {report_t[0]:.2f} s + audit {audit_t[0]:.2f} s "
          f"(of which verify ≈ {verify_t[0]:.2f} s) = {total:.2f} s; not counted: generate {gen_t[0]:.1f} s, "
          f"fill {fill_t[0]:.1f} s, snapshot {snap_t[0]:.1f} s; report JSON {len(text) / 1e6:.1f} MB")
    return {"events": len(events), "seconds": round(total, 3), "report_s": round(report_t[0], 3),
            "audit_s": round(audit_t[0], 3), "verify_s": round(verify_t[0], 3),
            "snapshot_s": round(snap_t[0], 3), "fill_s": round(fill_t[0], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks report")
    parser.add_argument("--sizes", default="250k,1m,2m", help="Comma-separated: 250k, 1m, 2m.")
    args = parser.parse_args()
    timed_what = ("report (derive + JSON) + audit incl. verify, warm Parquet snapshot; "
                  "snapshot build timed separately")
    figures: dict[str, Any] = {"benchmark": "report", "timed": timed_what, "goal_seconds_1m": 2.0}
    with tempfile.TemporaryDirectory(prefix="kvledger-bench-report-") as tmp:
        for label in args.sizes.split(","):
            result = measure(Path(tmp), label, SIZES[label])
            figures[f"seconds_{label}"] = result["seconds"]
            figures[f"detail_{label}"] = result
    figures["unix_time"] = int(time.time())
    emit(figures)


if __name__ == "__main__":
    main()
