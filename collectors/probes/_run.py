"""The result of one probe invocation."""

from __future__ import annotations

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
