"""The quick start's demo: validation, screening, report and publishing audit, end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ledger import open_ledger, verify


def test_demo_publishes_a_clean_sim_study(tmp_path: Path) -> None:
    db, html = tmp_path / "demo.db", tmp_path / "demo.html"
    # A smaller time scale than the demo's default keeps the test short; the pipeline is the same.
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("ledger")),
            "demo",
            "--db",
            f"sqlite:///{db}",
            "--html",
            str(html),
            "--time-scale",
            "0.005",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    page = html.read_text(encoding="utf-8")
    assert "<svg" in page or "data:image/png" in page
    with open_ledger(f"sqlite:///{db}", create=False) as led:
        assert verify(led).ok
        finished = [e.data for e in led.events(kind="run.finished")]
    assert len(finished) == 2 and all(d["status"] == "completed" for d in finished)
