"""Helper probe: LMCache's own allocators and GPU copy helpers, byte for byte (seed Section 3.2).

The copy-ordering probe re-creates the pattern with torch and ctypes; this one
runs LMCache's code. Each allocator is built by LMCache's L1 configuration
(``L1MemoryManagerConfig`` → ``create_memory_allocator``: ``use_lazy`` picks
``LazyMemoryAllocator``, otherwise ``MixedMemoryAllocator``), a memory object
is allocated from it, and bytes move between that pinned host object and a
GPU buffer through ``lmcache.v1.gpu_connector.gpu_ops``:

- ``lmcache_memcpy_async_d2h(gpu_buffer, memory_obj)`` and
  ``lmcache_memcpy_async_h2d(memory_obj, gpu_buffer)`` branch on the
  allocator. An object of the lazy allocator goes through
  ``lmcache.c_ops.lmcache_memcpy_async`` with raw pointers: the compiled op
  copies on the current stream, the torch fallback (ops masked) calls
  ``cudaMemcpy(..., cudaMemcpyDefault)`` with no stream. Any other object
  goes through ``Tensor.copy_(non_blocking=True)`` on the current stream.

The producer work runs on a non-blocking stream from PyTorch's pool, behind
an optional ``torch.cuda._sleep`` delay, and the helper is called with that
stream current (as LMCache's transfer code calls it). Device-to-host: the
delayed work writes 37 into the GPU buffer; after a full synchronize the
host object must hold 37 in every byte. Host-to-device: the delayed work
reads the GPU buffer's old 0 into a consumer buffer, then the helper writes
53 from the host; the consumer must hold 0 and the GPU buffer 53.

One child process per (GPU, ops state): LMCache's ops are resolved once per
process (collectors/probes/_lmcache.py). A check that raises is recorded as a
check with ``error`` set; a child that dies leaves its unrun checks recorded
the same way. torch and LMCache are imported lazily, in the child.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from collectors.probes._cuda import CudaRuntime, driver_version, gpu_identity, require_cuda
from collectors.probes._envelope import REPO_ROOT, envelope, new_id, utc_now
from collectors.probes._lmcache import (
    OPS_MODES,
    ensure_fallback_copy_lib,
    import_lmcache,
    locate,
    source_digest,
)
from collectors.probes._run import ProbeRun, child_env, finish, run_child, started_event

EXPERIMENT = "probe.lmcache-helpers"
KIND = "probe.helper"
ALLOCATORS: tuple[str, ...] = ("lazy", "mixed")
DIRECTIONS: tuple[str, ...] = ("d2h", "h2d")
DELAYS: tuple[int, ...] = (0, 10**8)
SIZES: tuple[int, ...] = (4 * 1024, 1024 * 1024, 16 * 1024 * 1024)
TRIALS = 5
POOL_BYTES = 64 * 1024 * 1024  # one lazy pin chunk; holds the largest object
HELPERS = {
    "d2h": "lmcache.v1.gpu_connector.gpu_ops.lmcache_memcpy_async_d2h",
    "h2d": "lmcache.v1.gpu_connector.gpu_ops.lmcache_memcpy_async_h2d",
}
# What the helper ran, by the branch it took (the same test LMCache's helper makes).
COPY_NATIVE = "c_ops.lmcache_memcpy_async (compiled, current stream)"
COPY_RAW = "torch_ops.lmcache_memcpy_async (cudaMemcpy, no stream)"
COPY_TENSOR = "Tensor.copy_(non_blocking=True) (current stream)"
TRANSFER_PATH = "gpu"

D2H_VALUE = 37
H2D_OLD = 0
H2D_NEW = 53
CONSUMER_SENTINEL = 255


@dataclass(frozen=True)
class HelperProbeConfig:
    """The matrix: per GPU and ops state, allocators x directions x delays x sizes x trials."""

    sizes: tuple[int, ...] = SIZES
    delays: tuple[int, ...] = DELAYS
    allocators: tuple[str, ...] = ALLOCATORS
    directions: tuple[str, ...] = DIRECTIONS
    ops_modes: tuple[str, ...] = OPS_MODES
    trials: int = TRIALS
    devices: tuple[int, ...] | None = None  # None: every visible GPU
    pool_bytes: int = POOL_BYTES
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for name, values, known in (
            ("allocator", self.allocators, ALLOCATORS),
            ("direction", self.directions, DIRECTIONS),
            ("ops mode", self.ops_modes, OPS_MODES),
        ):
            bad = [v for v in values if v not in known]
            if bad or not values:
                raise ValueError(f"unknown or no {name}(s) {bad}; known: {list(known)}")
        if self.trials < 1:
            raise ValueError("trials must be at least 1")
        if not self.sizes or any(n < 1 for n in self.sizes) or any(c < 0 for c in self.delays):
            raise ValueError("sizes must be positive and delays non-negative")
        if max(self.sizes) > self.pool_bytes:
            raise ValueError(f"the largest size {max(self.sizes)} exceeds pool_bytes {self.pool_bytes}")

    def cells(self) -> list[dict[str, Any]]:
        """Every check one process runs, in order (allocator, size, direction, delay, trial)."""
        return [
            {"allocator": a, "bytes": n, "direction": d, "delay_cycles": c, "trial": t}
            for a in self.allocators
            for n in self.sizes
            for d in self.directions
            for c in self.delays
            for t in range(self.trials)
        ]

    def params(self) -> dict[str, Any]:
        p = asdict(self)
        for key in ("sizes", "delays", "allocators", "directions", "ops_modes"):
            p[key] = list(p[key])
        p["devices"] = None if self.devices is None else list(self.devices)
        p["checks_per_process"] = len(self.cells())
        p["helpers"] = HELPERS
        p["values"] = {"d2h": D2H_VALUE, "h2d_old": H2D_OLD, "h2d_new": H2D_NEW}
        return p

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> HelperProbeConfig:
        names = set(cls.__dataclass_fields__)
        kwargs: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in params.items() if k in names
        }
        return cls(**kwargs)


def cell_key(d: Mapping[str, Any]) -> tuple[Any, ...]:
    return (d["allocator"], d["bytes"], d["direction"], d["delay_cycles"], d["trial"])


# --------------------------------------------------------------------------------------------
# In the child process (needs CUDA and LMCache)


def _first_bad(torch: Any, values: Any, expected: int) -> tuple[int, int | None]:
    bad = values != expected
    count = int(torch.count_nonzero(bad).item())
    if count == 0:
        return 0, None
    return count, int(torch.nonzero(bad.flatten())[0].item())


class _Bench:
    """One memory object of one LMCache allocator, its GPU buffers and the producer stream."""

    def __init__(self, torch: Any, allocator: Any, nbytes: int, device: Any, stream: Any) -> None:
        from lmcache.v1.gpu_connector import gpu_ops
        from lmcache.v1.memory_allocators.lazy_memory_allocator import LazyMemoryAllocator
        from lmcache.v1.memory_management import MemoryFormat

        self.torch, self.stream, self.n, self.gpu_ops = torch, stream, nbytes, gpu_ops
        obj = allocator.allocate(torch.Size([nbytes]), torch.uint8, fmt=MemoryFormat.KV_2LTD)
        if obj is None:
            raise RuntimeError(f"{type(allocator).__name__} returned no memory object for {nbytes} bytes")
        self.obj = obj
        self.host = obj.raw_tensor.view(torch.uint8)[:nbytes]
        self.lazy = isinstance(obj.parent(), LazyMemoryAllocator)
        self.gpu = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.consumer = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.host_pinned = bool(self.host.is_pinned())

    def d2h(self, cycles: int) -> dict[str, Any]:
        torch, s = self.torch, self.stream
        self.host.fill_(0)
        self.gpu.zero_()
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            if cycles:
                torch.cuda._sleep(cycles)
            self.gpu.fill_(D2H_VALUE)  # the (delayed) producer
            self.gpu_ops.lmcache_memcpy_async_d2h(self.gpu, self.obj)
        torch.cuda.synchronize()
        count, first = _first_bad(torch, self.host, D2H_VALUE)
        return {"mismatching_bytes": count, "first_bad_offset": first, "copy_landed_bad_bytes": count}

    def h2d(self, cycles: int) -> dict[str, Any]:
        torch, s = self.torch, self.stream
        self.host.fill_(H2D_NEW)
        self.gpu.fill_(H2D_OLD)
        self.consumer.fill_(CONSUMER_SENTINEL)
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            if cycles:
                torch.cuda._sleep(cycles)
            self.consumer.copy_(self.gpu)  # the (delayed) read of the old value
            self.gpu_ops.lmcache_memcpy_async_h2d(self.obj, self.gpu)
        torch.cuda.synchronize()
        count, first = _first_bad(torch, self.consumer, H2D_OLD)
        landed, _ = _first_bad(torch, self.gpu, H2D_NEW)
        return {"mismatching_bytes": count, "first_bad_offset": first, "copy_landed_bad_bytes": landed}

    def check(self, direction: str, cycles: int) -> dict[str, Any]:
        return self.d2h(cycles) if direction == "d2h" else self.h2d(cycles)


def make_allocator(kind: str, pool_bytes: int) -> Any:
    """An LMCache allocator built by LMCache's own L1 configuration (``use_lazy`` picks the class)."""
    from lmcache.v1.distributed.config import L1MemoryManagerConfig
    from lmcache.v1.distributed.memory_manager.l1_memory_manager import create_memory_allocator

    config = L1MemoryManagerConfig(
        size_in_bytes=pool_bytes,
        use_lazy=kind == "lazy",
        init_size_in_bytes=pool_bytes,  # all of it pinned up front: no background expansion mid-check
        align_bytes=4096,
        shm_name="",
    )
    allocator = create_memory_allocator(config)
    expected = "LazyMemoryAllocator" if kind == "lazy" else "MixedMemoryAllocator"
    if type(allocator).__name__ != expected:
        raise RuntimeError(f"LMCache built {type(allocator).__name__} for use_lazy={kind == 'lazy'}")
    return allocator


