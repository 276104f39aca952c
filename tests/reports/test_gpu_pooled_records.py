"""Table 3 pooled over the runs of one plan and config on several H200s (`ledger report
--pool-replays`), re-derived from four committed exports:

- tests/data/gpu-replay-3: the third run was interrupted in its last block's teardown: every
  request and check of it is in the ledger, its last block has no block.finished, and the audit
  blocks publishing on exactly that;
- tests/data/gpu-pooled: the third run complete, and the ledger publishes with no finding;
- tests/data/gpu-pooled-12: gpu-pooled's export replayed three more times on a fourth H200: six
  complete runs, twelve block pairs, and the ledger publishes with no finding;
- tests/data/gpu-pooled-18: gpu-pooled-12's export replayed three more times on a fifth H200:
  nine complete runs, eighteen block pairs, and the ledger publishes with no finding.

For each, the runs' payload digests and GPUs, and the pooled cells against each run's own
per-pair changes and against the table docs/gpu-study.md gives.
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

DATA = Path(__file__).resolve().parents[1] / "data"
ORIGINAL = "01a2355e-1b19-73f6-85dc-dc530fe1769c"
# Each study and the heading of its section in docs/gpu-study.md.
SECTIONS = {
    "gpu-replay-3": "## Three runs, six block pairs (`tests/data/gpu-replay-3`)",
    "gpu-pooled": "## Three complete runs, six block pairs, published (`tests/data/gpu-pooled`)",
    "gpu-pooled-12": "## Six complete runs, twelve block pairs, published (`tests/data/gpu-pooled-12`)",
    "gpu-pooled-18": "## Nine complete runs, eighteen block pairs, published (`tests/data/gpu-pooled-18`)",
}
Record = tuple[str, str, list[Event], dict[str, Any]]


@pytest.fixture(scope="module", params=sorted(SECTIONS))
def record(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Record:
    study = str(request.param)
    url = f"sqlite:///{tmp_path_factory.mktemp(study) / 'ledger.db'}"
    events = import_export(DATA / study / "ledger.jsonl.xz", url)
    result = ledger_cli("report", "--db", url, "--json", "--pool-replays")
    assert result.exit_code == 0, result.output
    return study, url, events, json.loads(result.output)


def _screenings(events: list[Event]) -> list[str]:
    return [str(e.run_id) for e in events if e.kind == "run.started" and e.data["experiment"] == "screening"]


def _of(events: list[Event], run: str, kind: str) -> list[Event]:
    return [e for e in events if e.run_id == run and e.kind == kind]


def test_the_runs_replay_one_plan_on_gpus_other_than_the_originals(record: Record) -> None:
    study, _, events, _ = record
    runs = _screenings(events)
    replays = json.loads((DATA / study / "STUDY.json").read_text())["replays"]
    assert runs[0] == ORIGINAL and runs[1:] == [r for r, of in replays.items() if of == ORIGINAL]
    started = {str(e.run_id): e.data for e in events if e.kind == "run.started"}
    assert [started[r].get("replay_of") for r in runs] == [None] + [ORIGINAL] * (len(runs) - 1)
    payloads = [payload_digests(events, r) for r in runs]
    assert len(payloads[0]) == 224 and all(p == payloads[0] for p in payloads)
    gpus = [replica_gpus(events, r) for r in runs]
    # Each run on one GPU; the first replay on another host than the original, the second on a
    # third; later replays three to a host, each host new (gpu-pooled-12's on a fourth, the three
    # gpu-pooled-18 adds on a fifth).
    assert all(len(g) == 1 for g in gpus) and len(set().union(*gpus[:3])) == 3
    later = [set().union(*gpus[i : i + 3]) for i in range(3, len(gpus), 3)]
    assert all(len(host) == 1 for host in later)
    hosts = [*gpus[:3], *later]
    assert len(set().union(*hosts)) == len(hosts)
    for run in runs:
        checks = [e.data["passed"] for e in _of(events, run, "assertion.evaluated")]
        assert len(checks) == 612 and all(checks)


def test_the_audit_blocks_exactly_on_an_interrupted_run(record: Record) -> None:
    study, url, events, _ = record
    runs = _screenings(events)
    complete = {
        run
        for run in runs
        if [e.data["status"] for e in _of(events, run, "run.finished")] == ["completed"]
        and len(_of(events, run, "block.finished")) == len(_of(events, run, "block.started")) == 4
    }
    result = ledger_cli("audit", "--db", url, "--json")
    blocking = [f for f in json.loads(result.output)["findings"] if f["severity"] == "blocking"]
    assert [(f["code"], f["run_id"]) for f in blocking] == [
        ("run-incomplete", r) for r in runs if r not in complete
    ]
    publishes = ledger_cli("audit", "--db", url, "--publish").exit_code == 0
    assert publishes == (complete == set(runs))
    # What each study says of itself: the pooled ones publish; gpu-replay-3's third run was cut.
    assert publishes == (study != "gpu-replay-3")
    if study == "gpu-replay-3":
        third = runs[-1]
        started = [e.block_id for e in _of(events, third, "block.started")]
        assert [e.block_id for e in _of(events, third, "block.finished")] == started[:3]
        (done,) = [e.data for e in _of(events, third, "run.finished")]
        assert done["status"] == "aborted" and "interrupted" in done["error"]
    else:
        assert json.loads(result.output)["findings"] == []


def test_pooled_cells_count_every_runs_pairs_each_its_own_runs_change(record: Record) -> None:
    _, _, events, report = record
    runs = _screenings(events)
    own = {
        (c["run_id"], c["nominal_tokens"], c["locality"]): c["inference"]["per_pair_change_pct"]
        for c in report["tables"]["ttft"]
    }
    pooled = report["tables"]["ttft_series"]
    assert len(pooled) == 15
    pairs = sum(len(_of(events, run, "block.started")) // 2 for run in runs)  # OFF–ON–ON–OFF: two a run
    assert pairs == 2 * len(runs)
    # Pooled across hosts, never across kinds of GPU: every replica of every run ran on one model.
    models = {e.data["gpu"]["name"] for r in runs for e in _of(events, r, "deployment.launched")}
    assert len(models) == 1
    for cell in pooled:
        assert cell["series"] == ORIGINAL and cell["runs"] == runs and cell["hardware"] == sorted(models)
        inference = cell["inference"]
        assert (
            cell["matched_units"] == pairs
            and inference["n_block_pairs"] == pairs
            and "wilcoxon_ci" in inference
        )
        key = (cell["nominal_tokens"], cell["locality"])
        assert Counter(inference["per_pair_change_pct"]) == Counter(x for r in runs for x in own[(r, *key)])


def test_the_documented_table_is_the_pooled_report(record: Record) -> None:
    study, _, _, report = record
    assert documented_pooled_table(SECTIONS[study]) == pooled_table(report)
