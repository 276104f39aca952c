"""Fixtures for the real-engine tests (``-m engines``).

Building the environments takes a few minutes the first time and is cached under
``${KVLEDGER_CACHE:-~/.cache/kvledger}``; a failure to build fails the tests (no skip).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.targets.vllm.engines import Engines, ensure

from ._stack import Replica, replica


@pytest.fixture(scope="session")
def engines() -> Engines:
    return ensure(out=sys.stderr)


@pytest.fixture(scope="session")
def engine_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-logs")


@pytest.fixture(scope="module")
def plain_replica(engines: Engines, engine_logs: Path) -> Iterator[Replica]:
    """One replica without a KV connector."""
    with replica(engines, engine_logs, "plain") as r:
        yield r