def _error_text(exc: BaseException) -> str:
    tail = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return tail[:500]


def _copy_name(lazy: bool, with_ops: bool) -> str:
    if not lazy:
        return COPY_TENSOR
    return COPY_NATIVE if with_ops else COPY_RAW


def _check_row(cell: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    return {"type": "check", **cell, "helper": HELPERS[cell["direction"]], **fields}


def _run_allocator(
    torch: Any,
    kind: str,
    config: HelperProbeConfig,
    cells: list[dict[str, Any]],
    device: Any,
    stream: Any,
    with_ops: bool,
) -> Iterator[dict[str, Any]]:
    try:
        allocator = make_allocator(kind, config.pool_bytes)
    except Exception as exc:
        for cell in cells:
            yield _check_row(cell, error=f"allocator: {_error_text(exc)}", ts=utc_now())
        return
    for nbytes in config.sizes:
        sized = [c for c in cells if c["bytes"] == nbytes]
        try:
            bench = _Bench(torch, allocator, nbytes, device, stream)
            for direction in config.directions:  # warm-up, not recorded
                bench.check(direction, 0)
        except Exception as exc:
            for cell in sized:
                yield _check_row(cell, error=f"setup: {_error_text(exc)}", ts=utc_now())
            continue
        copy = _copy_name(bench.lazy, with_ops)
        for cell in sized:
            ts = utc_now()
            t0 = time.perf_counter()
            try:
                result = bench.check(cell["direction"], cell["delay_cycles"])
            except Exception as exc:
                yield _check_row(
                    cell, copy=copy, host_pinned=bench.host_pinned, error=_error_text(exc), ts=ts
                )
                continue
            yield _check_row(
                cell,
                copy=copy,
                host_pinned=bench.host_pinned,
                error=None,
                ts=ts,
                seconds=round(time.perf_counter() - t0, 6),
                **result,
            )
        del bench  # LMCache frees the object when it is collected


def worker_main(device_index: int, ops: str, config_json: str, out: str) -> int:
    """Child entry: one JSON line of process facts, then one line per check (flushed as it goes)."""
    config = HelperProbeConfig.from_params(json.loads(config_json))
    with open(out, "a", encoding="utf-8", buffering=1) as fh:

        def emit(row: Mapping[str, Any]) -> None:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
            fh.flush()

        try:
            torch = require_cuda()
            torch.cuda.set_device(device_index)
            device = torch.device("cuda", device_index)
            torch.zeros(1, device=device)  # context first
            rt = CudaRuntime.load()
            state = import_lmcache(ops)
            if not state["with_ops"]:
                state.update(ensure_fallback_copy_lib(rt.path))
            state["source_sha256"] = source_digest(state["path"])
            stream = torch.cuda.Stream(device=device)  # PyTorch's pool: cudaStreamNonBlocking
            facts = {
                "type": "process",
                "pid": os.getpid(),
                "lmcache": state,
                "torch_version": torch.__version__,
                "cuda_runtime_version": rt.runtime_version(),
                "libcudart": rt.path,
                "gpu": gpu_identity(device_index),
                "stream_flags": rt.stream_flags(int(stream.cuda_stream)),
            }
        except Exception as exc:
            emit({"type": "setup-error", "error": _error_text(exc), "ops_requested": ops})
            return 3
        emit(facts)
        for kind in config.allocators:
            cells = [c for c in config.cells() if c["allocator"] == kind]
            for row in _run_allocator(torch, kind, config, cells, device, stream, state["with_ops"]):
                emit(row)
    return 0


# --------------------------------------------------------------------------------------------
# Orchestration (parent)


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut off by a crash
            continue
    return rows


def _event_data(row: Mapping[str, Any], facts: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    lm = facts.get("lmcache") or {}
    error = row.get("error")
    count = row.get("mismatching_bytes")
    landed = row.get("copy_landed_bad_bytes")
    passed = error is None and count == 0 and landed == 0
    return {
        "allocator": row["allocator"],
        "helper": row["helper"],
        "copy": row.get("copy"),
        "ops_requested": base["ops_requested"],
        "with_ops": lm.get("with_ops"),
        "direction": row["direction"],
        "bytes": row["bytes"],
        "delay_cycles": row["delay_cycles"],
        "trial": row["trial"],
        "passed": passed,
        "mismatching_bytes": count,
        "first_bad_offset": row.get("first_bad_offset"),
        "copy_landed_bad_bytes": landed,
        "error": error,
        "seconds": row.get("seconds"),
        "host_pinned": row.get("host_pinned"),
        "transfer_path": TRANSFER_PATH,
        "lmcache_version": lm.get("version") or base.get("lmcache_version"),
        "lmcache_source_sha256": lm.get("source_sha256"),
        "lmcache_copy_lib": lm.get("copy_lib"),
        "lmcache_copy_lib_injected": lm.get("copy_lib_injected", False),
        "torch_version": facts.get("torch_version") or base.get("torch_version"),
        "cuda_runtime_version": facts.get("cuda_runtime_version"),
        "driver_version": base.get("driver_version"),
        "gpu": facts.get("gpu") or base.get("gpu"),
        "pid": facts.get("pid"),
    }


def summarize(events: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Passed / failed / errored per path: allocator|ops|direction|delayed."""
    table: dict[str, dict[str, int]] = {}
    for e in events:
        if e.get("kind") != KIND:
            continue
        d = e["data"]
        ops = "ops" if d["with_ops"] else ("no-ops" if d["with_ops"] is False else "ops?")
        key = f"{d['allocator']}|{ops}|{d['direction']}|{'delayed' if d['delay_cycles'] else 'undelayed'}"
        row = table.setdefault(key, {"passed": 0, "failed": 0, "errored": 0})
        row["errored" if d["error"] else ("passed" if d["passed"] else "failed")] += 1
    return dict(sorted(table.items()))


def format_summary(summary: Mapping[str, Mapping[str, int]]) -> str:
    head = ("allocator", "ops", "dir", "delay", "passed", "failed", "errored")
    lines = ["{:9s} {:6s} {:4s} {:9s} {:>6s} {:>6s} {:>7s}".format(*head)]
    for key, row in summary.items():
        allocator, ops, direction, delay = key.split("|")
        lines.append(
            f"{allocator:9s} {ops:6s} {direction:4s} {delay:9s} "
            f"{row['passed']:6d} {row['failed']:6d} {row['errored']:7d}"
        )
    return "\n".join(lines)


def run_helper_probes(
    config: HelperProbeConfig | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> ProbeRun:
    """The whole matrix, one child per (GPU, ops state); returns the run's bare envelopes.

    Raises NoCudaError without CUDA and NoLMCacheError without LMCache, before
    anything runs. Failed and errored checks are results, recorded as events.
    """
    config = config or HelperProbeConfig()
    say = progress or (lambda _msg: None)
    torch = require_cuda()
    lmcache = locate()
    visible = int(torch.cuda.device_count())
    devices = list(range(visible)) if config.devices is None else list(config.devices)
    absent = [d for d in devices if not 0 <= d < visible]
    devices = [d for d in devices if 0 <= d < visible]
    run_id = new_id()
    run = ProbeRun(run_id=run_id)
    driver = driver_version()
    run.events.append(
        started_event(
            run_id,
            experiment=EXPERIMENT,
            script_file=__file__,
            script="collectors/probes/lmcache_helpers.py",
            params={**config.params(), "devices_run": devices, "devices_absent": absent},
            packages={"torch.version.cuda": torch.version.cuda, "lmcache": lmcache["version"]},
            driver=driver,
            lmcache=lmcache,
        )
    )
    processes: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvledger-helpers-") as tmp:
        for device in devices:
            for ops in config.ops_modes:
                out = Path(tmp) / f"gpu{device}-{ops}.jsonl"
                cmd = [
                    sys.executable,
                    "-m",
                    "collectors.probes",
                    "_helper-worker",
                    "--device",
                    str(device),
                    "--ops",
                    ops,
                    "--config",
                    json.dumps(config.params()),
                    "--out",
                    str(out),
                ]
                say(f"helper-probes: GPU {device}, LMCache ops {ops}: {len(config.cells())} checks")
                started = time.perf_counter()
                code, stderr = run_child(cmd, child_env(os.environ), str(REPO_ROOT), config.timeout_s)
                seconds = time.perf_counter() - started
                rows = _read_rows(out)
                facts = next((r for r in rows if r.get("type") == "process"), {})
                setup = next((r for r in rows if r.get("type") == "setup-error"), None)
                base = {
                    "ops_requested": ops,
                    "driver_version": driver,
                    "lmcache_version": lmcache["version"],
                    "torch_version": torch.__version__,
                    "gpu": {"index": device},
                }
                done = set()
                for row in rows:
                    if row.get("type") == "check":
                        done.add(cell_key(row))
                        data = _event_data(row, facts, base)
                        run.events.append(envelope(KIND, data, run_id, ts=row.get("ts")))
                reason = (
                    f"setup: {setup['error']}"
                    if setup
                    else f"worker exited {code} before this check: {stderr.strip()[-300:]}"
                )
                for cell in config.cells():
                    if cell_key(cell) not in done:
                        row = {**cell, "helper": HELPERS[cell["direction"]], "error": reason}
                        run.events.append(envelope(KIND, _event_data(row, facts, base), run_id))
                processes.append(
                    {
                        "device": device,
                        "ops_requested": ops,
                        "exit_code": code,
                        "seconds": round(seconds, 3),
                        "checks_recorded": len(done),
                        "facts": facts,
                        "setup_error": setup,
                        "stderr_tail": stderr.strip()[-2000:],
                    }
                )
                say(
                    f"helper-probes: GPU {device}, ops {ops}: exit {code}, "
                    f"{len(done)} checks in {seconds:.1f} s"
                )
    run.seconds = time.perf_counter() - t0
    probes = run.probe_events()
    run.checks = len(probes)
    run.summary = summarize(probes)
    errored = sum(1 for e in probes if e["data"]["error"])
    finish(
        run,
        checks=run.checks,
        errored_checks=errored,
        checks_per_second=round(run.checks / run.seconds, 3) if run.seconds else None,
        processes=processes,
        summary=run.summary,
    )
    return run
