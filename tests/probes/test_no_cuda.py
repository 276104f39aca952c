"""The probes without CUDA: the package imports without torch, the commands exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_TORCH_NO_CUDA_BUILD = """
__version__ = "0.0.0+cpu"
class version:
    cuda = None
"""

FAKE_TORCH_NO_DEVICE = """
__version__ = "0.0.0+cu000"
class version:
    cuda = "99.0"
class cuda:
    @staticmethod
    def is_available():
        return False
"""


def _run(args: list[str], fake_torch: str | None, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    paths = [str(ROOT)]
    if fake_torch is not None:
        fake = tmp_path / "fake"
        (fake / "torch").mkdir(parents=True)
        (fake / "torch" / "__init__.py").write_text(fake_torch)
        paths.insert(0, str(fake))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run(
        [sys.executable, "-m", "collectors.probes", *args],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _real_cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


PROBE_COMMANDS = ["copy-ordering", "pinned-alloc", "helper-probes", "pinned-pool"]

FAKE_TORCH_WITH_DEVICE = """
__version__ = "0.0.0+cu000"
class version:
    cuda = "99.0"
class cuda:
    @staticmethod
    def is_available():
        return True
    @staticmethod
    def device_count():
        return 1
"""


@pytest.mark.parametrize("command", PROBE_COMMANDS)
@pytest.mark.parametrize(
    ("fake", "reason"),
    [
        (FAKE_TORCH_NO_CUDA_BUILD, "built without CUDA"),
        (FAKE_TORCH_NO_DEVICE, "is_available() is False"),
    ],
    ids=["cpu-only-build", "no-visible-device"],
)
def test_exit_2_without_cuda(command: str, fake: str, reason: str, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    proc = _run([command, "--jsonl", str(out)], fake, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA device: " in proc.stderr
    assert reason in proc.stderr
    assert not out.exists()


@pytest.mark.skipif(_real_cuda_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("command", PROBE_COMMANDS)
def test_exit_2_on_this_machine(command: str, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    proc = _run([command, "--jsonl", str(out)], None, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("no CUDA device: ")
    assert not out.exists()


@pytest.mark.parametrize("command", ["helper-probes", "pinned-pool"])
def test_exit_2_without_lmcache(command: str, tmp_path: Path) -> None:
    # A CUDA device is "there" (a stand-in torch says so); LMCache is not on the path.
    out = tmp_path / "out.jsonl"
    proc = _run([command, "--jsonl", str(out)], FAKE_TORCH_WITH_DEVICE, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("no LMCache: the lmcache package is not importable"), proc.stderr
    assert not out.exists()


def test_missing_torch_is_reported(tmp_path: Path) -> None:
    # A torch package that fails to import stands in for "not installed".
    proc = _run(
        ["copy-ordering", "--jsonl", str(tmp_path / "o.jsonl")],
        "raise ImportError('no torch here')",
        tmp_path,
    )
    assert proc.returncode == 2
    assert "no CUDA device: torch is not installed" in proc.stderr


def test_package_imports_without_torch(tmp_path: Path) -> None:
    code = (
        "import sys, collectors.probes as p, collectors.probes.__main__; "
        "assert 'torch' not in sys.modules, 'torch imported eagerly'; "
        "print(sorted(p.__all__))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "run_copy_ordering" in proc.stdout


def test_bad_method_is_usage_error(tmp_path: Path) -> None:
    from collectors.probes import CopyOrderingConfig

    with pytest.raises(ValueError):
        CopyOrderingConfig(methods=("teleport",))
    assert CopyOrderingConfig().checks_per_process == 480


def test_envelope_shape() -> None:
    import re
    import uuid

    from collectors.probes._envelope import envelope, new_id

    ids = [new_id() for _ in range(200)]
    assert ids == sorted(ids)
    assert all(uuid.UUID(i).version == 7 for i in ids)
    ev = envelope("probe.copy", {"a": 1}, ids[0])
    assert set(ev) == {"id", "ts", "kind", "run_id", "block_id", "data"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", ev["ts"])
