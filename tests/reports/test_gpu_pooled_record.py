"""tests/data/gpu-pooled: three complete runs of one plan and config on three H200s, pooled into
Table 3 over six block pairs (`ledger report --pool-replays`), and the ledger publishes.

Re-derived from the export: the runs' payload digests and GPUs, every check of every run, the
audit's verdict, and the pooled cells against each run's own per-pair changes and against the
table docs/gpu-study.md gives.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ledger import Event

from .._cli import ledger_cli
from .conftest import documented_pooled_table, import_export, payload_digests, pooled_table, replica_gpus

STUDY = Path(__file__).resolve().parents[1] / "data" / "gpu-pooled"
ORIGINAL = "01a2355e-1b19-73f6-85dc-dc530fe1769c"
SECTION = "## Three complete runs, six block pairs, published (`tests/data/gpu-pooled`)"


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Event], dict[str, Any]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('gpu-pooled') / 'ledger.db'}"
    events = import_export(STUDY / "ledger.jsonl.xz", url)
    result = ledger_cli("report", "--db", url, "--json", "--pool-replays")
    assert result.exit_code == 0, result.output
    return url, events, json.loads(result.output)


def _screenings(events: list[Event]) -> list[str]:
    return [str(e.run_id) for e in events if e.kind == "run.started" and e.data["experiment"] == "screening"]


def test_three_complete_runs_of_one_plan_on_three_gpus(
    record: tuple[str, list[Event], dict[str, Any]],
) -> None:
    _, events, _ = record
    runs = _screenings(events)
    assert len(runs) == 3 and runs[0] == ORIGINAL
    started = {str(e.run_id): e.data for e in events if e.kind == "run.started"}
    assert [started[r].get("replay_of") for r in runs] == [None, ORIGINAL, ORIGINAL]
    payloads = [payload_digests(events, r) for r in runs]
    assert len(payloads[0]) == 224 and payloads[0] == payloads[1] == payloads[2]
    gpus = [replica_gpus(events, r) for r in runs]
    assert all(len(g) == 1 for g in gpus) and len(set().union(*gpus)) == 3
    for run in runs:
        of = [e for e in events if e.run_id == run]
        checks = [e.data["passed"] for e in of if e.kind == "assertion.evaluated"]
        assert len(checks) == 612 and all(checks)
        started_blocks = [e.block_id for e in of if e.kind == "block.started"]
        finished = [(e.block_id, e.data["status"]) for e in of if e.kind == "block.finished"]
        assert len(started_blocks) == 4 and finished == [(b, "completed") for b in started_blocks]
        (done,) = [e.data for e in of if e.kind == "run.finished"]
        assert done["status"] == "completed"


def test_the_ledger_publishes_with_no_finding(record: tuple[str, list[Event], dict[str, Any]]) -> None:
    url, _, _ = record
    result = ledger_cli("audit", "--db", url, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["findings"] == []
    assert ledger_cli("audit", "--db", url, "--publish").exit_code == 0


def test_pooled_cells_count_six_pairs_each_its_own_runs_change(
    record: tuple[str, list[Event], dict[str, Any]],
) -> None:
    _, events, report = record
    runs = _screenings(events)
    own = {
        (c["run_id"], c["nominal_tokens"], c["locality"]): c["inference"]["per_pair_change_pct"]
        for c in report["tables"]["ttft"]
    }
    pooled = report["tables"]["ttft_series"]
    assert len(pooled) == 15
    for cell in pooled:
        assert cell["series"] == ORIGINAL and cell["runs"] == runs
        inference = cell["inference"]
        assert cell["matched_units"] == 6 and inference["n_block_pairs"] == 6 and "wilcoxon_ci" in inference
        key = (cell["nominal_tokens"], cell["locality"])
        assert Counter(inference["per_pair_change_pct"]) == Counter(x for r in runs for x in own[(r, *key)])


def test_the_documented_table_is_the_pooled_report(record: tuple[str, list[Event], dict[str, Any]]) -> None:
    _, _, report = record
    assert documented_pooled_table(SECTION) == pooled_table(report)
