"""Fixtures of the ledger suite: snapshots stay under the test's tmp dir."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _snapshot_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Parquet snapshots go under the test's tmp dir, never the user's cache.
    monkeypatch.setenv("KVLEDGER_CACHE", str(tmp_path / "cache"))
