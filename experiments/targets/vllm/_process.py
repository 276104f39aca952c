"""Start a server process, wait for it to be healthy, stop it for sure.

Generic (no engine imports; the standard library and the ledger's error tree only)::

    with running(["python", "-m", "http.server", "8000"], name="web", log_dir=tmp,
                 health_url="http://127.0.0.1:8000/", startup_timeout=30) as proc:
        ...                                   # proc.pid, proc.stdout_path, ...
    proc.exit                                 # ExitInfo(code=..., killed=...)

Each process runs in its own session (process group) so that its children (vLLM's
engine-core worker, for instance) are signalled with it. ``terminate`` sends SIGTERM
to the group, waits ``grace`` seconds for the group to empty, then SIGKILLs it: a
misconfigured vLLM replica ignores SIGTERM. Output goes to two log files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ledger._errors import TargetError

from .. import _children

__all__ = [
    "ExitInfo",
    "Process",
    "StartupError",
    "http_get",
    "running",
    "start",
    "tail",
    "wait_http",
    "wait_tcp",
]


class StartupError(TargetError):
    """The process exited, or its health URL did not answer in time (the deployment did not start)."""


@dataclass(frozen=True)
class ExitInfo:
    code: int  # Popen.returncode: negative = killed by that signal
    killed: bool  # SIGKILL had to be sent (SIGTERM did not empty the group in time)
    stop_seconds: float  # from the first signal to the group being gone

    @property
    def signal_name(self) -> str | None:
        if self.code < 0:
            with contextlib.suppress(ValueError):
                return signal.Signals(-self.code).name
            return f"signal {-self.code}"
        return None


def tail(path: Path, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url``; (status, body). HTTP errors return their status; no-connection raises."""
    req = urllib.request.Request(url, headers={"User-Agent": "kvledger"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@dataclass
class Process:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None
    stdout_path: Path
    stderr_path: Path
    popen: subprocess.Popen[bytes]
    started_at: float  # time.time()
    started_mono: float = field(default_factory=time.monotonic)
    ready_seconds: float | None = None  # set by wait_http
    exit: ExitInfo | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def group_alive(self) -> bool:
        """Whether any process of the group (the leader or a child) is still there."""
        if self.popen.poll() is None:
            return True
        try:
            os.killpg(self.popen.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def logs_tail(self, lines: int = 30) -> str:
        return (
            f"--- {self.stdout_path.name} ---\n{tail(self.stdout_path, lines)}\n"
            f"--- {self.stderr_path.name} ---\n{tail(self.stderr_path, lines)}"
        )

    def wait_http(
        self, url: str, timeout: float, *, expect_status: int = 200, interval: float = 0.5
    ) -> float:
        """Wait until GET ``url`` answers ``expect_status``; seconds since start."""
        wait_http(url, timeout, expect_status=expect_status, interval=interval, process=self)
        self.ready_seconds = time.monotonic() - self.started_mono
        return self.ready_seconds

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def terminate(self, grace: float = 10.0) -> ExitInfo:
        """SIGTERM the group, SIGKILL what is left after ``grace`` s; the leader's exit code."""
        if self.exit is not None:
            return self.exit
        t0 = time.monotonic()
        killed = False
        if self.group_alive():
            self._signal_group(signal.SIGTERM)
            deadline = t0 + grace
            while self.group_alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.group_alive():
                killed = True
                self._signal_group(signal.SIGKILL)
        code = self.popen.wait()
        # Children may outlive the leader briefly after SIGKILL; wait for the group.
        end = time.monotonic() + 10
        while self.group_alive() and time.monotonic() < end:
            self._signal_group(signal.SIGKILL)
            time.sleep(0.05)
        self.exit = ExitInfo(code=code, killed=killed, stop_seconds=time.monotonic() - t0)
        return self.exit


def start(
    argv: Sequence[str],
    *,
    name: str,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent: bool = False,
) -> Process:
    """Start ``argv`` in a new process group, output to ``log_dir/name.{stdout,stderr}.log``.

    ``env`` is the whole environment (default: this process's); ``extra_env`` is laid
    over it. ``die_with_parent`` (Linux): the child gets SIGTERM when the thread that
    started it dies, so a SIGKILLed runner leaves no engine behind; call it from a
    long-lived thread (the event loop's), not a worker thread.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ if env is None else env)
    if extra_env:
        full_env.update(extra_env)
    out_path = log_dir / f"{name}.stdout.log"
    err_path = log_dir / f"{name}.stderr.log"
    with open(out_path, "ab") as out, open(err_path, "ab") as err:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_children.die_with_parent if die_with_parent else None,
        )
    return Process(
        name=name,
        argv=list(argv),
        env=full_env,
        cwd=cwd,
        stdout_path=out_path,
        stderr_path=err_path,
        popen=popen,
        started_at=time.time(),
    )


def wait_http(
    url: str,
    timeout: float,
    *,
    expect_status: int = 200,
    interval: float = 0.5,
    process: Process | None = None,
) -> None:
    """Poll ``url`` until it answers ``expect_status``.

    Raises StartupError when ``timeout`` s pass, or at once when ``process`` exits.
    """
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while True:
        if process is not None and process.poll() is not None:
            raise StartupError(
                f"{process.name} exited with {process.poll()} before {url} was healthy\n"
                + process.logs_tail()
            )
        try:
            status, _ = http_get(url, timeout=min(5.0, max(0.5, deadline - time.monotonic())))
            if status == expect_status:
                return
            last = f"HTTP {status}"
        except (OSError, urllib.error.URLError) as e:
            last = repr(e)
        if time.monotonic() >= deadline:
            msg = f"{url} not healthy after {timeout:.0f} s ({last})"
            if process is not None:
                msg = f"{process.name} did not start: {msg}\n{process.logs_tail()}"
            raise StartupError(msg)
        time.sleep(interval)


def wait_tcp(
    host: str, port: int, timeout: float, *, interval: float = 0.25, process: Process | None = None
) -> None:
    """Wait until ``host:port`` accepts a connection (a server without a health URL).

    Raises StartupError when ``timeout`` s pass, or at once when ``process`` exits.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise StartupError(
                f"{process.name} exited with {process.poll()} before {host}:{port} accepted\n"
                + process.logs_tail()
            )
        try:
            with socket.create_connection((host, port), timeout=2.0):
                if process is not None:
                    process.ready_seconds = time.monotonic() - process.started_mono
                return
        except OSError as e:
            last = repr(e)
        if time.monotonic() >= deadline:
            msg = f"{host}:{port} not accepting after {timeout:.0f} s ({last})"
            if process is not None:
                msg = f"{process.name} did not start: {msg}\n{process.logs_tail()}"
            raise StartupError(msg)
        time.sleep(interval)


@contextlib.contextmanager
def running(
    argv: Sequence[str],
    *,
    name: str,
    log_dir: Path,
    health_url: str | None = None,
    startup_timeout: float = 120.0,
    grace: float = 10.0,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[Process]:
    """Start, wait for health, yield, and always terminate (also when start-up fails).

    Suits a pytest fixture: ``with running(...) as p: yield p``.
    """
    proc = start(argv, name=name, log_dir=log_dir, env=env, extra_env=extra_env, cwd=cwd)
    try:
        if health_url is not None:
            proc.wait_http(health_url, startup_timeout)
        yield proc
    finally:
        proc.terminate(grace)
