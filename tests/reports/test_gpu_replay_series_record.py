"""tests/data/gpu-replay-3: three runs of one plan and config on three H200s, pooled into Table 3
over six block pairs (`ledger report --pool-replays`), re-derived from the export.

The third run was interrupted in its last block's teardown: every request and check of it is in
the ledger, its last block has no block.finished, and the audit blocks publishing on exactly
that. The pooled cells are checked against each run's own per-pair changes and against the
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

STUDY = Path(__file__).resolve().parents[1] / "data" / "gpu-replay-3"
ORIGINAL = "01a2355e-1b19-73f6-85dc-dc530fe1769c"


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Event], dict[str, Any]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('gpu-replay-3') / 'ledger.db'}"
    events = import_export(STUDY / "ledger.jsonl.xz", url)
    result = ledger_cli("report", "--db", url, "--json", "--pool-replays")
    assert result.exit_code == 0, result.output
    return url, events, json.loads(result.output)


def _screenings(events: list[Event]) -> list[str]:
    return [str(e.run_id) for e in events if e.kind == "run.started" and e.data["experiment"] == "screening"]


def test_three_runs_of_one_plan_on_three_gpus(record: tuple[str, list[Event], dict[str, Any]]) -> None:
    _, events, _ = record
    runs = _screenings(events)
    assert len(runs) == 3 and runs[0] == ORIGINAL
    started = {str(e.run_id): e.data for e in events if e.kind == "run.started"}
    assert [started[r].get("replay_of") for r in runs] == [None, ORIGINAL, ORIGINAL]
    payloads = [payload_digests(events, r) for r in runs]
    assert payloads[0] and payloads[0] == payloads[1] == payloads[2]
    gpus = [replica_gpus(events, r) for r in runs]
    assert all(len(g) == 1 for g in gpus) and len(set().union(*gpus)) == 3


def test_the_third_run_was_cut_in_its_teardown_and_the_audit_says_so(
    record: tuple[str, list[Event], dict[str, Any]],
) -> None:
    url, events, _ = record
    third = _screenings(events)[-1]
    of = [e for e in events if e.run_id == third]
    checks = [e.data for e in of if e.kind == "assertion.evaluated"]
    assert len([e for e in of if e.kind == "request.sent"]) == 224
    assert len(checks) == 612 and all(c["passed"] for c in checks)
    started = [e.block_id for e in of if e.kind == "block.started"]
    finished = [e.block_id for e in of if e.kind == "block.finished"]
    assert len(started) == 4 and finished == started[:3]
    (done,) = [e.data for e in of if e.kind == "run.finished"]
    assert done["status"] == "aborted" and "interrupted" in done["error"]
    result = ledger_cli("audit", "--db", url, "--json")
    blocking = [f for f in json.loads(result.output)["findings"] if f["severity"] == "blocking"]
    assert [(f["code"], f["run_id"]) for f in blocking] == [("run-incomplete", third)]
    assert ledger_cli("audit", "--db", url, "--publish").exit_code == 1


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
    assert documented_pooled_table(
        "## Three runs, six block pairs (`tests/data/gpu-replay-3`)"
    ) == pooled_table(report)
