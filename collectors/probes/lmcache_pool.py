"""Pool probe: the pinned local CPU pool LMCache really allocates (seed Section 3.3).

LMCache's local CPU backend sizes its pool from ``max_local_cpu_size`` (GB,
``LMCACHE_MAX_LOCAL_CPU_SIZE``) and builds it in
``LocalCPUBackend.initialize_allocator``: a ``MixedMemoryAllocator`` over
``lmcache.c_ops.alloc_pinned_ptr``. With the compiled ops that is a direct
pinned allocation; without them (the torch fallback) it is
``torch.empty(size + page, pin_memory=True)``, which PyTorch's caching host
allocator may round up to the next power of two: the seed's 256 GiB + 4096
bytes that could become 512 GiB.

Each (LMCache ops state, PyTorch allocator setting) runs in one fresh child
process: it sets the LMCache variables, loads LMCache's configuration as
LMCache does (``load_engine_config_with_overrides``), builds the pool for
each size in ascending order, measures it, and closes it. What was
reserved is measured as in the pinned-allocation probe: the growth of
``torch.cuda.host_memory_stats()`` (when torch's allocator served it), the
mapping that holds the pool's pointer (``/proc/self/maps``), RSS and
``MemFree``. A PyTorch setting that torch refuses is an observation: the
event has ``error`` set at ``cuda-init`` and nothing allocated.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from collectors.probes._cuda import driver_version, gpu_identity, require_cuda
from collectors.probes._envelope import REPO_ROOT, envelope, meminfo, new_id, utc_now
from collectors.probes._lmcache import OPS_MODES, import_lmcache, locate, source_digest
from collectors.probes._run import ProbeRun, child_env, finish, run_child, started_event
from collectors.probes.pinned_alloc import (
    ALLOC_CONF_VARS,
    _delta,
    _host_stats,
    _mapping_containing,
    _proc_status,
    _stats_delta,
    next_power_of_two,
    split_alloc_conf,
)

EXPERIMENT = "probe.lmcache-pool"
KIND = "probe.pinned"
GIB = 1 << 30
SIZES: tuple[int, ...] = (GIB, GIB + 4096, 8 * GIB + 4096, 32 * GIB + 4096)
SETTING_VAR = "LMCACHE_MAX_LOCAL_CPU_SIZE"
# PyTorch host-allocator settings (PYTORCH_CUDA_ALLOC_CONF) tried against rounding. The first is
# the seed's knob; a torch without it refuses the key at CUDA initialisation (seconds, so it goes
# first: a deadline never skips that observation).
MITIGATIONS: tuple[str, ...] = (
    "pinned_max_round_threshold_mb:128",
    "pinned_use_cuda_host_register:True,pinned_num_register_threads:8",
    "pinned_use_background_threads:True",
)


def gb_setting(nbytes: int) -> str:
    """``max_local_cpu_size`` in GB whose ``int(x * 1024**3)`` is exactly ``nbytes`` (binary-exact)."""
    text = repr(nbytes / GIB)
    if int(float(text) * 1024**3) != nbytes:
        raise ValueError(f"{nbytes} bytes cannot be expressed exactly as max_local_cpu_size GB")
    return text


@dataclass(frozen=True)
class PoolProbeConfig:
    """Which pools to build: every size without a PyTorch setting for each ops state, then mitigations."""

    sizes: tuple[int, ...] = SIZES
    ops_modes: tuple[str, ...] = OPS_MODES
    mitigations: tuple[str, ...] = MITIGATIONS
    mitigate_ops: tuple[str, ...] = ("masked",)  # torch's host allocator serves the pool only without ops
    mitigate_up_to: int = 8 * GIB + 4096  # mitigations on sizes up to this (time on the host is short)
    device: int = 0
    host_memory_bytes: int | None = None
    guard: bool = True
    timeout_s: float = 300.0
    deadline_s: float | None = None  # stop starting new settings after this many seconds

    def __post_init__(self) -> None:
        bad = [o for o in (*self.ops_modes, *self.mitigate_ops) if o not in OPS_MODES]
        if bad:
            raise ValueError(f"unknown ops mode(s) {bad}; known: {list(OPS_MODES)}")
        if not self.sizes or any(n < 1 for n in self.sizes):
            raise ValueError("sizes must be positive")
        for n in self.sizes:
            gb_setting(n)

    def settings(self) -> list[dict[str, Any]]:
        """One child process each: ``{ops, alloc_conf, sizes}`` (sizes ascending)."""
        ordered = tuple(sorted(self.sizes))
        out = [{"ops": ops, "alloc_conf": None, "sizes": list(ordered)} for ops in self.ops_modes]
        small = [n for n in ordered if n <= self.mitigate_up_to]
        for conf in self.mitigations:
            for ops in self.mitigate_ops:
                if ops in self.ops_modes and small:
                    out.append({"ops": ops, "alloc_conf": conf, "sizes": small})
        return out

    def params(self) -> dict[str, Any]:
        p = asdict(self)
        for key in ("sizes", "ops_modes", "mitigations", "mitigate_ops"):
            p[key] = list(p[key])
        p["settings"] = self.settings()
        p["lmcache_setting"] = SETTING_VAR
        return p


# --------------------------------------------------------------------------------------------
# In the child process


def _error_text(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()[:500]


def _measure_pool(torch: Any, nbytes: int) -> dict[str, Any]:
    """Build LMCache's local CPU pool of ``nbytes`` the way its backend does; measure; close it."""
    from lmcache.v1.config import load_engine_config_with_overrides
    from lmcache.v1.platform import torch_ops
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

    setting = gb_setting(nbytes)
    os.environ[SETTING_VAR] = setting
    os.environ["LMCACHE_LOCAL_CPU"] = "True"
    config = load_engine_config_with_overrides()
    status_before, mem_before, stats_before = _proc_status(), meminfo(), _host_stats(torch)
    error: str | None = None
    allocator: Any = None
    t0 = time.perf_counter()
    try:
        # initialize_allocator reads only the config (no engine metadata on this path).
        backend = LocalCPUBackend.__new__(LocalCPUBackend)
        allocator = backend.initialize_allocator(config, None)
    except Exception as exc:
        error = _error_text(exc)
    seconds = time.perf_counter() - t0
    status_after, mem_after, stats_after = _proc_status(), meminfo(), _host_stats(torch)
    buffer = getattr(allocator, "buffer", None)
    pointer = int(buffer.data_ptr()) if buffer is not None else None
    is_pinned = bool(buffer.is_pinned()) if buffer is not None else False
    mapping = _mapping_containing(pointer) if pointer else None
    stats_delta = _stats_delta(stats_before, stats_after)
    reserved: int | None = None
    method: str | None = None
    if stats_delta and stats_delta.get("allocated_bytes.current", 0) > 0:
        reserved = stats_delta["allocated_bytes.current"]
        method = "torch.cuda.host_memory_stats()['allocated_bytes.current'] delta"
    elif mapping is not None:
        reserved, method = int(mapping["bytes"]), "/proc/self/maps: mapping holding the pool pointer"
    data = {
        "setting": {SETTING_VAR: setting, "LMCACHE_LOCAL_CPU": "True"},
        "max_local_cpu_size_gb": config.max_local_cpu_size,
        "allocator": None if allocator is None else type(allocator).__name__,
        "bytes_requested": nbytes,
        "pool_bytes": None if buffer is None else int(buffer.numel()),
        "bytes_reserved": reserved,
        "method_of_measurement": method,
        "is_pinned": is_pinned,
        "lmcache_fell_back_to_pageable": torch_ops._use_pinned is False,
        "seconds": round(seconds, 6),
        "error": error,
        "failed_at": None if error is None else "pool",
        "measurements": {
            "host_memory_stats_delta": stats_delta,
            "mapping": mapping,
            "memfree_drop_bytes": None if (d := _delta(mem_after, mem_before, "MemFree")) is None else -d,
            "rss_delta_bytes": _delta(status_after, status_before, "VmRSS"),
            "rss_shmem_delta_bytes": _delta(status_after, status_before, "RssShmem"),
        },
    }
    if allocator is not None:
        try:
            allocator.close()
        except Exception as exc:
            data["close_error"] = _error_text(exc)
    empty = getattr(torch._C, "_host_emptyCache", None)
    data["host_cache_emptied"] = False
    if empty is not None:
        try:
            empty()
            data["host_cache_emptied"] = True
        except Exception:
            pass
    return data


