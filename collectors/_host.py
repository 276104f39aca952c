"""Host and provenance facts for ``run.started``, and GPU utilisation sampling.

GPU facts come from NVML through ``nvidia-ml-py`` (``import pynvml``) when
it is importable and a GPU is present; otherwise the GPU list is empty and
:class:`GpuSampler` does nothing. CI has no GPU, so there the GPU paths are
exercised only in their "absent" form.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "GpuSampler",
    "code_version",
    "gpu_inventory",
    "gpu_processes",
    "host_inventory",
    "package_versions",
    "session_id",
]


def _nvml() -> ModuleType | None:
    """An initialised pynvml module, or None (not installed, no driver, no GPU)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_inventory() -> list[dict[str, Any]]:
    """Index, name, UUID, driver and memory of each GPU NVML sees; [] without NVML."""
    nv = _nvml()
    if nv is None:
        return []
    try:
        driver = _text(nv.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            gpus.append(
                {
                    "index": i,
                    "name": _text(nv.nvmlDeviceGetName(h)),
                    "uuid": _text(nv.nvmlDeviceGetUUID(h)),
                    "driver": driver,
                    "memory_bytes": int(mem.total),
                }
            )
        return gpus
    except Exception:
        return []
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


def gpu_processes() -> dict[int, list[dict[str, Any]]]:
    """PID → the GPUs (index, name, UUID) on which NVML sees it computing; {} without NVML.

    PIDs are as NVML reports them (the host's PID namespace in some containers,
    so a caller must accept finding nothing).
    """
    nv = _nvml()
    if nv is None:
        return {}
    found: dict[int, list[dict[str, Any]]] = {}
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            gpu = {"index": i, "name": _text(nv.nvmlDeviceGetName(h)), "uuid": _text(nv.nvmlDeviceGetUUID(h))}
            for proc in nv.nvmlDeviceGetComputeRunningProcesses(h):
                found.setdefault(int(proc.pid), []).append(gpu)
        return found
    except Exception:
        return found
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


def session_id(pid: int) -> int | None:
    """The session (``setsid``) a process belongs to, from /proc; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may hold spaces and parentheses: fields after the last ')' are fixed.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[3]) if len(fields) > 3 else None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def host_inventory() -> dict[str, Any]:
    """Hostname, OS, kernel, CPU, memory, Python and GPUs of this host."""
    return {
        "hostname": socket.gethostname(),
        "os": platform.system(),
        "os_release": _os_release(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "gpus": gpu_inventory(),
    }


def _os_release() -> str | None:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME")
    except OSError:
        return None


def _git(path: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(path), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_version(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Git commit and dirty flag of the repository containing ``path``.

    ``KVLEDGER_CODE_COMMIT`` (and ``KVLEDGER_CODE_DIRTY``), when set, name the commit
    instead: a host that was given a copy of the tree may have no ``.git``, or an
    older one than its files (seen on a GPU host whose copy kept the ``.git`` of an
    earlier commit). What git says then is kept beside it as ``git_commit`` and
    ``git_dirty``, so a disagreement stays visible. ``source`` says which was read;
    nulls when neither is there.
    """
    p = Path(path).resolve()
    where = p if p.is_dir() else p.parent
    root = _git(where, "rev-parse", "--show-toplevel")
    commit = _git(where, "rev-parse", "HEAD") if root else None
    dirty: bool | None = None
    if root is not None and commit is not None:
        status = _git(where, "status", "--porcelain", "--untracked-files=no")
        dirty = None if status is None else bool(status)
    named = os.environ.get("KVLEDGER_CODE_COMMIT") or None
    if named is None:
        if commit is None:
            return {"commit": None, "dirty": None, "root": None, "source": None}
        return {"commit": commit, "dirty": dirty, "root": root, "source": "git"}
    env_dirty = os.environ.get("KVLEDGER_CODE_DIRTY")
    found: dict[str, Any] = {
        "commit": named,
        "dirty": None if env_dirty is None else env_dirty.lower() in ("1", "true", "yes"),
        "root": root,
        "source": "environment",
    }
    if commit is not None:
        found.update(git_commit=commit, git_dirty=dirty)
    return found


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed distribution versions (None when not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


class GpuSampler:
    """Samples GPU utilisation (percent) and used memory during a window via NVML.

    Without NVML or a GPU (CI, laptops, the sim) it is a no-op: ``available``
    is False and :meth:`summary` returns an empty list. Use as an async
    context manager around the window::

        async with GpuSampler(interval_s=0.1) as gs:
            ...
        gs.summary()  # [{"index", "samples", "util_mean", "util_max", "mem_used_max"}]
    """

    def __init__(self, interval_s: float = 0.1, indices: Iterable[int] | None = None) -> None:
        self.interval_s = interval_s
        self._indices = list(indices) if indices is not None else None
        self._nv: ModuleType | None = None
        self._handles: list[tuple[int, Any]] = []
        self._task: asyncio.Task[None] | None = None
        self.samples: dict[int, list[tuple[float, int, int]]] = {}

    @property
    def available(self) -> bool:
        return bool(self._handles)

    async def __aenter__(self) -> GpuSampler:
        self._nv = _nvml()
        if self._nv is not None:
            try:
                count = self._nv.nvmlDeviceGetCount()
                wanted = range(count) if self._indices is None else self._indices
                self._handles = [(i, self._nv.nvmlDeviceGetHandleByIndex(i)) for i in wanted]
            except Exception:
                self._handles = []
        if self._handles:
            self.samples = {i: [] for i, _ in self._handles}
            self._task = asyncio.create_task(self._run())
        return self

    def sample_once(self) -> None:
        nv = self._nv
        if nv is None:
            return
        now = time.monotonic()
        for i, h in self._handles:
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
            except Exception:
                continue
            self.samples[i].append((now, int(util.gpu), int(mem.used)))

    async def _run(self) -> None:
        while True:
            self.sample_once()
            await asyncio.sleep(self.interval_s)

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self.sample_once()
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()
            self._nv = None

    def summary(self) -> list[dict[str, Any]]:
        out = []
        for i, rows in self.samples.items():
            utils = [u for _, u, _ in rows]
            out.append(
                {
                    "index": i,
                    "samples": len(rows),
                    "util_mean": sum(utils) / len(utils) if utils else None,
                    "util_max": max(utils) if utils else None,
                    "mem_used_max": max((m for _, _, m in rows), default=None),
                }
            )
        return out
