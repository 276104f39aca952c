"""``python -m collectors.probes {copy-ordering,pinned-alloc,helper-probes,pinned-pool} --jsonl OUT.jsonl``.

Exit status: 0 completed, 1 a probe process failed, 2 bad usage, no CUDA device or
(helper-probes, pinned-pool) no LMCache.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from collectors.probes._cuda import NoCudaError
from collectors.probes._envelope import write_jsonl
from collectors.probes._lmcache import NoLMCacheError

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
        "--host-memory-bytes",
        type=int,
        default=None,
        help="host memory the size guard assumes (default MemTotal)",
    )
    a.add_argument("--no-guard", action="store_true", help="do not skip sizes that may not fit")
    a.add_argument(
        "--alloc-conf",
        action="append",
        default=None,
        help="VAR=value or 'unset' (repeatable; default: unset, and "
        "pinned_max_round_threshold_mb:128 under PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF)",
    )

    h = sub.add_parser("helper-probes", help="LMCache allocators and GPU copy helpers (probe.helper events)")
    h.add_argument("--jsonl", required=True, help="write bare ledger envelopes here")
    h.add_argument("--sizes", type=_ints, help="bytes, comma-separated (4096,1048576,16777216)")
    h.add_argument("--delays", type=_ints, help="sleep cycles, comma-separated (0,1e8)")
    h.add_argument("--allocators", help="comma-separated subset of lazy,mixed")
    h.add_argument("--ops", help="comma-separated subset of present,masked (LMCache's compiled ops)")
    h.add_argument("--trials", type=int, default=None, help="checks per direction and cell (5)")
    h.add_argument("--devices", default="all", help="GPU indices, comma-separated, or 'all' (default)")
    h.add_argument("--timeout", type=float, default=300.0, help="seconds per child process")

    q = sub.add_parser("pinned-pool", help="LMCache's local CPU pool at several sizes (probe.pinned events)")
    q.add_argument("--jsonl", required=True, help="write bare ledger envelopes here")
    q.add_argument("--sizes", type=_ints, help="pool bytes, comma-separated (each a binary-exact GB value)")
    q.add_argument("--ops", help="comma-separated subset of present,masked")
    q.add_argument(
        "--mitigation",
        action="append",
        default=None,
        help="a PYTORCH_CUDA_ALLOC_CONF value to try (repeatable; 'none' for no mitigations)",
    )
    q.add_argument("--mitigate-up-to", type=int, default=None, help="largest size the mitigations run at")
    q.add_argument("--device", type=int, default=0)
    q.add_argument("--host-memory-bytes", type=int, default=None)
    q.add_argument("--no-guard", action="store_true", help="do not skip sizes that may not fit")
    q.add_argument("--deadline", type=float, default=None, help="start no new setting after these seconds")

    w = sub.add_parser("_copy-worker", help=argparse.SUPPRESS)
    w.add_argument("--process", type=int, required=True)
    w.add_argument("--run-id", required=True)
    w.add_argument("--config", required=True)
    w.add_argument("--out", required=True)

    pw = sub.add_parser("_pinned-worker", help=argparse.SUPPRESS)
    pw.add_argument("--bytes", type=int, required=True)
    pw.add_argument("--device", type=int, default=0)
    pw.add_argument("--out", required=True)
    hw = sub.add_parser("_helper-worker", help=argparse.SUPPRESS)
    hw.add_argument("--device", type=int, required=True)
    hw.add_argument("--ops", required=True)
    hw.add_argument("--config", required=True)
    hw.add_argument("--out", required=True)

    qw = sub.add_parser("_pool-worker", help=argparse.SUPPRESS)
    qw.add_argument("--ops", required=True)
    qw.add_argument("--sizes", required=True)
    qw.add_argument("--device", type=int, default=0)
    qw.add_argument("--out", required=True)
    return p


def _names(text: str | None) -> tuple[str, ...] | None:
    if not text:
        return None
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _helper_probes(args: argparse.Namespace) -> int:
    from collectors.probes.lmcache_helpers import HelperProbeConfig, format_summary, run_helper_probes

    kwargs: dict[str, object] = {"timeout_s": args.timeout}
    if args.devices and args.devices != "all":
        kwargs["devices"] = _ints(args.devices)
    chosen = (
        ("sizes", args.sizes),
        ("delays", args.delays),
        ("allocators", _names(args.allocators)),
        ("ops_modes", _names(args.ops)),
        ("trials", args.trials),
    )
    for key, value in chosen:
        if value:
            kwargs[key] = value
    try:
        config = HelperProbeConfig(**kwargs)  # type: ignore[arg-type]
    except ValueError as exc:
        _say(f"error: {exc}")
        return 2
    run = run_helper_probes(config, progress=_say)
    write_jsonl(run.events, args.jsonl)
    print(format_summary(run.summary))
    rate = run.checks / run.seconds if run.seconds else 0.0
    errored = sum(1 for e in run.probe_events() if e["data"]["error"])
    print(
        f"helper-probes: {run.checks} checks ({errored} errored) in {run.seconds:.2f} s = "
        f"{rate:.1f} checks/s; status {run.status}; {len(run.events)} events -> {args.jsonl}"
    )
    return run.exit_code


def _pinned_pool(args: argparse.Namespace) -> int:
    from collectors.probes.lmcache_pool import PoolProbeConfig, run_pool_probe

    kwargs: dict[str, object] = {"device": args.device, "guard": not args.no_guard}
    kwargs["deadline_s"] = args.deadline
    if args.sizes:
        kwargs["sizes"] = args.sizes
    if _names(args.ops):
        kwargs["ops_modes"] = _names(args.ops)
    if args.mitigation:
        kwargs["mitigations"] = tuple(m for m in args.mitigation if m.lower() != "none")
    if args.mitigate_up_to:
        kwargs["mitigate_up_to"] = args.mitigate_up_to
    if args.host_memory_bytes:
        kwargs["host_memory_bytes"] = args.host_memory_bytes
    try:
        config = PoolProbeConfig(**kwargs)  # type: ignore[arg-type]
    except ValueError as exc:
        _say(f"error: {exc}")
        return 2
    run = run_pool_probe(config, progress=_say)
    write_jsonl(run.events, args.jsonl)
    for row in run.summary["pools"]:
        print(
            f"{row['bytes_requested']:>14d} ops={row['with_ops']!s:5s} conf={row['alloc_conf'] or '-':70s} "
            f"pinned={row['is_pinned']!s:5s} reserved={row['bytes_reserved']} s={row['seconds']}"
            + (f" error={row['error']}" if row["error"] else "")
        )
    print(
        f"pinned-pool: {run.checks} pools in {run.seconds:.2f} s; {len(run.summary['skipped'])} skipped; "
        f"status {run.status}; {len(run.events)} events -> {args.jsonl}"
    )
    return run.exit_code


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
        if args.command == "helper-probes":
            return _helper_probes(args)
        if args.command == "pinned-pool":
            return _pinned_pool(args)
        if args.command == "_helper-worker":
            from collectors.probes.lmcache_helpers import worker_main as helper_worker

            return helper_worker(args.device, args.ops, args.config, args.out)
        if args.command == "_pool-worker":
            from collectors.probes.lmcache_pool import worker_main as pool_worker

            return pool_worker(args.ops, args.sizes, args.device, args.out)
        if args.command == "_copy-worker":
            from collectors.probes.copy_ordering import worker_main

            return worker_main(args.process, args.run_id, args.config, args.out)
        if args.command == "_pinned-worker":
            from collectors.probes.pinned_alloc import worker_main as pinned_worker

            return pinned_worker(args.bytes, args.device, args.out)
    except (NoCudaError, NoLMCacheError) as exc:
        _say(str(exc))
        return exc.exit_status
    return 2


if __name__ == "__main__":
    sys.exit(main())
