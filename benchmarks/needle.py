"""The needle model on the CPU engine: cold exact accuracy and logprob margin per size.

``python -m benchmarks needle [--sizes 1024,2048,3072] [--fixtures 16] [--keep DB] [--model needle-exact]
[--asked-lines every|dense]``
``python -m benchmarks needle --db URL --run RUN_ID``  (figures of a recorded run only)

Runs the ``needle_eval`` experiment (``experiments/needle_eval.py``) against the
``vllm`` target with its default model, the committed needle checkpoint, in a
fresh SQLite ledger; or, with ``--run``, reads a run already recorded (a GPU
evaluation brought back, say). Every figure is derived from the run's events:

- exact accuracy per nominal size: passed / all ``exact_values`` assertions of
  the measured requests of that size;
- minimum margin per size: the smallest ``response.received.min_logprob_margin``
  (top-1 minus top-2 logprob over each answer's tokens);
- requests/s: measured requests over the sum of their end-to-end seconds
  (one request at a time, so this is the served rate of one replica).

Each accuracy is printed against the card's 99 % limit (the card's
``threshold``); sizes the card serves are marked. The last line is one JSON
object with ``accuracy_by_size`` and ``min_margin_by_size``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments.fixture_text import ASKED_LINES, marks_every
from experiments.needle import COMMITTED, NEEDLE, committed
from ledger import Ledger, open_ledger
from reports import needle_figures as figures

ROOT = Path(__file__).resolve().parent.parent


def _only_run(led: Ledger) -> str:
    runs = [e.run_id for e in led.events(kind="run.started") if e.run_id]
    if len(runs) != 1:
        raise SystemExit(f"the ledger holds {len(runs)} runs; name one with --run")
    return runs[0]


def evaluate(
    db: str, sizes: list[int], fixtures: int, model: str = NEEDLE.name, asked_lines: str = "spot"
) -> tuple[int, float]:
    """``ledger run needle_eval`` on the CPU engine into ``db``: its exit status and wall time."""
    cmd = [
        sys.executable,
        "-m",
        "ledger",
        "run",
        "needle_eval",
        "--target",
        "vllm",
        "--db",
        db,
        "--no-progress",
        "--param",
        f"sizes={json.dumps(sizes)}",
        "--param",
        f"fixtures={fixtures}",
        "--param",
        f"model={model}",
        "--param",
        f"asked_lines={asked_lines}",
    ]
    # An answer to every value line takes about 11 tokens a line, one every MARK_EVERY (dense:
    # DENSE_EVERY) lines of about 19 tokens each: a prompt's tokens over the spacing leave room.
    room = 512 + (0 if asked_lines == "spot" else max(sizes) // marks_every(asked_lines))
    if max(sizes) + room > 4096:  # the target's default context
        cmd += ["--param", f"max_model_len={max(sizes) + room}"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, check=False)
    wall = time.monotonic() - t0
    print(proc.stdout.strip()[-2000:], proc.stderr.strip()[-2000:] if proc.returncode > 1 else "", sep="\n")
    if proc.returncode not in (0, 1):  # 1: wrong answers, which is what is measured
        raise SystemExit(f"needle_eval failed (exit {proc.returncode})")
    return proc.returncode, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,2048,3072")
    ap.add_argument("--fixtures", type=int, default=16, help="per size")
    ap.add_argument("--db", help="read this ledger instead of running (with --run)")
    ap.add_argument("--run", help="the run to read (default: the ledger's only run)")
    ap.add_argument("--keep", type=Path, help="write the fresh ledger here (SQLite file)")
    ap.add_argument(
        "--asked-lines",
        default="spot",
        choices=ASKED_LINES,
        help="what each fixture asks: the seed's three lines, every value line, or every one of dense ones",
    )
    ap.add_argument(
        "--model", default=NEEDLE.name, choices=[c.name for c in COMMITTED], help="the checkpoint"
    )
    args = ap.parse_args()
    kept = committed(args.model)
    assert kept is not None  # one of argparse's choices
    card = kept.load_card()
    extra: dict[str, Any] = {}
    if args.db:
        url = args.db
    else:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        path = args.keep or Path(tempfile.mkdtemp(prefix="kvl-needle-")) / "ledger.db"
        url = f"sqlite:///{path}"
        status, wall = evaluate(url, sizes, args.fixtures, args.model, args.asked_lines)
        extra = {"exit_code": status, "wall_s": round(wall, 1), "db": url}
    led = open_ledger(url)
    try:
        run = args.run or _only_run(led)
        out = figures(led, run)
        started = next(iter(led.events(run_id=run, kind="run.started")))
    finally:
        led.close()
    # What the run's fixtures asked, as it recorded it; the card's limit for that question.
    asked = (started.data.get("params") or {}).get("asked_lines", "spot")
    limit = card.max_tokens_for(asked) or 0
    print(
        f"\n{args.model}, cold, greedy, {asked} lines asked; limit {card.threshold:.0%} "
        f"(the card serves <= {limit} tokens)"
    )
    print(f"{'size':>8} {'n':>4} {'exact':>8} {'vs limit':>9} {'min margin':>11}")
    for size, acc in out["accuracy_by_size"].items():
        served = "served" if int(size) <= limit else "not served"
        ratio = f"{acc / card.threshold:.3f}" if acc is not None else "-"
        exact = f"{acc:.1%}" if acc is not None else "-"
        margin = out["min_margin_by_size"][size]
        shown = f"{margin:.3f}" if margin is not None else "-"
        print(f"{size:>8} {out['n_by_size'][size]:>4} {exact:>8} {ratio:>9} {shown:>11}  {served}")
    print(f"requests/s (one at a time): {out['requests_per_s']}")
    print(
        json.dumps(
            {**out, **extra, "asked_lines": asked, "threshold": card.threshold, "served_max_tokens": limit},
            sort_keys=True,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
