"""Reading back what a ``ledger run`` recorded (engine tests; the CLI runner is tests._cli)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger import Event, open_ledger, query


@dataclass
class RecordedRun:
    """One ``ledger run`` and every event its ledger holds afterwards."""

    url: str
    exit_code: int
    output: str
    run_id: str
    events: list[Event]

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    def sql(self, statement: str) -> list[dict[str, Any]]:
        led = open_ledger(self.url)
        try:
            rows: list[dict[str, Any]] = query(led, statement).to_pylist()
            return rows
        finally:
            led.close()


def recorded(url: str, result: Any) -> RecordedRun:
    """Read back the ledger at ``url`` after ``result`` (its single run)."""
    led = open_ledger(url)
    try:
        events = list(led.events())
    finally:
        led.close()
    (started,) = [e for e in events if e.kind == "run.started"]
    assert started.run_id is not None
    return RecordedRun(url, result.exit_code, result.output, started.run_id, events)
