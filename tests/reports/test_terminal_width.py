"""`ledger report` and `ledger audit` in an 80-column terminal: nothing wraps past the edge, run ids
stay short and distinct, a statistics cell is never split, and an empty table says "none"."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from ledger._cli import cli
from tests._synthetic import Flaws, generate

from .conftest import import_envelopes

IMPORTS = Path(__file__).parents[1] / "data" / "imports"


def _at_80(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "80"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return str(result.stdout)


def _report_json(url: str) -> dict[str, Any]:
    return dict(json.loads(_at_80("report", "--db", url, "--json")))


def test_report_reads_at_80_columns(sqlite_url: str) -> None:
    events, _ = generate(screenings=2, flaws=Flaws())
    import_envelopes(sqlite_url, events).close()
    report = _report_json(sqlite_url)
    shown = _at_80("report", "--db", sqlite_url)
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 80

    # Each TTFT row's statistics cell is whole on its row: its block-pair count and mode or p-value.
    rows = report["tables"]["ttft"]
    cells = [line for line in lines if re.search(r"(descr\. n=\d+|p=\S+ n=\d+) │$", line)]
    paired = sum(len(report["tables"][t]) for t in ("ttft", "sessions", "decode", "windows"))
    assert len(cells) == paired >= len(rows) > 0

    # Two runs: each id shown by a label of its own, never cut to an ellipsis by the table.
    run_ids = [r["run_id"] for r in report["runs"]]
    assert len(run_ids) > 1
    labels = re.search(r"^runs: (.*)$", shown, re.M)
    assert labels is not None
    shown_ids = [part.split(" ")[0] for part in labels.group(1).split(", ")]
    assert len(set(shown_ids)) == len(run_ids)
    assert all(any(r.startswith(label.split("…")[0]) for r in run_ids) for label in shown_ids)
    for label in shown_ids:
        assert sum(line.startswith(f"│ {label} ") for line in lines) >= len(rows) // len(run_ids)

    # A table without rows is one line saying so.
    assert report["exclusions"] == []
    assert "Exclusions (whole blocks, never single requests): none" in lines


def test_audit_reads_at_80_columns(sqlite_url: str) -> None:
    for tool, name in (("vllm-bench", "vllm-bench.json"), ("guidellm", "guidellm.json")):
        assert _at_80("--db", sqlite_url, "import", "--from", tool, str(IMPORTS / name))
    findings = json.loads(_at_80("audit", "--db", sqlite_url, "--json"))["findings"]
    shown = _at_80("audit", "--db", sqlite_url)
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 80
    # Both imports were recorded within a minute: UUIDv7 ids that share their first 8 characters,
    # shown apart all the same.
    run_ids = sorted({f["run_id"] for f in findings})
    assert len(run_ids) == 2 and run_ids[0][:8] == run_ids[1][:8]
    for run_id in run_ids:
        label = f"run {run_id[:8]}…{run_id[-4:]}"
        assert sum(line.startswith(f"  {label} ") for line in lines) == sum(
            f["run_id"] == run_id for f in findings
        )
    # Every detail is printed whole, wrapped as prose under its finding.
    text = " ".join(line.strip() for line in lines)
    assert all(f["detail"] in text for f in findings)


def test_audit_of_an_empty_ledger_says_none(sqlite_url: str) -> None:
    assert _at_80("init", "--db", sqlite_url)
    shown = _at_80("audit", "--db", sqlite_url)
    assert "0 finding(s)" in shown and shown.splitlines()[-1] == "findings: none"


def test_events_read_at_80_columns(sqlite_url: str) -> None:
    assert _at_80("--db", sqlite_url, "import", "--from", "guidellm", str(IMPORTS / "guidellm.json"))
    listed = json.loads("[" + ",".join(_at_80("events", "--db", sqlite_url, "--json").splitlines()) + "]")
    lines = _at_80("events", "--db", sqlite_url).splitlines()
    assert max(len(line) for line in lines) <= 80
    # One line per event (after the header), each with its seq, kind and short run id whole.
    assert len(lines) == len(listed) + 1
    for line, event in zip(lines[1:], listed, strict=True):
        assert line.split()[:2] == [str(event["seq"]), event["kind"]] and event["run_id"][:8] in line
