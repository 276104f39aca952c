"""The result of one probe invocation, and the pieces every probe's parent shares."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from collectors.probes._cuda import gpus_inventory
from collectors.probes._envelope import (
    REPO_ROOT,
    code_version,
    envelope,
    file_sha256,
    host_info,
    package_versions,
)


@dataclass
class ProbeRun:
    """What one probe invocation produced: bare envelopes plus timing and outcome."""

    run_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    status: str = "completed"
    error: str | None = None
    seconds: float = 0.0
    checks: int = 0
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "completed" else 1

    def probe_events(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"].startswith("probe.")]


def run_child(cmd: list[str], env: dict[str, str], cwd: str, timeout_s: float) -> tuple[int, str]:
    """Run one probe child; ``(exit code, stderr)``, -9 when it ran past ``timeout_s`` (killed)."""
    try:
        proc = subprocess.run(
            cmd,
            env=env,
            cwd=cwd,
            timeout=timeout_s,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    except subprocess.TimeoutExpired as exc:
        raw = exc.stderr or ""
        return -9, raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return proc.returncode, proc.stderr


def child_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the repository first on ``PYTHONPATH``, so a child can ``-m collectors.probes``."""
    env = dict(base)
    root = str(REPO_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def started_event(
    run_id: str,
    *,
    experiment: str,
    script_file: str,
    script: str,
    params: Mapping[str, Any],
    packages: Mapping[str, str | None],
    driver: str | None,
    **extra: Any,
) -> dict[str, Any]:
    """The ``run.started`` envelope: what ran (script, its digest, code, packages) on which host."""
    return envelope(
        "run.started",
        {
            "experiment": experiment,
            "script_sha256": file_sha256(script_file),
            "params": dict(params),
            "seed": None,
            "code": code_version(),
            "packages": package_versions(packages),
            "host": host_info(gpus_inventory(), driver_version=driver),
            "script": script,
            **extra,
        },
        run_id,
    )


def finish(run: ProbeRun, **fields: Any) -> None:
    """Append ``run.finished``: the run's status, error and seconds, then the probe's own ``fields``."""
    run.events.append(
        envelope(
            "run.finished",
            {"status": run.status, "error": run.error, "seconds": round(run.seconds, 6), **fields},
            run.run_id,
        )
    )
