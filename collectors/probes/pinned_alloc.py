"""Pinned-allocation probe (the seed's Section 3.3).

Does a pinned host allocation just over a power of two get rounded up by
PyTorch's caching host allocator, and does
``PYTORCH_CUDA_ALLOC_CONF=pinned_max_round_threshold_mb:128`` stop it? The
same value is also tried under ``PYTORCH_ALLOC_CONF`` (newer PyTorch reads
the pinned-allocator keys there). A configuration that PyTorch refuses is an
observation too: the event then has ``is_pinned`` false and ``error`` set.

Each (size, allocator config) runs in a fresh child process, so neither a
cached block nor an earlier configuration can leak in. The child allocates
``torch.empty(n, dtype=torch.uint8, pin_memory=True)`` and records
``is_pinned()``, the seconds it took and what was actually reserved, measured
several ways: the host allocator's statistics (``torch.cuda.host_memory_stats``
where that torch has it), the size of the mapping that holds the pointer
(``/proc/self/maps``), the drop in ``MemFree`` and the growth of RSS and
locked/pinned memory (``/proc/self/status``). torch is imported lazily.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from collectors.probes._cuda import driver_version, gpu_identity, require_cuda
from collectors.probes._envelope import REPO_ROOT, envelope, meminfo, new_id, utc_now
from collectors.probes._run import ProbeRun, child_env, finish, started_event

EXPERIMENT = "probe.pinned-alloc"
KIND = "probe.pinned_alloc"

GIB = 1 << 30
SIZES: tuple[int, ...] = (GIB + 4096, 4 * GIB + 4096, 16 * GIB + 4096)
ROUND_LIMIT_CONF = "pinned_max_round_threshold_mb:128"
# None: no allocator configuration; else "VARIABLE=value" (a bare value means
# PYTORCH_CUDA_ALLOC_CONF).
ALLOC_CONFS: tuple[str | None, ...] = (
    None,
    f"PYTORCH_CUDA_ALLOC_CONF={ROUND_LIMIT_CONF}",
    f"PYTORCH_ALLOC_CONF={ROUND_LIMIT_CONF}",
)
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
SLACK = 2 * 1024 * 1024  # alignment slack: more than this above the request counts as rounding


def split_alloc_conf(conf: str | None) -> tuple[str | None, str | None]:
    """``"VAR=value"`` to ``(VAR, value)``; a bare value goes to PYTORCH_CUDA_ALLOC_CONF."""
    if conf is None:
        return None, None
    var, sep, value = conf.partition("=")
    if sep and var in ALLOC_CONF_VARS:
        return var, value
    return "PYTORCH_CUDA_ALLOC_CONF", conf


def normalize_alloc_conf(conf: str | None) -> str | None:
    var, value = split_alloc_conf(conf)
    return None if var is None else f"{var}={value}"


def next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


@dataclass(frozen=True)
class PinnedAllocConfig:
    sizes: tuple[int, ...] = SIZES
    alloc_confs: tuple[str | None, ...] = ALLOC_CONFS
    device: int = 0
    host_memory_bytes: int | None = None  # guard's idea of host memory; default MemTotal
    guard: bool = True
    timeout_s: float = 300.0

    def params(self) -> dict[str, Any]:
        p = asdict(self)
        p["sizes"] = list(self.sizes)
        p["alloc_confs"] = [normalize_alloc_conf(c) for c in self.alloc_confs]
        return p


def _proc_status() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmLck", "VmPin", "VmRSS", "RssAnon", "RssFile", "RssShmem", "VmSize"):
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _mapping_containing(addr: int) -> dict[str, Any] | None:
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(maxsplit=5)
        lo, _, hi = parts[0].partition("-")
        start, end = int(lo, 16), int(hi, 16)
        if start <= addr < end:
            return {
                "start": start,
                "bytes": end - start,
                "offset_of_pointer": addr - start,
                "perms": parts[1],
                "path": parts[5].strip() if len(parts) == 6 else "",
            }
    return None


def _host_stats(torch: Any) -> dict[str, int] | None:
    fn = getattr(torch.cuda, "host_memory_stats", None) or getattr(
        torch.cuda.memory, "host_memory_stats", None
    )
    if fn is None:
        return None
    try:
        stats = fn()
    except Exception:
        return None
    return {str(k): int(v) for k, v in stats.items() if isinstance(v, int | float)}


def _stats_delta(before: Mapping[str, int] | None, after: Mapping[str, int] | None) -> dict[str, int] | None:
    """The ``.current`` host-allocator statistics that changed, or None without both readings."""
    if before is None or after is None:
        return None
    return {
        k: after[k] - before.get(k, 0)
        for k in after
        if k.endswith(".current") and after[k] != before.get(k, 0)
    }


def _delta(after: Mapping[str, int], before: Mapping[str, int], key: str) -> int | None:
    if key in after and key in before:
        return after[key] - before[key]
    return None


def measure_pinned_alloc(nbytes: int, device: int = 0) -> dict[str, Any]:
    """Allocate ``nbytes`` of pinned host memory in THIS process and measure it.

    Run it in a fresh process with the allocator configuration already in the
    environment (``run_pinned_alloc`` does). Returns the ``probe.pinned_alloc``
    data (without ``alloc_conf``, which the parent knows).
    """
    torch = require_cuda()
    conf_env = {k: os.environ[k] for k in ALLOC_CONF_VARS if k in os.environ}
    t_init = time.perf_counter()
    try:
        torch.cuda.set_device(device)
        torch.zeros(1, device=torch.device("cuda", device))  # context first
    except Exception as exc:  # e.g. the allocator configuration is refused at CUDA init
        return {
            "bytes_requested": nbytes,
            "is_pinned": False,
            "seconds": round(time.perf_counter() - t_init, 6),
            "bytes_reserved": None,
            "rounded_up": None,
            "power_of_two_ceiling": next_power_of_two(nbytes),
            "method_of_measurement": None,
            "measurements": None,
            "alloc_conf_env": conf_env,
            "error": f"{type(exc).__name__}: {exc}",
            "failed_at": "cuda-init",
            "pid": os.getpid(),
            "torch_version": torch.__version__,
            "gpu": None,
        }

    status_before, mem_before, stats_before = _proc_status(), meminfo(), _host_stats(torch)
    error: str | None = None
    t0 = time.perf_counter()
    try:
        x = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    except Exception as exc:  # an allocation failure is a result, not a crash
        x, error = None, f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - t0
    status_after, mem_after, stats_after = _proc_status(), meminfo(), _host_stats(torch)
    is_pinned = bool(x.is_pinned()) if x is not None else False
    mapping = _mapping_containing(int(x.data_ptr())) if x is not None else None

    stats_delta = _stats_delta(stats_before, stats_after)
    measurements: dict[str, Any] = {
        "host_memory_stats_delta": stats_delta,
        "host_memory_stats_after": stats_after,
        "mapping": mapping,
        "memfree_drop_bytes": (-d if (d := _delta(mem_after, mem_before, "MemFree")) is not None else None),
        "memavailable_drop_bytes": (
            -d if (d := _delta(mem_after, mem_before, "MemAvailable")) is not None else None
        ),
        "mem_total_bytes": mem_after.get("MemTotal"),
        "vm_lck_delta_bytes": _delta(status_after, status_before, "VmLck"),
        "vm_pin_delta_bytes": _delta(status_after, status_before, "VmPin"),
        "rss_delta_bytes": _delta(status_after, status_before, "VmRSS"),
        "rss_shmem_delta_bytes": _delta(status_after, status_before, "RssShmem"),
        "vm_size_delta_bytes": _delta(status_after, status_before, "VmSize"),
        "status_after": status_after,
    }

    reserved: int | None = None
    method: str | None = None
    if stats_delta:
        for key in ("reserved_bytes.current", "allocated_bytes.current"):
            if stats_delta.get(key, 0) > 0:
                reserved = stats_delta[key]
                method = f"torch.cuda.host_memory_stats()['{key}'] delta"
                break
    if reserved is None and mapping is not None:
        reserved, method = int(mapping["bytes"]), "/proc/self/maps: mapping holding the pointer"
    if reserved is None and measurements["memfree_drop_bytes"] is not None and x is not None:
        reserved, method = int(measurements["memfree_drop_bytes"]), "/proc/meminfo MemFree drop"

    return {
        "bytes_requested": nbytes,
        "is_pinned": is_pinned,
        "seconds": round(seconds, 6),
        "bytes_reserved": reserved,
        "rounded_up": (reserved > align_up(nbytes, SLACK)) if reserved is not None else None,
        "power_of_two_ceiling": next_power_of_two(nbytes),
        "method_of_measurement": method,
        "measurements": measurements,
        "alloc_conf_env": conf_env,
        "error": error,
        "failed_at": None if error is None else "allocation",
        "pid": os.getpid(),
        "torch_version": torch.__version__,
        "gpu": gpu_identity(device),
    }


def _child_env(alloc_conf: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ALLOC_CONF_VARS}
    var, value = split_alloc_conf(alloc_conf)
    if var is not None and value is not None:
        env[var] = value
    return child_env(env)


def run_pinned_alloc(
    config: PinnedAllocConfig | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> ProbeRun:
    """One fresh child process per (size, alloc_conf); returns the run's bare envelopes.

    Raises NoCudaError before anything runs without CUDA. Sizes whose
    power-of-two ceiling would not fit in 90 % of host memory are skipped (and
    listed in ``run.finished``) unless ``config.guard`` is False.
    """
    config = config or PinnedAllocConfig()
    say = progress or (lambda _msg: None)
    torch = require_cuda()
    run_id = new_id()
    run = ProbeRun(run_id=run_id)
    host_bytes = config.host_memory_bytes or meminfo().get("MemTotal") or 0
    run.events.append(
        started_event(
            run_id,
            experiment=EXPERIMENT,
            script_file=__file__,
            script="collectors/probes/pinned_alloc.py",
            params={**config.params(), "host_memory_bytes_used_by_guard": host_bytes},
            packages={"torch.version.cuda": torch.version.cuda},
            driver=driver_version(),
        )
    )
    skipped: list[dict[str, Any]] = []
    errors: list[str] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvledger-pinned-") as tmp:
        for nbytes in config.sizes:
            if config.guard and next_power_of_two(nbytes) > 0.9 * host_bytes:
                skipped.append({"bytes_requested": nbytes, "reason": "may not fit host memory"})
                say(f"pinned-alloc: skip {nbytes} bytes (host memory {host_bytes})")
                continue
            for conf in config.alloc_confs:
                out = Path(tmp) / f"{nbytes}-{conf is not None}.json"
                cmd = [
                    sys.executable,
                    "-m",
                    "collectors.probes",
                    "_pinned-worker",
                    "--bytes",
                    str(nbytes),
                    "--device",
                    str(config.device),
                    "--out",
                    str(out),
                ]
                ts = utc_now()
                try:
                    proc = subprocess.run(
                        cmd, env=_child_env(conf), cwd=str(REPO_ROOT), timeout=config.timeout_s
                    )
                    code = proc.returncode
                except subprocess.TimeoutExpired:
                    code = -1
                if code != 0 or not out.exists():
                    errors.append(f"bytes={nbytes} alloc_conf={conf!r}: worker exited {code}")
                    continue
                data = json.loads(out.read_text())
                var, value = split_alloc_conf(conf)
                data["alloc_conf"] = normalize_alloc_conf(conf)
                data["alloc_conf_var"] = var
                data["alloc_conf_value"] = value
                run.events.append(envelope(KIND, data, run_id, ts=ts))
                say(
                    f"pinned-alloc: {nbytes} B alloc_conf={data['alloc_conf']}: "
                    f"pinned={data['is_pinned']} reserved={data['bytes_reserved']} "
                    f"rounded_up={data['rounded_up']} in {data['seconds']:.3f} s"
                    + ("" if data["error"] is None else f"; error: {data['error']}")
                )
    run.seconds = time.perf_counter() - t0
    run.checks = len(run.probe_events())
    if errors:
        run.status, run.error = "failed", "; ".join(errors)
    run.summary = {
        "allocations": [
            {
                k: e["data"][k]
                for k in (
                    "bytes_requested",
                    "alloc_conf",
                    "is_pinned",
                    "bytes_reserved",
                    "rounded_up",
                    "seconds",
                    "error",
                )
            }
            for e in run.probe_events()
        ],
        "skipped": skipped,
    }
    finish(run, allocations=run.checks, skipped=skipped, summary=run.summary["allocations"])
    return run


def worker_main(nbytes: int, device: int, out: str) -> int:
    data = measure_pinned_alloc(nbytes, device)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, out)
    return 0
