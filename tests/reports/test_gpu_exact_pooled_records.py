"""needle-exact across the whole scaled screening shape on a GPU, and its replay
(tests/data/gpu-exact-pooled).

tests/data/gpu-exact-256k's export imported on another H100, that host's probes recorded, then the
scaled GPU screening shape (every workload, 8,000 to 256,000 tokens) serving ``needle-exact`` and
its replay by ``ledger replay``. Every exact-value check of both runs was applicable (the card
serves 256,000 tokens) and passed at every size, the ON cross-replica reuses included; the ledger
publishes. Every claim is derived from the committed export's events, and the table
docs/gpu-study.md gives from its pooled report.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from experiments.needle import EXACT
from ledger import Event

from .._cli import ledger_cli
from .conftest import (
    POOLED_HEADER,
    documented_table,
    import_export,
    ledger_rows,
    payload_digests,
    replica_gpus,
)

STUDY = Path(__file__).resolve().parents[1] / "data" / "gpu-exact-pooled"
SECTION = (
    "## needle-exact across the scaled shape, and its replay, on an H100 (`tests/data/gpu-exact-pooled`)"
)
Record = tuple[str, list[Event], dict[str, Any]]


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Record:
    url = f"sqlite:///{tmp_path_factory.mktemp('gpu-exact-pooled') / 'ledger.db'}"
    events = import_export(STUDY / "ledger.jsonl.xz", url)
    result = ledger_cli("report", "--db", url, "--json", "--pool-replays")
    assert result.exit_code == 0, result.output
    return url, events, json.loads(result.output)


def _shape_runs(events: list[Event]) -> list[str]:
    """The screening of the whole shape and its replays (the imported screening ran one size)."""
    replays = json.loads((STUDY / "STUDY.json").read_text())["replays"]
    original = next(iter(set(replays.values())))
    return [original, *(r for r, of in replays.items() if of == original)]


def test_the_replay_sent_the_originals_payloads_on_another_host_than_the_imported_study(
    record: Record,
) -> None:
    _, events, _ = record
    original, replay = _shape_runs(events)
    started = {str(e.run_id): e.data for e in events if e.kind == "run.started"}
    assert started[original]["experiment"] == "screening" and started[replay].get("replay_of") == original
    assert payload_digests(events, original) == payload_digests(events, replay)
    assert replica_gpus(events, original) == replica_gpus(events, replay)
    imported = [r for r, d in started.items() if d["experiment"] == "needle_eval"]
    assert len(replica_gpus(events, original)) == 1
    assert replica_gpus(events, original).isdisjoint(replica_gpus(events, imported[0]))


def test_both_runs_served_needle_exact_and_passed_every_check(record: Record) -> None:
    url, events, _ = record
    expected = json.loads(EXACT.manifest.read_text())["files"]
    for run in _shape_runs(events):
        (audit,) = [e.data for e in events if e.kind == "checkpoint.audited" and e.run_id == run]
        assert audit["matched"] is True and {f["name"]: f["sha256"] for f in audit["files"]} == expected
        checks = [e.data["passed"] for e in events if e.kind == "assertion.evaluated" and e.run_id == run]
        assert checks and all(checks)
        (done,) = [e.data for e in events if e.kind == "run.finished" and e.run_id == run]
        assert done["status"] == "completed"
    assert ledger_cli("audit", "--db", url, "--publish").exit_code == 0


def test_exact_values_held_at_every_size_and_on_every_on_cross_replica_reuse(record: Record) -> None:
    url, events, _ = record
    shape_runs = _shape_runs(events)
    runs = "', '".join(shape_runs)
    rows = ledger_rows(
        url,
        f"""SELECT q.run_id, q.nominal_tokens, q.step, b.arm, r.prompt_tokens, h.external_hit_tokens,
                   a.passed
            FROM assertion_evaluated a JOIN request_sent q USING (request_id)
            JOIN response_received r USING (request_id) LEFT JOIN hits_observed h USING (request_id)
            JOIN block_started b ON b.block_id = q.block_id
            WHERE a."check" = 'exact_values' AND NOT q.warmup AND q.run_id IN ('{runs}')""",
    )
    assert rows and all(r["passed"] for r in rows)
    by_size: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_size[int(r["nominal_tokens"])].append(r)
    assert sorted(by_size) == [8000, 32000, 128000, 256000]
    for size, checks in by_size.items():
        cross_on = [r for r in checks if r["step"] == "cross" and r["arm"] == "ON"]
        # two ON blocks a run, one cross-replica reuse each, each loading its whole shared prefix
        assert len(cross_on) == 2 * len(shape_runs), size
        assert all(r["external_hit_tokens"] >= r["prompt_tokens"] - 256 for r in cross_on), size


def test_the_documented_table_is_the_pooled_report(record: Record) -> None:
    _, events, report = record
    shape_runs = _shape_runs(events)
    derived: dict[int, list[str]] = defaultdict(list)
    launched = [e for e in events if e.kind == "deployment.launched" and e.run_id in shape_runs]
    hardware = sorted({e.data["gpu"]["name"] for e in launched})  # both runs' replicas, one model
    for cell in report["tables"]["ttft_series"]:
        if cell["series"] == shape_runs[0]:
            assert cell["runs"] == shape_runs and cell["matched_units"] == 4
            assert cell["hardware"] == hardware and hardware[0].startswith("NVIDIA H100")
            assert cell["inference"]["mode"] == "descriptive"  # four block pairs: fewer than six
            derived[cell["nominal_tokens"]].append(f"{cell['mean_change_pct']:+.1f} %")
    assert documented_table(POOLED_HEADER, SECTION) == dict(derived)
