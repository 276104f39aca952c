"""Stop records of managed processes: exit, signal, health at stop, log digests (no engines)."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from pathlib import Path

from experiments.targets.vllm._process import start
from experiments.targets.vllm._records import log_digest, stopped_data


def test_a_process_that_died_by_sigill_is_recorded_as_such(tmp_path: Path) -> None:
    code = "import sys, time; print('up', flush=True); sys.stderr.write('log line\\n'); time.sleep(60)"
    proc = start([sys.executable, "-c", code], name="victim", log_dir=tmp_path)
    deadline = time.monotonic() + 10
    while b"up" not in proc.stdout_path.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGILL)
    proc.popen.wait(10)
    proc.terminate(grace=2)
    data = stopped_data(proc, None, exited_before_stop=True)
    assert data["exit_code"] == -signal.SIGILL and data["signal"] == "SIGILL"
    assert data["exited_before_stop"] is True and data["killed"] is False and data["health_at_stop"] is None
    for log in data["logs"]:
        raw = Path(log["path"]).read_bytes()
        assert log["bytes"] == len(raw) > 0 and log["sha256"] == hashlib.sha256(raw).hexdigest()


def test_a_process_stopped_by_sigterm(tmp_path: Path) -> None:
    proc = start([sys.executable, "-c", "import time; time.sleep(60)"], name="calm", log_dir=tmp_path)
    proc.terminate(grace=5)
    data = stopped_data(proc, 200, exited_before_stop=False)
    assert data["exit_code"] == -signal.SIGTERM and data["signal"] == "SIGTERM"
    assert data["stop_s"] is not None and data["stop_s"] < 5 and data["health_at_stop"] == 200
    assert data["logs"][0]["bytes"] == 0  # empty logs are digested too
    assert log_digest(tmp_path / "missing.log") == {
        "path": str(tmp_path / "missing.log"),
        "bytes": None,
        "sha256": None,
    }