def worker_main(ops: str, sizes_json: str, device: int, out: str) -> int:
    """Child entry: one JSON line of process facts, then one line per pool size."""
    sizes = [int(n) for n in json.loads(sizes_json)]
    conf_env = {k: os.environ[k] for k in ALLOC_CONF_VARS if k in os.environ}
    with open(out, "a", encoding="utf-8", buffering=1) as fh:

        def emit(row: Mapping[str, Any]) -> None:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
            fh.flush()

        torch = require_cuda()
        t0 = time.perf_counter()
        try:
            torch.cuda.set_device(device)
            torch.zeros(1, device=torch.device("cuda", device))  # a refused allocator setting raises here
        except Exception as exc:
            for n in sizes:
                emit(
                    {
                        "type": "pool",
                        "bytes_requested": n,
                        "is_pinned": False,
                        "bytes_reserved": None,
                        "seconds": round(time.perf_counter() - t0, 6),
                        "error": _error_text(exc),
                        "failed_at": "cuda-init",
                        "alloc_conf_env": conf_env,
                        "ts": utc_now(),
                    }
                )
            return 0
        try:
            state = import_lmcache(ops)
            state["source_sha256"] = source_digest(state["path"])
        except Exception as exc:
            emit({"type": "setup-error", "error": _error_text(exc)})
            return 3
        emit(
            {
                "type": "process",
                "pid": os.getpid(),
                "lmcache": state,
                "torch_version": torch.__version__,
                "gpu": gpu_identity(device),
                "alloc_conf_env": conf_env,
            }
        )
        for n in sizes:
            ts = utc_now()
            try:
                row = _measure_pool(torch, n)
            except Exception as exc:
                row = {
                    "bytes_requested": n,
                    "is_pinned": False,
                    "bytes_reserved": None,
                    "seconds": 0.0,
                    "error": _error_text(exc),
                    "failed_at": "probe",
                }
            emit({"type": "pool", **row, "alloc_conf_env": conf_env, "ts": ts})
    return 0


