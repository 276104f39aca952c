"""The ``*.stopped`` records of a managed process: how it ended and which logs it left.

A stop record names the exit (code, signal, whether SIGKILL was needed, how
long the stop took), the health the process answered just before it was
stopped (a replica that died mid-block answers 503 or nothing), and the
SHA-256 and size of each log file, so the ledger pins the exact logs kept
beside it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ._process import Process

__all__ = ["log_digest", "stopped_data"]


def log_digest(path: Path) -> dict[str, Any]:
    """``{"path", "bytes", "sha256"}`` of a log file (``bytes``/``sha256`` null when unreadable)."""
    digest = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except OSError:
        return {"path": str(path), "bytes": None, "sha256": None}
    return {"path": str(path), "bytes": size, "sha256": digest.hexdigest()}


def stopped_data(
    proc: Process, health: int | None, *, exited_before_stop: bool | None = None
) -> dict[str, Any]:
    """What a stopped process leaves in the record; call after ``proc.terminate``.

    ``health`` is the health check's HTTP status just before the stop (None: no
    answer). ``exited_before_stop`` says the process had already died on its own.
    """
    info = proc.exit
    return {
        "pid": proc.pid,
        "exit_code": info.code if info else proc.poll(),
        "signal": info.signal_name if info else None,
        "killed": info.killed if info else None,
        "stop_s": round(info.stop_seconds, 3) if info else None,
        "health_at_stop": health,
        "exited_before_stop": exited_before_stop,
        "logs": [log_digest(proc.stdout_path), log_digest(proc.stderr_path)],
    }
