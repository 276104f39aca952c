"""Bare ledger envelopes, UUIDv7 ids, timestamps and run provenance for the probes.

Kept local (no import of ``ledger``) so the probes run on a bare GPU machine
with nothing but the standard library and torch.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_last_ms = 0
_counter = 0

REPO_ROOT = Path(__file__).resolve().parents[2]


def new_id() -> str:
    """A UUIDv7 string (48-bit Unix milliseconds, 12-bit counter, random bits).

    Ids made by one process increase in creation order.
    """
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            _counter += 1
            if _counter > 0xFFF:
                ms += 1
                _counter = 0
        else:
            _counter = int.from_bytes(os.urandom(2), "big") & 0x7FF
        _last_ms = ms
        counter = _counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand
    return str(uuid.UUID(int=value))


def utc_now() -> str:
    """Current UTC time, RFC 3339 with microseconds and ``Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def envelope(
    kind: str,
    data: Mapping[str, Any],
    run_id: str | None,
    *,
    block_id: str | None = None,
    ts: str | None = None,
) -> dict[str, Any]:
    """A bare ledger envelope (``id``, ``ts``, ``kind``, ``run_id``, ``block_id``, ``data``)."""
    return {
        "id": new_id(),
        "ts": ts or utc_now(),
        "kind": kind,
        "run_id": run_id,
        "block_id": block_id,
        "data": dict(data),
    }


def dumps(event: Mapping[str, Any]) -> str:
    """One JSON Lines line (keys sorted, compact, no NaN)."""
    return json.dumps(event, sort_keys=True, separators=(",", ":"), allow_nan=False)


def write_jsonl(events: Iterable[Mapping[str, Any]], path: str | os.PathLike[str]) -> int:
    """Write envelopes to ``path``, one per line; returns how many."""
    count = 0
    with open(path, "w", encoding="utf-8") as fh:
        for event in events:
            fh.write(dumps(event) + "\n")
            count += 1
    return count


def file_sha256(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def code_version() -> dict[str, Any]:
    """``{commit, dirty, source}`` of the checkout the probes run from (git, else the environment)."""
    from collectors._host import code_version as checkout_version

    found = checkout_version(REPO_ROOT)
    return {"commit": found["commit"], "dirty": found["dirty"], "source": found["source"]}


_PACKAGE_NAMES = (
    "torch",
    "numpy",
    "triton",
    "nvidia-cuda-runtime",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-runtime-cu13",
    "nvidia-ml-py",
    "kvledger",
)


def package_versions(extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """Installed versions of the packages the probes depend on (name to version)."""
    versions: dict[str, str] = {"python": platform.python_version()}
    for name in _PACKAGE_NAMES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    for key, value in (extra or {}).items():
        if value is not None:
            versions[key] = value
    return versions


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (empty where there is none)."""
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                factor = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
                out[key] = int(parts[0]) * factor
    except OSError:
        pass
    return out


def host_info(gpus: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    mem = meminfo()
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": mem.get("MemTotal"),
        "gpus": gpus or [],
    }
    info.update(extra)
    return info