# --------------------------------------------------------------------------------------------
# Orchestration (parent)


def _child_env(alloc_conf: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ALLOC_CONF_VARS}
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    return child_env(env)


def _rows(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def run_pool_probe(
    config: PoolProbeConfig | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> ProbeRun:
    """Every setting in a fresh child; returns ``run.started``, ``probe.pinned`` x N, ``run.finished``.

    Raises NoCudaError / NoLMCacheError before anything runs. Sizes whose
    power-of-two ceiling would not fit 90 % of host memory are skipped (listed
    in ``run.finished``) unless ``config.guard`` is False.
    """
    config = config or PoolProbeConfig()
    say = progress or (lambda _msg: None)
    torch = require_cuda()
    lmcache = locate()
    run_id = new_id()
    run = ProbeRun(run_id=run_id)
    host_bytes = config.host_memory_bytes or meminfo().get("MemTotal") or 0
    driver = driver_version()
    run.events.append(
        started_event(
            run_id,
            experiment=EXPERIMENT,
            script_file=__file__,
            script="collectors/probes/lmcache_pool.py",
            params={**config.params(), "host_memory_bytes_used_by_guard": host_bytes},
            packages={"torch.version.cuda": torch.version.cuda, "lmcache": lmcache["version"]},
            driver=driver,
            lmcache=lmcache,
        )
    )
    skipped: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvledger-pool-") as tmp:
        for i, setting in enumerate(config.settings()):
            ops, conf = setting["ops"], setting["alloc_conf"]
            sizes = []
            for n in setting["sizes"]:
                if config.guard and next_power_of_two(n + 4096) > 0.9 * host_bytes:
                    skipped.append(
                        {
                            "bytes_requested": n,
                            "ops": ops,
                            "alloc_conf": conf,
                            "reason": f"may not fit host memory ({host_bytes} bytes)",
                        }
                    )
                else:
                    sizes.append(n)
            if config.deadline_s is not None and time.perf_counter() - t0 > config.deadline_s:
                skipped.extend(
                    {"bytes_requested": n, "ops": ops, "alloc_conf": conf, "reason": "deadline"}
                    for n in sizes
                )
                continue
            if not sizes:
                continue
            out = Path(tmp) / f"setting{i}.jsonl"
            cmd = [
                sys.executable,
                "-m",
                "collectors.probes",
                "_pool-worker",
                "--ops",
                ops,
                "--sizes",
                json.dumps(sizes),
                "--device",
                str(config.device),
                "--out",
                str(out),
            ]
            say(f"pinned-pool: ops {ops}, PYTORCH_CUDA_ALLOC_CONF={conf or '(unset)'}: sizes {sizes}")
            started = time.perf_counter()
            code, stderr = run_child(cmd, _child_env(conf), str(REPO_ROOT), config.timeout_s)
            rows = _rows(out)
            facts = next((r for r in rows if r.get("type") == "process"), {})
            setup = next((r for r in rows if r.get("type") == "setup-error"), None)
            lm = facts.get("lmcache") or {}
            var, value = split_alloc_conf(conf)
            context = (lm, ops, conf, var, value, facts, lmcache, torch.__version__, driver)
            done = set()
            for row in [r for r in rows if r.get("type") == "pool"]:
                done.add(row["bytes_requested"])
                data = _event_data(row, *context)
                run.events.append(envelope(KIND, data, run_id, ts=row.get("ts")))
                say(
                    f"pinned-pool: {row['bytes_requested']} B: pinned={data['is_pinned']} "
                    f"reserved={data['bytes_reserved']} in {data['seconds']} s"
                    + ("" if data["error"] is None else f"; error: {data['error']}")
                )
            reason = f"setup: {setup['error']}" if setup else f"worker exited {code}: {stderr.strip()[-300:]}"
            for n in sizes:
                if n not in done:
                    row = {
                        "bytes_requested": n,
                        "is_pinned": False,
                        "bytes_reserved": None,
                        "seconds": 0.0,
                        "error": reason,
                        "failed_at": "worker",
                    }
                    data = _event_data(row, *context)
                    run.events.append(envelope(KIND, data, run_id))
            processes.append(
                {
                    "ops_requested": ops,
                    "alloc_conf": conf,
                    "exit_code": code,
                    "seconds": round(time.perf_counter() - started, 3),
                    "facts": facts,
                    "stderr_tail": stderr.strip()[-2000:],
                }
            )
    run.seconds = time.perf_counter() - t0
    probes = run.probe_events()
    run.checks = len(probes)
    run.summary = {
        "pools": [
            {
                k: e["data"].get(k)
                for k in (
                    "bytes_requested",
                    "with_ops",
                    "alloc_conf",
                    "is_pinned",
                    "bytes_reserved",
                    "seconds",
                    "error",
                )
            }
            for e in probes
        ],
        "skipped": skipped,
    }
    finish(run, pools=run.checks, skipped=skipped, processes=processes, summary=run.summary["pools"])
    return run


def _event_data(
    row: Mapping[str, Any],
    lm: Mapping[str, Any],
    ops: str,
    conf: str | None,
    var: str | None,
    value: str | None,
    facts: Mapping[str, Any],
    lmcache: Mapping[str, Any],
    torch_version: str,
    driver: str | None,
) -> dict[str, Any]:
    n = int(row["bytes_requested"])
    data = {k: v for k, v in row.items() if k not in ("type", "ts")}
    data.setdefault("setting", {SETTING_VAR: gb_setting(n), "LMCACHE_LOCAL_CPU": "True"})
    data.setdefault("allocator", None)
    data.setdefault("method_of_measurement", None)
    data.update(
        {
            "bytes_requested": n,
            "power_of_two_ceiling": next_power_of_two(n),
            "alloc_conf": None if conf is None else f"{var}={value}",
            "alloc_conf_var": var,
            "alloc_conf_value": value,
            "ops_requested": ops,
            "with_ops": lm.get("with_ops"),
            "transfer_path": "gpu",
            "lmcache_version": lm.get("version") or lmcache.get("version"),
            "lmcache_source_sha256": lm.get("source_sha256"),
            "torch_version": facts.get("torch_version") or torch_version,
            "driver_version": driver,
            "gpu": facts.get("gpu"),
            "pid": facts.get("pid"),
        }
    )
    return data
