"""Fixtures for the sim target: real deployments on loopback, tiny time scale."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from experiments.targets.sim import SimDeployment
from tests.sim.helpers import TIME_SCALE


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=20) as client:
        yield client


@pytest.fixture
def dep() -> Iterator[SimDeployment]:
    """Two replicas, shared tier ON, no fault."""
    with SimDeployment(2, shared=True, time_scale=TIME_SCALE) as d:
        yield d
