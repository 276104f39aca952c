"""``python -m collectors.probes {copy-ordering,pinned-alloc} --jsonl OUT.jsonl``.

Exit status: 0 completed, 1 a probe process failed, 2 bad usage or no CUDA device.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from collectors.probes._cuda import NoCudaError
from collectors.probes._envelope import write_jsonl

GIB = 1 << 30


def _ints(text: str) -> tuple[int, ...]:
    """Comma-separated integers; accepts ``1e8``, ``2**30+4096``-free forms like ``1073745920``."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if part:
            out.append(int(float(part)) if "e" in part.lower() else int(part))
    return tuple(out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m collectors.probes", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("copy-ordering", help="copy-ordering byte probe (probe.copy events)")
    c.add_argument("--jsonl", required=True, help="write bare ledger envelopes here")
    c.add_argument("--sizes", type=_ints, help="bytes, comma-separated (4096,1048576,16777216)")
    c.add_argument("--delays", type=_ints, help="sleep cycles, comma-separated (0,1e8)")
    c.add_argument("--methods", help="comma-separated subset of the four methods")
    c.add_argument("--trials", type=int, default=10)
    c.add_argument("--processes", type=int, default=2)
    c.add_argument("--device", type=int, default=0)
    c.add_argument("--parallel", action="store_true", help="run the processes concurrently")

    a = sub.add_parser("pinned-alloc", help="pinned-allocation probe (probe.pinned_alloc)")
    a.add_argument("--jsonl", required=True)
    a.add_argument("--sizes", type=_ints, help="bytes, comma-separated")
    a.add_argument("--device", type=int, default=0)
    a.add_argument(
        "--host-memory-bytes", type=int, default=None,
        help="host memory the size guard assumes (default MemTotal)",
    )  # fmt: skip
    a.add_argument("--no-guard", action="store_true", help="do not skip sizes that may not fit")
    a.add_argument(
        "--alloc-conf", action="append", default=None,
        help="VAR=value or 'unset' (repeatable; default: unset, and "
        "pinned_max_round_threshold_mb:128 under PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF)",
    )  # fmt: skip

    w = sub.add_parser("_copy-worker", help=argparse.SUPPRESS)
    w.add_argument("--process", type=int, required=True)
    w.add_argument("--run-id", required=True)
    w.add_argument("--config", required=True)
    w.add_argument("--out", required=True)

    pw = sub.add_parser("_pinned-worker", help=argparse.SUPPRESS)
    pw.add_argument("--bytes", type=int, required=True)
    pw.add_argument("--device", type=int, default=0)
    pw.add_argument("--out", required=True)
    return p


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "copy-ordering":
            from collectors.probes.copy_ordering import (
                CopyOrderingConfig,
                format_summary,
                run_copy_ordering,
            )

            kwargs: dict[str, object] = {
                "trials": args.trials,
                "processes": args.processes,
                "device": args.device,
                "parallel": args.parallel,
            }
            if args.sizes:
                kwargs["sizes"] = args.sizes
            if args.delays:
                kwargs["delays"] = args.delays
            if args.methods:
                kwargs["methods"] = tuple(m.strip() for m in args.methods.split(",") if m.strip())
            try:
                config = CopyOrderingConfig(**kwargs)  # type: ignore[arg-type]
            except ValueError as exc:
                _say(f"error: {exc}")
                return 2
            run = run_copy_ordering(config, progress=_say)
            write_jsonl(run.events, args.jsonl)
            print(format_summary(run.summary))
            rate = run.checks / run.seconds if run.seconds else 0.0
            print(
                f"copy-ordering: {run.checks} checks ({config.processes} processes x "
                f"{config.checks_per_process}) in {run.seconds:.2f} s = {rate:.1f} checks/s; "
                f"status {run.status}{'' if run.error is None else ': ' + run.error}; "
                f"{len(run.events)} events -> {args.jsonl}"
            )
            return run.exit_code
        if args.command == "pinned-alloc":
            from collectors.probes.pinned_alloc import PinnedAllocConfig, run_pinned_alloc

            pkw: dict[str, object] = {"device": args.device, "guard": not args.no_guard}
            if args.sizes:
                pkw["sizes"] = args.sizes
            if args.alloc_conf:
                pkw["alloc_confs"] = tuple(None if c in ("unset", "none", "") else c for c in args.alloc_conf)
            if args.host_memory_bytes:
                pkw["host_memory_bytes"] = args.host_memory_bytes
            prun = run_pinned_alloc(PinnedAllocConfig(**pkw), progress=_say)  # type: ignore[arg-type]
            write_jsonl(prun.events, args.jsonl)
            print(
                f"pinned-alloc: {prun.checks} allocations in {prun.seconds:.2f} s; "
                f"status {prun.status}{'' if prun.error is None else ': ' + prun.error}; "
                f"{len(prun.events)} events -> {args.jsonl}"
            )
            return prun.exit_code
        if args.command == "_copy-worker":
            from collectors.probes.copy_ordering import worker_main

            return worker_main(args.process, args.run_id, args.config, args.out)
        if args.command == "_pinned-worker":
            from collectors.probes.pinned_alloc import worker_main as pinned_worker

            return pinned_worker(args.bytes, args.device, args.out)
    except NoCudaError as exc:
        _say(str(exc))
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
