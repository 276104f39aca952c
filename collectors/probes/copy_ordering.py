"""Copy-ordering byte probe (the seed's Section 3.2).

Pinned host and device buffers are allocated once per size and held fixed;
only the ordering mechanism varies. Work is queued on a non-blocking stream
from PyTorch's stream pool, behind an imposed delay (``torch.cuda._sleep``),
then a copy runs by one of four methods:

- ``raw_fallback``: ``cudaMemcpy(dst, src, n, cudaMemcpyDefault)`` through
  libcudart, no stream (LMCache's lazy-allocator fallback);
- ``wait_then_fallback``: ``stream.synchronize()`` on the stream carrying the
  work, then the same ``cudaMemcpy``;
- ``memcpy_async_current_stream``: ``cudaMemcpyAsync(..., cudaMemcpyDefault,
  stream)`` on the stream carrying the work (the current stream there);
- ``same_stream_tensor_copy``: ``Tensor.copy_(..., non_blocking=True)`` on
  that stream.

Device-to-host: the delayed work writes byte 37 into the device buffer; after
a full synchronize the host buffer must hold 37 in every byte. Host-to-device:
the device buffer holds 0; the delayed work reads it into a consumer buffer,
then the copy writes 53 from the host; the consumer must hold the old 0.
Every check reports its count of mismatching bytes.

``run_copy_ordering`` runs the whole matrix in independent child processes
(two by default) and returns bare ledger envelopes: ``run.started``, one
``probe.copy`` per check, ``run.finished``. torch is imported lazily.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from collectors.probes._cuda import (
    CUDA_STREAM_NON_BLOCKING,
    CudaRuntime,
    driver_version,
    gpu_identity,
    require_cuda,
)
from collectors.probes._envelope import REPO_ROOT, envelope, new_id, utc_now
from collectors.probes._run import ProbeRun, child_env, finish, started_event

EXPERIMENT = "probe.copy-ordering"
KIND = "probe.copy"

METHODS: tuple[str, ...] = (
    "raw_fallback",
    "wait_then_fallback",
    "memcpy_async_current_stream",
    "same_stream_tensor_copy",
)
ORDERED_CONTROLS: tuple[str, ...] = METHODS[1:]
DIRECTIONS: tuple[str, ...] = ("d2h", "h2d")
DELAYS: tuple[int, ...] = (0, 10**8)
SIZES: tuple[int, ...] = (4 * 1024, 1024 * 1024, 16 * 1024 * 1024)
TRIALS = 10
PROCESSES = 2

D2H_VALUE = 37  # written by the delayed work, must arrive on the host
H2D_OLD = 0  # what the delayed read must see
H2D_NEW = 53  # written by the copy after the read was queued
CONSUMER_SENTINEL = 255  # consumer's content before the read (never a pass)


@dataclass(frozen=True)
class CopyOrderingConfig:
    """The matrix to run; defaults are the seed's (480 checks per process, 2 processes)."""

    sizes: tuple[int, ...] = SIZES
    delays: tuple[int, ...] = DELAYS
    methods: tuple[str, ...] = METHODS
    directions: tuple[str, ...] = DIRECTIONS
    trials: int = TRIALS
    processes: int = PROCESSES
    device: int = 0
    parallel: bool = False
    warmup: bool = True

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"unknown method(s) {bad}; known: {list(METHODS)}")
        bad = [d for d in self.directions if d not in DIRECTIONS]
        if bad:
            raise ValueError(f"unknown direction(s) {bad}; known: {list(DIRECTIONS)}")
        if self.trials < 1 or self.processes < 1:
            raise ValueError("trials and processes must be at least 1")
        if any(n < 1 for n in self.sizes) or any(c < 0 for c in self.delays):
            raise ValueError("sizes must be positive and delays non-negative")

    @property
    def checks_per_process(self) -> int:
        return len(self.methods) * len(self.directions) * len(self.delays) * len(self.sizes) * self.trials

    def params(self) -> dict[str, Any]:
        p = asdict(self)
        for key in ("sizes", "delays", "methods", "directions"):
            p[key] = list(p[key])
        p["checks_per_process"] = self.checks_per_process
        p["d2h_value"] = D2H_VALUE
        p["h2d_old_value"] = H2D_OLD
        p["h2d_new_value"] = H2D_NEW
        return p

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CopyOrderingConfig:
        names = {f for f in cls.__dataclass_fields__}
        kwargs: dict[str, Any] = {}
        for key, value in params.items():
            if key in names:
                kwargs[key] = tuple(value) if isinstance(value, list) else value
        return cls(**kwargs)


# --------------------------------------------------------------------------------------------
# In-process checks (need CUDA)


