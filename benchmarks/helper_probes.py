"""``python -m benchmarks helper-probes [DIR]``: the committed LMCache helper and pool probe records.

Reads DIR (default tests/data/probes): helper_probes.jsonl and pinned_pool.jsonl
as a GPU run wrote them. Prints checks per second on the GPU beside the
copy-ordering probe's (copy_ordering.jsonl, the same machine kind) and against
the goal (the whole matrix in 5 minutes), the pass / fail table per path, and
the pool sizes with reserved against requested. Exit 2 when the helper
records are not there. Last line: one JSON object.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from collectors.probes.lmcache_helpers import format_summary, summarize

DEFAULT = Path(__file__).resolve().parents[1] / "tests" / "data" / "probes"
GOAL_S = 300.0


def _load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    helper_path = root / "helper_probes.jsonl"
    if not helper_path.exists():
        print(
            f"no helper probe records at {helper_path}: run scripts/gpu-probes on a GPU host and commit "
            "its helper_probes.jsonl there",
            file=sys.stderr,
        )
        return 2
    events = _load(helper_path)
    finished = events[-1]["data"]
    checks = [e for e in events if e["kind"] == "probe.helper"]
    seconds = float(finished["seconds"])
    rate = len(checks) / seconds if seconds else 0.0
    processes = finished.get("processes") or []
    in_process = sum(float(c["data"].get("seconds") or 0.0) for c in checks)
    gpus = sorted({c["data"]["gpu"]["uuid"] for c in checks if isinstance(c["data"]["gpu"], dict)})
    print(
        f"helper probes: {len(checks)} checks on {len(gpus)} GPU(s) in {seconds:.2f} s "
        f"({len(processes)} child processes, LMCache import included) = {rate:.1f} checks/s; "
        f"the checks themselves {in_process:.2f} s"
    )
    peer: dict[str, Any] = {}
    copy_path = root / "copy_ordering.jsonl"
    if copy_path.exists():
        copy = _load(copy_path)[-1]["data"]
        peer = {k: copy[k] for k in ("checks", "seconds", "checks_per_second")}
        print(
            f"peer, copy-ordering probe: {copy['checks']} checks in {copy['seconds']:.2f} s = "
            f"{copy['checks_per_second']:.1f} checks/s; helper/copy rate ratio "
            f"{rate / copy['checks_per_second']:.2f}"
        )
    print(f"limit: whole matrix in {GOAL_S:.0f} s; this run used {seconds / GOAL_S:.2%} of it")
    table = summarize(events)
    print(format_summary(table))
    pools: list[dict[str, Any]] = []
    pool_path = root / "pinned_pool.jsonl"
    if pool_path.exists():
        for e in _load(pool_path):
            if e["kind"] != "probe.pinned":
                continue
            d = e["data"]
            ratio = d["bytes_reserved"] / d["bytes_requested"] if d["bytes_reserved"] else None
            keys = (
                "bytes_requested",
                "bytes_reserved",
                "with_ops",
                "alloc_conf",
                "is_pinned",
                "seconds",
                "error",
            )
            pools.append({k: d.get(k) for k in keys} | {"ratio": ratio})
            print(
                f"pool {d['bytes_requested']:>14d} B ops={d['with_ops']!s:5s} "
                f"conf={d['alloc_conf'] or '-'}: reserved {d['bytes_reserved']} "
                + (f"({ratio:.3f}x) " if ratio else "")
                + f"pinned={d['is_pinned']} {d['seconds']} s"
                + (f" error={d['error']}" if d["error"] else "")
            )
    print(
        json.dumps(
            {
                "benchmark": "helper-probes",
                "records": str(helper_path),
                "checks": len(checks),
                "gpus": gpus,
                "seconds": seconds,
                "checks_per_second": round(rate, 3),
                "check_seconds": round(in_process, 3),
                "goal_seconds": GOAL_S,
                "fraction_of_goal": round(seconds / GOAL_S, 4),
                "peer_copy_ordering": peer,
                "paths": table,
                "pools": pools,
            },
            sort_keys=True,
        )
    )
    return 0
