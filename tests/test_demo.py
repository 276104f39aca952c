"""The quick start's demo: validation, screening, report, publishing audit and its verdict, end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ledger import open_ledger, verify


def test_demo_publishes_a_clean_sim_study_and_ends_with_a_verdict(tmp_path: Path) -> None:
    db, html = tmp_path / "demo.db", tmp_path / "demo.html"
    # A smaller time scale than the demo's default keeps the test short; the pipeline is the same.
    # The root group's --db, as the quick start gives it.
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("ledger")),
            "--db",
            f"sqlite:///{db}",
            "demo",
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
        screening = [e.run_id for e in led.events(kind="run.started") if e.data["experiment"] == "screening"]
    assert len(finished) == 2 and all(d["status"] == "completed" for d in finished)

    # The verdict is the output's last lines, at most 12 after its rule.
    lines = proc.stdout.splitlines()
    rule = max(i for i, line in enumerate(lines) if "verdict" in line and "─" in line)
    verdict = lines[rule + 1 :]
    assert 0 < len(verdict) <= 12, verdict
    assert verdict[0].startswith("publish: yes")
    assert any(
        line.startswith("headline at 128k tokens") and "cross-replica reuse" in line for line in verdict
    )
    assert f"report: {html.resolve()}" in verdict
    commands = verdict[verdict.index("next:") + 1 :]
    assert len(commands) == 3 and all(f"--db sqlite:///{db}" in c for c in commands)
    assert screening[0] in commands[0]
