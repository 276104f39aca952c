"""Fixtures: a real SQLite ledger, a sink bound to a run, sim deployments on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.targets.sim import SimDeployment
from ledger import Ledger, open_ledger
from tests.collectors.helpers import TIME_SCALE, VIAS, LedgerSink


@pytest.fixture
def led(tmp_path: Path) -> Iterator[Ledger]:
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    yield ledger
    ledger.close()


@pytest.fixture
def sink(led: Ledger) -> LedgerSink:
    return LedgerSink(led)


@pytest.fixture
def dep() -> Iterator[SimDeployment]:
    """Two replicas, shared tier ON, no fault."""
    with SimDeployment(2, shared=True, time_scale=TIME_SCALE) as d:
        yield d


@pytest.fixture(params=VIAS)
def via(request: pytest.FixtureRequest) -> str:
    """Run a client test over both transports."""
    return str(request.param)
