"""Ctrl-C and kill -9: the run is visibly incomplete, the ledger intact, a later run fine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ledger import open_ledger, verify

from .._cli import ledger_cli, param_args
from .conftest import LEDGER, REPO, SMALL, events, run_ids

# Slow enough (real-time sim delays at 32k) to be caught mid-block.
SLOW = {**SMALL, "workloads": ["micro"], "sizes": [32000, 64000], "time_scale": 1.0}


def _start(url: str) -> subprocess.Popen[bytes]:
    cmd = [*LEDGER, "run", "screening", "--db", url, "--no-progress", *param_args(SLOW)]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _wait_for_requests(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else b""
        if Path(url.removeprefix("sqlite:///")).exists():
            with contextlib.suppress(Exception):
                if events(url, "request.sent"):
                    return
        time.sleep(0.2)
    pytest.fail("the run sent nothing in time")


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return True  # a zombie awaiting its (dead) parent's reaper
        time.sleep(0.1)
    return False


def _later_run_is_fine(url: str) -> None:
    shape = {**SMALL, "workloads": ["micro"], "sizes": [1000]}
    result = ledger_cli("run", "screening", "--db", url, "--no-progress", *param_args(shape))
    assert result.exit_code == 0, result.output
    led = open_ledger(url)
    try:
        assert verify(led).ok
    finally:
        led.close()


def test_ctrl_c_leaves_an_aborted_run(sqlite_url: str, ledger_subprocess: list) -> None:
    proc = _start(sqlite_url)
    ledger_subprocess.append(proc)
    _wait_for_requests(sqlite_url, proc)
    sims = _children(proc.pid)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 1
    (rid,) = run_ids(sqlite_url)
    finished = events(sqlite_url, "run.finished", rid)
    assert len(finished) == 1 and finished[0].data["status"] == "aborted"
    blocks = events(sqlite_url, "block.finished", rid)
    assert blocks and blocks[-1].data["status"] == "aborted"
    assert all(_gone(pid) for pid in sims)  # the sim was stopped too
    _later_run_is_fine(sqlite_url)


def test_kill_9_leaves_an_incomplete_run_and_an_intact_ledger(
    sqlite_url: str, ledger_subprocess: list
) -> None:
    proc = _start(sqlite_url)
    ledger_subprocess.append(proc)
    _wait_for_requests(sqlite_url, proc)
    sims = _children(proc.pid)
    proc.kill()
    proc.wait(timeout=30)
    for pid in sims:  # the sim follows its runner (PR_SET_PDEATHSIG); make sure of it
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the sim outlived its killed runner")
    (rid,) = run_ids(sqlite_url)
    assert events(sqlite_url, "run.finished", rid) == []
    _later_run_is_fine(sqlite_url)
