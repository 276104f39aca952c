"""The committed GPU screening, re-read: request rate and the seed's Table 3 ratios per size.

``python -m benchmarks gpu-screening [--data DIR ...]`` (default: every committed
GPU study, ``tests/data/gpu``, ``tests/data/gpu-mp``, ``tests/data/gpu-mp-32k``,
``tests/data/gpu-published``, ``tests/data/gpu-replay``, ``tests/data/gpu-replay-3`` and
``tests/data/gpu-pooled``,
side by side)

For each study, imports its export (``ledger.jsonl.xz``) into a fresh SQLite
ledger and prints, for each of its screening runs in the order they started (a
study that replays a run holds the original and its replay):

- measured requests per second of wall time (``run.started`` to ``run.finished``;
  the isolation certificate's probe requests are not measured);
- per prompt size, the median TTFT of the micro chains' steps by arm, and the
  seed's ratios: ON/OFF cross-replica TTFT, cross-replica reuse against the
  first local reuse (ON ``cross`` / ON ``local1``), cold against cross (ON).
  The seed's Table 3 has the shape cold ≫ cross > local: both last ratios > 1.
- how many ON blocks had a measured cold request with hits: the audit excludes
  those blocks (namespace-leak), so their figures describe, they compare nothing.

The last line is one JSON object: ``studies``, one entry per screening run, in order
(``replay_of`` names the run a replay re-ran).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks._common import emit
from ledger import open_ledger, query
from ledger._jsonl import import_jsonl

REPO = Path(__file__).resolve().parents[1]
DEFAULT = [
    REPO / "tests" / "data" / name
    for name in (
        "gpu",
        "gpu-mp",
        "gpu-mp-32k",
        "gpu-published",
        "gpu-replay",
        "gpu-replay-3",
        "gpu-pooled",
        "gpu-pooled-12",
        "gpu-pooled-18",
    )
]


def _seconds(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks gpu-screening")
    parser.add_argument(
        "--data",
        type=Path,
        action="append",
        help="a study folder with ledger.jsonl.xz (repeatable; default: every committed GPU study)",
    )
    args = parser.parse_args()
    folders: list[Path] = args.data or DEFAULT
    missing = [f for f in folders if not (f / "ledger.jsonl.xz").is_file()]
    if missing:
        print(f"error: no committed export at {missing[0] / 'ledger.jsonl.xz'}", file=sys.stderr)
        return 2
    studies = []
    for i, folder in enumerate(folders):
        if i:
            print()
        result = study(folder)
        if result is None:
            return 2
        studies += result
    emit({"benchmark": "gpu-screening", "studies": studies})
    return 0


def study(data: Path) -> list[dict[str, Any]] | None:
    """One study's screening runs, each one's rate, medians and ratios printed; their figures
    (None: it holds no screening)."""
    export = data / "ledger.jsonl.xz"
    figures: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvledger-gpu-") as tmp:
        ledger = open_ledger(f"sqlite:///{Path(tmp) / 'ledger.db'}")
        try:
            import_jsonl(ledger, export)
            columns = {r["column_name"] for r in query(ledger, "DESCRIBE run_started").to_pylist()}
            replay_of = "s.replay_of" if "replay_of" in columns else "NULL"
            runs = query(
                ledger,
                f"""SELECT s.run_id, s.ts AS started, f.ts AS finished, f.data, {replay_of} AS replay_of
                    FROM (SELECT * FROM run_started WHERE experiment = 'screening') s
                    LEFT JOIN (SELECT run_id, ts, status AS data FROM run_finished) f USING (run_id)
                    ORDER BY s.seq""",
            ).to_pylist()
            if not runs:
                print(f"error: {export} holds no screening run", file=sys.stderr)
                return None
            # request_sent's columns are the fields its events carry: no probe, no probe column.
            columns = {r["column_name"] for r in query(ledger, "DESCRIBE request_sent").to_pylist()}
            unprobed = " AND probe IS NULL" if "probe" in columns else ""
            for index, run in enumerate(runs):
                if index:
                    print()
                figures.append(_run(ledger, data, run, unprobed))
        finally:
            ledger.close()
    return figures


def _run(ledger: Any, data: Path, run: dict[str, Any], unprobed: str) -> dict[str, Any]:
    """One screening run's rate, medians and ratios, printed; its figures. ``unprobed``: the SQL
    that leaves out the isolation certificate's probe requests, where the ledger records any."""
    rows = query(
        ledger,
        f"""
        SELECT b.arm, q.step, q.nominal_tokens, r.ttft_s
        FROM request_sent q JOIN block_started b USING (block_id)
        JOIN response_received r USING (request_id)
        WHERE q.run_id = '{run["run_id"]}' AND q.workload = 'micro' AND NOT q.warmup
          AND r.ttft_s IS NOT NULL""",
    ).to_pylist()
    leaky = query(
        ledger,
        f"""
        SELECT count(DISTINCT b.block_id) FILTER (WHERE h.local_hit_tokens > 0
                   OR h.external_hit_tokens > 0) AS leaky, count(DISTINCT b.block_id) AS blocks
        FROM request_sent q JOIN block_started b USING (block_id)
        JOIN hits_observed h USING (request_id)
        WHERE q.run_id = '{run["run_id"]}' AND b.arm = 'ON' AND q.step = 'cold'
          AND NOT q.warmup""",
    ).to_pylist()[0]
    measured = query(
        ledger,
        f"""SELECT count(*) AS n FROM request_sent
            WHERE run_id = '{run["run_id"]}' AND NOT warmup{unprobed}""",
    ).to_pylist()[0]["n"]
    wall = _seconds(str(run["finished"])) - _seconds(str(run["started"])) if run["finished"] else None
    groups: dict[tuple[str, str, int], list[float]] = {}
    for r in rows:
        groups.setdefault((r["arm"], r["step"], int(r["nominal_tokens"])), []).append(float(r["ttft_s"]))
    medians = {k: statistics.median(v) for k, v in groups.items()}
    sizes = sorted({k[2] for k in medians})
    per_size: list[dict[str, Any]] = []
    replay = f", a replay of {run['replay_of']}" if run["replay_of"] else ""
    print(f"{data.name}: screening {run['run_id']}{replay}, status {run['data']}")
    print(
        f"{measured} measured requests in {wall:.1f} s of wall time: {measured / wall:.2f} requests/s"
        if wall
        else f"{measured} measured requests; the run did not finish"
    )
    print(
        f"ON blocks with a cold request that saw hits (excluded by the audit): "
        f"{leaky['leaky']} of {leaky['blocks']}"
    )
    print(
        f"{'size':>8} {'cold ON':>9} {'cross ON':>9} {'cross OFF':>9} {'local1 ON':>9} "
        f"{'cross ON/OFF':>12} {'cross/local1':>12} {'cold/cross':>10}"
    )
    for size in sizes:
        m = {
            (arm, step): medians.get((arm, step, size))
            for arm in ("ON", "OFF")
            for step in ("cold", "cross", "local1")
        }
        row = {
            "size": size,
            "median_ttft_s": {f"{s}_{a}": v for (a, s), v in m.items()},
            "cross_on_over_off": _ratio(m["ON", "cross"], m["OFF", "cross"]),
            "cross_over_local1_on": _ratio(m["ON", "cross"], m["ON", "local1"]),
            "cold_over_cross_on": _ratio(m["ON", "cold"], m["ON", "cross"]),
        }
        per_size.append(row)

        def ms(v: float | None) -> str:
            return f"{v * 1000:8.1f}ms" if v is not None else f"{'-':>10}"

        ratios = [row["cross_on_over_off"], row["cross_over_local1_on"], row["cold_over_cross_on"]]
        print(
            f"{size:>8} {ms(m['ON', 'cold'])} {ms(m['ON', 'cross'])} {ms(m['OFF', 'cross'])} "
            f"{ms(m['ON', 'local1'])} {ratios[0]!s:>12} {ratios[1]!s:>12} {ratios[2]!s:>10}"
        )
    return {
        "data": str(data.resolve().relative_to(REPO)) if data.resolve().is_relative_to(REPO) else str(data),
        "run_id": run["run_id"],
        "replay_of": run["replay_of"],
        "measured": measured,
        "on_blocks_with_cold_hits": leaky["leaky"],
        "wall_s": round(wall, 2) if wall else None,
        "requests_per_s": round(measured / wall, 3) if wall else None,
        "sizes": per_size,
    }