class _Bench:
    """Fixed buffers and the stream for one size."""

    def __init__(self, torch: Any, rt: CudaRuntime, device: Any, stream: Any, nbytes: int):
        self.torch = torch
        self.rt = rt
        self.stream = stream
        self.n = nbytes
        self.host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=True)
        self.dev = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.consumer = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        if not self.host.is_pinned():
            raise RuntimeError("host buffer is not pinned")
        self.host_ptr = int(self.host.data_ptr())
        self.dev_ptr = int(self.dev.data_ptr())

    def _fallback(self, dst: int, src: int) -> None:
        self.rt.memcpy(dst, src, self.n)

    def d2h(self, method: str, cycles: int) -> int:
        torch, s = self.torch, self.stream
        self.dev.zero_()
        self.host.zero_()
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            torch.cuda._sleep(cycles)
            self.dev.fill_(D2H_VALUE)  # the delayed write
            if method == "memcpy_async_current_stream":
                self.rt.memcpy_async(self.host_ptr, self.dev_ptr, self.n, int(s.cuda_stream))
            elif method == "same_stream_tensor_copy":
                self.host.copy_(self.dev, non_blocking=True)
        if method == "raw_fallback":
            self._fallback(self.host_ptr, self.dev_ptr)
        elif method == "wait_then_fallback":
            s.synchronize()
            self._fallback(self.host_ptr, self.dev_ptr)
        torch.cuda.synchronize()
        return int(torch.count_nonzero(self.host != D2H_VALUE).item())

    def h2d(self, method: str, cycles: int) -> int:
        torch, s = self.torch, self.stream
        self.dev.fill_(H2D_OLD)
        self.consumer.fill_(CONSUMER_SENTINEL)
        self.host.fill_(H2D_NEW)
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            torch.cuda._sleep(cycles)
            self.consumer.copy_(self.dev)  # the delayed read of the old value
            if method == "memcpy_async_current_stream":
                self.rt.memcpy_async(self.dev_ptr, self.host_ptr, self.n, int(s.cuda_stream))
            elif method == "same_stream_tensor_copy":
                self.dev.copy_(self.host, non_blocking=True)
        if method == "raw_fallback":
            self._fallback(self.dev_ptr, self.host_ptr)
        elif method == "wait_then_fallback":
            s.synchronize()
            self._fallback(self.dev_ptr, self.host_ptr)
        torch.cuda.synchronize()
        return int(torch.count_nonzero(self.consumer != H2D_OLD).item())

    def check(self, direction: str, method: str, cycles: int) -> int:
        return self.d2h(method, cycles) if direction == "d2h" else self.h2d(method, cycles)


