"""Helpers for the experiments tests: small shapes, event queries (the CLI runner is tests._cli)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.replay import Comparison, replay
from experiments.targets.sim import count_tokens, render_chat
from ledger import Event, open_ledger

REPO = Path(__file__).resolve().parents[2]

# A screening shape that exercises every workload in a few seconds (two block pairs: the
# smallest balanced design, OFF–ON–ON–OFF).
SMALL = {
    "block_pairs": 2,
    "sizes": [1000, 2000],
    "chains": 2,
    "session_sizes": [1500],
    "sessions": 1,
    "session_turns": 3,
    "turn_growth": 300,
    "generation_sizes": [1000],
    "generation_outputs": [16, 32],
    "window_sessions": [2, 3],
    "window_turns": 2,
    "window_size": 1000,
    "warmups": 2,
    "warmup_tokens": 300,
}


def events(url: str, kind: str | None = None, run_id: str | None = None) -> list[Event]:
    led = open_ledger(url)
    try:
        return list(led.events(kind=kind, run_id=run_id))
    finally:
        led.close()


def run_ids(url: str) -> list[str]:
    return [e.run_id for e in events(url, "run.started") if e.run_id]


@pytest.fixture
def ledger_subprocess() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started by a test, killed (by pid) if still alive afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


LEDGER = [sys.executable, "-c", "from ledger._cli import main; main()"]


async def local_tokens(messages: list[dict[str, str]]) -> int:
    """Prompt tokens of chat messages as the sim target counts them (a FixtureFactory's tokenize)."""
    return count_tokens(render_chat(messages, add_generation_prompt=True, enable_thinking=False))


def replayed_with(url: str, run_id: str, **target_options: object) -> Comparison:
    """``run_id`` replayed with other target options (the sim's device, its card's limit), every
    payload and the plan matching the original's."""
    led = open_ledger(url)
    try:
        comparison = replay(led, run_id, target_options=target_options)
    finally:
        led.close()
    assert comparison.all_matched and comparison.plan_matched
    return comparison
