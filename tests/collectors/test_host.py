"""Host and provenance facts (CI has no GPU: the GPU paths run in their absent form)."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from collectors import GpuSampler, code_version, gpu_inventory, host_inventory, package_versions
from ledger import canonical_json

HAS_NVML = importlib.util.find_spec("pynvml") is not None


def test_host_inventory_is_canonical_json() -> None:
    inv = host_inventory()
    for key in ("hostname", "os", "kernel", "cpu_model", "cpu_count", "memory_bytes", "python", "gpus"):
        assert key in inv
    assert inv["cpu_count"] >= 1 and inv["memory_bytes"] > 0 and isinstance(inv["gpus"], list)
    canonical_json(inv)
    if not HAS_NVML:
        assert inv["gpus"] == [] == gpu_inventory()


def test_code_version_in_and_out_of_git(tmp_path: Path) -> None:
    here = code_version(Path(__file__))
    assert re.fullmatch(r"[0-9a-f]{40}", here["commit"]) and isinstance(here["dirty"], bool)
    assert code_version(tmp_path) == {"commit": None, "dirty": None, "root": None, "source": None}


def test_code_version_named_in_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLEDGER_CODE_COMMIT", "ab" * 20)
    monkeypatch.setenv("KVLEDGER_CODE_DIRTY", "0")
    # A copy without .git: the environment names the commit.
    found = code_version(tmp_path)
    assert found == {"commit": "ab" * 20, "dirty": False, "root": None, "source": "environment"}
    # A copy whose .git is older than its files: the named commit wins, git's is kept beside it.
    in_git = code_version(Path(__file__))
    git_head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert in_git["commit"] == "ab" * 20 and in_git["source"] == "environment"
    assert in_git["git_commit"] == git_head and isinstance(in_git["git_dirty"], bool)


def test_package_versions() -> None:
    v = package_versions(["httpx", "no-such-package-kvledger"])
    assert v["httpx"] and v["no-such-package-kvledger"] is None


def test_gpu_sampler_without_gpu_is_a_no_op() -> None:
    async def go() -> GpuSampler:
        async with GpuSampler(interval_s=0.01) as gs:
            await asyncio.sleep(0.03)
        return gs

    gs = asyncio.run(go())
    if not gs.available:
        assert gs.summary() == []
    else:
        assert all(s["samples"] >= 1 for s in gs.summary())