def run_process_checks(
    process: int, config: CopyOrderingConfig, run_id: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the whole matrix in this process; returns (probe.copy envelopes, process facts).

    Needs CUDA (raises NoCudaError otherwise). Normally called in a child
    process by ``run_copy_ordering``.
    """
    torch = require_cuda()
    index = config.device
    torch.cuda.set_device(index)
    device = torch.device("cuda", index)
    torch.zeros(1, device=device)  # create the context before looking for libcudart
    rt = CudaRuntime.load()
    rt.set_device(index)

    stream = torch.cuda.Stream(device=device)  # from PyTorch's stream pool
    stream_p0 = torch.cuda.Stream(device=device, priority=0)
    flags = rt.stream_flags(int(stream.cuda_stream))
    flags_p0 = rt.stream_flags(int(stream_p0.cuda_stream))
    current = torch.cuda.current_stream(device)

    base = {
        "process": process,
        "pid": os.getpid(),
        "torch_version": torch.__version__,
        "cuda_runtime_version": rt.runtime_version(),
        "driver_version": driver_version() or f"cuda-driver-api-{rt.driver_api_version()}",
        "gpu": gpu_identity(index),
    }
    facts: dict[str, Any] = {
        **base,
        "libcudart": rt.path,
        "libcudart_found_by": rt.found_by,
        "torch_cuda": torch.version.cuda,
        "stream_flags": flags,
        "stream_non_blocking": bool(flags & CUDA_STREAM_NON_BLOCKING),
        "stream_priority0_flags": flags_p0,
        "stream_priority0_non_blocking": bool(flags_p0 & CUDA_STREAM_NON_BLOCKING),
        "current_stream_is_legacy_default": int(current.cuda_stream) == 0,
    }

    events: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for nbytes in config.sizes:
        bench = _Bench(torch, rt, device, stream, nbytes)
        if config.warmup:  # load kernels and copy paths once; not recorded
            for direction in config.directions:
                for method in config.methods:
                    bench.check(direction, method, 0)
        for direction in config.directions:
            for cycles in config.delays:
                for method in config.methods:
                    for trial in range(config.trials):
                        ts = utc_now()
                        mismatching = bench.check(direction, method, cycles)
                        data = {
                            "method": method,
                            "direction": direction,
                            "bytes": nbytes,
                            "delay_cycles": cycles,
                            "trial": trial,
                            "mismatching_bytes": mismatching,
                            "passed": mismatching == 0,
                            **base,
                        }
                        events.append(envelope(KIND, data, run_id, ts=ts))
        del bench
    seconds = time.perf_counter() - t0
    facts["checks"] = len(events)
    facts["seconds"] = round(seconds, 6)
    facts["checks_per_second"] = round(len(events) / seconds, 3) if seconds > 0 else None
    return events, facts


# --------------------------------------------------------------------------------------------
# Orchestration (parent)


def summarize(events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Pass/fail counts per method and delay, and per method, direction and delay."""
    by_delay: dict[str, dict[str, int]] = {}
    by_cell: dict[str, dict[str, int]] = {}
    for e in events:
        if e.get("kind") != KIND:
            continue
        d = e["data"]
        for table, key in (
            (by_delay, f"{d['method']}|{d['delay_cycles']}"),
            (by_cell, f"{d['method']}|{d['direction']}|{d['delay_cycles']}"),
        ):
            row = table.setdefault(key, {"passed": 0, "failed": 0})
            row["passed" if d["passed"] else "failed"] += 1
    return {"by_method_delay": by_delay, "by_method_direction_delay": by_cell}


def format_summary(summary: Mapping[str, Any]) -> str:
    lines = [f"{'method':30s} {'dir':4s} {'delay_cycles':>12s} {'passed':>7s} {'failed':>7s}"]
    for key, row in sorted(summary.get("by_method_direction_delay", {}).items()):
        method, direction, delay = key.split("|")
        lines.append(f"{method:30s} {direction:4s} {delay:>12s} {row['passed']:7d} {row['failed']:7d}")
    return "\n".join(lines)


def _spawn_worker(process: int, config: CopyOrderingConfig, run_id: str, out: Path) -> Any:
    cmd = [
        sys.executable,
        "-m",
        "collectors.probes",
        "_copy-worker",
        "--process",
        str(process),
        "--run-id",
        run_id,
        "--config",
        json.dumps(config.params()),
        "--out",
        str(out),
    ]
    return subprocess.Popen(cmd, env=child_env(os.environ), cwd=str(REPO_ROOT))


def run_copy_ordering(
    config: CopyOrderingConfig | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> ProbeRun:
    """Run the copy-ordering matrix in ``config.processes`` independent child processes.

    Raises NoCudaError (before anything runs) without CUDA. A child's failure
    does not raise: the run finishes ``failed`` with the error recorded.
    """
    config = config or CopyOrderingConfig()
    say = progress or (lambda _msg: None)
    torch = require_cuda()
    run_id = new_id()
    run = ProbeRun(run_id=run_id)
    run.events.append(
        started_event(
            run_id,
            experiment=EXPERIMENT,
            script_file=__file__,
            script="collectors/probes/copy_ordering.py",
            params=config.params(),
            packages={"torch.version.cuda": torch.version.cuda},
            driver=driver_version(),
        )
    )

    facts: list[dict[str, Any]] = []
    errors: list[str] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvledger-probe-") as tmp:
        outs = [Path(tmp) / f"process{i}.json" for i in range(config.processes)]
        if config.parallel:
            procs = [_spawn_worker(i, config, run_id, outs[i]) for i in range(config.processes)]
            codes = [p.wait() for p in procs]
        else:
            codes = []
            for i in range(config.processes):
                say(f"copy-ordering: process {i} ({config.checks_per_process} checks)")
                codes.append(_spawn_worker(i, config, run_id, outs[i]).wait())
        for i, (code, out) in enumerate(zip(codes, outs, strict=True)):
            if code != 0 or not out.exists():
                errors.append(f"process {i} exited {code}")
                continue
            result = json.loads(out.read_text())
            run.events.extend(result["events"])
            facts.append(result["facts"])
    run.seconds = time.perf_counter() - t0
    probes = run.probe_events()
    run.checks = len(probes)
    run.summary = summarize(probes)
    if errors:
        run.status, run.error = "failed", "; ".join(errors)
    finish(
        run,
        checks=run.checks,
        checks_per_second=round(run.checks / run.seconds, 3) if run.seconds else None,
        processes=facts,
        summary=run.summary,
    )
    return run


def worker_main(process: int, run_id: str, config_json: str, out: str) -> int:
    """Child-process entry: run the matrix and write ``{events, facts}`` to ``out``."""
    config = CopyOrderingConfig.from_params(json.loads(config_json))
    events, facts = run_process_checks(process, config, run_id)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"events": events, "facts": facts}, fh)
    os.replace(tmp, out)
    print(
        f"copy-ordering: process {process} pid {os.getpid()}: {facts['checks']} checks in "
        f"{facts['seconds']:.3f} s ({facts['checks_per_second']} checks/s); "
        f"stream flags {facts['stream_flags']} (non-blocking={facts['stream_non_blocking']}), "
        f"libcudart {facts['libcudart']} [{facts['libcudart_found_by']}]",
        file=sys.stderr,
        flush=True,
    )
    return 0
