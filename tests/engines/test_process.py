"""The generic launcher: health wait, deadline, SIGTERM then SIGKILL of the group."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from experiments.targets.vllm._process import StartupError, http_get, running, start

from ._stack import free_port


def test_start_health_terminate(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with running(
        argv,
        name="web",
        log_dir=tmp_path,
        health_url=f"http://127.0.0.1:{port}/",
        startup_timeout=30,
        cwd=tmp_path,
    ) as p:
        assert p.alive()
        assert p.ready_seconds is not None and p.ready_seconds < 30
        status, _ = http_get(f"http://127.0.0.1:{port}/")
        assert status == 200
    assert p.exit is not None
    assert not p.exit.killed
    assert not p.group_alive()
    assert p.stderr_path.exists()


def test_sigterm_ignored_then_sigkill_whole_group(tmp_path: Path) -> None:
    # A leader and a child, both ignoring SIGTERM (as a hung vLLM start-up does).
    script = textwrap.dedent(
        """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        print(child.pid, flush=True)
        time.sleep(600)
        """
    )
    p = start([sys.executable, "-c", script], name="stubborn", log_dir=tmp_path)
    deadline = time.monotonic() + 10
    while not p.stdout_path.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    child_pid = int(p.stdout_path.read_text().split()[0])
    info = p.terminate(grace=1.0)
    assert info.killed
    assert info.code == -signal.SIGKILL and info.signal_name == "SIGKILL"
    assert not p.group_alive()
    with pytest.raises(ProcessLookupError):
        os.kill(child_pid, 0)


def test_health_deadline(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    with (
        pytest.raises(StartupError, match="not healthy after"),
        running(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            name="silent",
            log_dir=tmp_path,
            health_url=f"http://127.0.0.1:{port}/health",
            startup_timeout=1.5,
            grace=2,
        ),
    ):
        pass


def test_exit_before_healthy_is_reported_with_logs(tmp_path: Path) -> None:
    port = free_port()
    code = "import sys; print('boom', file=sys.stderr); sys.exit(3)"
    with (
        pytest.raises(StartupError, match="exited with 3") as exc,
        running(
            [sys.executable, "-c", code],
            name="crash",
            log_dir=tmp_path,
            health_url=f"http://127.0.0.1:{port}/health",
            startup_timeout=30,
        ) as _p,
    ):
        pass
    assert "boom" in str(exc.value)
