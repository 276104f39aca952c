"""Fixtures for the real-engine tests (``-m engines``).

Building the environments takes a few minutes the first time and is cached under
``${KVLEDGER_CACHE:-~/.cache/kvledger}``; a failure to build fails the tests (no skip).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.targets.vllm._process import Process, start
from experiments.targets.vllm.engines import Engines, ensure

from ._stack import Replica, engine_env, free_port, vllm_argv

PLAIN_STARTUP_S = 240


@pytest.fixture(scope="session")
def engines() -> Engines:
    return ensure(out=sys.stderr)


@pytest.fixture(scope="session")
def engine_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-logs")


@pytest.fixture(scope="session")
def _plain_process(engines: Engines, engine_logs: Path) -> Iterator[tuple[Process, str]]:
    """The plain replica's process, started and not yet waited for; stopped at the latest here."""
    port = free_port()
    proc = start(vllm_argv(engines, port), name="plain", log_dir=engine_logs, extra_env=engine_env(engines))
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        proc.terminate(grace=15)


@pytest.fixture(scope="session", autouse=True)
def _start_the_plain_replica_early(request: pytest.FixtureRequest) -> None:
    """A lone replica starts as three interpreters in a row, on one core: started with the first
    test of this folder, it comes up beside the single-core tests before test_replica.py (the toy
    environment builds, the tiny model build) instead of alone. Only when a selected test uses it."""
    if any("plain_replica" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("_plain_process")


@pytest.fixture(scope="module")
def plain_replica(_plain_process: tuple[Process, str]) -> Iterator[Replica]:
    """One replica without a KV connector (stopped when its module is done)."""
    proc, url = _plain_process
    try:
        proc.wait_http(f"{url}/health", PLAIN_STARTUP_S)
        yield Replica(url, proc)
    finally:
        proc.terminate(grace=15)
