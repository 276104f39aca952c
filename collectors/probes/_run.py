"""The result of one probe invocation."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProbeRun:
    """What one probe invocation produced: bare envelopes plus timing and outcome."""

    run_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    status: str = "completed"
    error: str | None = None
    seconds: float = 0.0
    checks: int = 0
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "completed" else 1

    def probe_events(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"].startswith("probe.")]


def run_child(cmd: list[str], env: dict[str, str], cwd: str, timeout_s: float) -> tuple[int, str]:
    """Run one probe child; ``(exit code, stderr)``, -9 when it ran past ``timeout_s`` (killed)."""
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout_s,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raw = exc.stderr or ""
        return -9, raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return proc.returncode, proc.stderr
