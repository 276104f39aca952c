"""scripts/gpu-probes end to end where the GPU work cannot start.

Without CUDA it exits 2 and writes no records. With a stand-in torch that says
a device is there but cannot use it (every child's setup fails), the script
still finishes: every planned check and pool becomes an errored event, the
files import into a ledger (so every event passes the vocabulary), and the
counts are the full matrix's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from collectors.probes.lmcache_helpers import HelperProbeConfig
from collectors.probes.lmcache_pool import PoolProbeConfig
from ledger import open_ledger

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-probes"

# Claims one visible GPU; has no set_device, so every child fails its CUDA setup.
FAKE_TORCH = """
__version__ = "0.0.0+cu000"
class version:
    cuda = "99.0"
class _Props:
    name = "Stand-in GPU"
    uuid = "00000000-0000-0000-0000-000000000000"
    total_memory = 1 << 30
    major, minor, multi_processor_count = 9, 0, 1
class cuda:
    @staticmethod
    def is_available():
        return True
    @staticmethod
    def device_count():
        return 1
    @staticmethod
    def get_device_properties(index):
        return _Props()
"""


def _run(tmp_path: Path, fake_torch: bool, lmcache: bool) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    if fake_torch:
        (site / "torch").mkdir(parents=True)
        (site / "torch" / "__init__.py").write_text(FAKE_TORCH)
    if lmcache:
        (site / "lmcache").mkdir(parents=True)
        (site / "lmcache" / "__init__.py").write_text("")
        (site / "lmcache" / "_version.py").write_text("__version__ = '0.5.3'\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), PYTHON=sys.executable, POOL_DEADLINE="60")
    return subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=600
    )


def test_exit_2_without_cuda_and_no_records(tmp_path: Path) -> None:
    proc = _run(tmp_path, fake_torch=False, lmcache=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no CUDA device" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu-probes.log"]


def test_exit_2_without_lmcache(tmp_path: Path) -> None:
    proc = _run(tmp_path, fake_torch=True, lmcache=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no LMCache: the lmcache package is not importable" in proc.stdout


def test_failing_children_still_give_every_event(tmp_path: Path) -> None:
    proc = _run(tmp_path, fake_torch=True, lmcache=True)
    out = tmp_path / "out"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    helper = [json.loads(line) for line in (out / "helper_probes.jsonl").read_text().splitlines()]
    checks = [e["data"] for e in helper if e["kind"] == "probe.helper"]
    # one GPU x two ops states x the default matrix, each an errored check naming the setup failure
    assert len(checks) == 2 * len(HelperProbeConfig().cells())
    assert all(not c["passed"] and c["error"].startswith("setup: ") for c in checks)
    assert {c["ops_requested"] for c in checks} == {"present", "masked"}
    pool = [json.loads(line) for line in (out / "pinned_pool.jsonl").read_text().splitlines()]
    pools = [e["data"] for e in pool if e["kind"] == "probe.pinned"]
    skipped = pool[-1]["data"]["skipped"]
    planned = sum(len(s["sizes"]) for s in PoolProbeConfig().settings())
    assert len(pools) + len(skipped) == planned and pools
    assert all(p["error"] and not p["is_pinned"] for p in pools)
    ledger = open_ledger(f"sqlite:///{out / 'probes.db'}")
    kinds = [e.kind for e in ledger.events()]
    assert kinds.count("probe.helper") == len(checks) and kinds.count("probe.pinned") == len(pools)
    assert kinds.count("run.started") == kinds.count("run.finished") == 2
