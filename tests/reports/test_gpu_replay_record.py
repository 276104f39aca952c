"""tests/data/gpu-replay: the publishable GPU study replayed on another H200, re-derived from its export.

The export holds the original study (imported from tests/data/gpu-published) and, after it,
the replaying host's probes and the replays of its validation and screening. Here every
replay claim is derived from the events themselves, not from the replay's own note: each
replay names its original, runs the original's recorded script, params and seed, sends a
request with the same payload digest for every request key and no other, registers the same
plan, and ran on a GPU other than the original's, with that GPU's own probes in the ledger.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ledger import Event

from .._cli import ledger_cli
from .conftest import documented_table, import_export, payload_digests, replica_gpus

STUDY = Path(__file__).resolve().parents[1] / "data" / "gpu-replay"
PUBLISHED = STUDY.parent / "gpu-published"


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Event]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('gpu-replay') / 'ledger.db'}"
    return url, import_export(STUDY / "ledger.jsonl.xz", url)


def _replays() -> dict[str, str]:
    replays: dict[str, str] = json.loads((STUDY / "STUDY.json").read_text())["replays"]
    return replays


def _started(events: list[Event]) -> dict[str, Event]:
    return {str(e.run_id): e for e in events if e.kind == "run.started"}


def test_the_original_study_is_the_published_one_event_for_event(
    record: tuple[str, list[Event]], tmp_path: Path
) -> None:
    _, events = record
    published = import_export(PUBLISHED / "ledger.jsonl.xz", f"sqlite:///{tmp_path / 'published.db'}")
    assert [(e.id, e.digest, e.chain) for e in events[: len(published)]] == [
        (e.id, e.digest, e.chain) for e in published
    ]
    assert len(events) > len(published)  # the replays and the replaying host's probes follow


def test_each_replay_reran_its_original_from_the_recorded_script(record: tuple[str, list[Event]]) -> None:
    _, events = record
    started = _started(events)
    recorded = {run: e.data.get("replay_of") for run, e in started.items() if e.data.get("replay_of")}
    assert {v: k for k, v in recorded.items()} == _replays()
    for original, replay in _replays().items():
        a, b = started[original].data, started[replay].data
        assert b["experiment"] == a["experiment"]
        assert b["source"] == a["source"] and b["script_sha256"] == a["script_sha256"]
        assert b["seed"] == a["seed"]
        # The params are the recorded ones: the config digest and every experiment param alike.
        assert b["params"]["config_sha256"] == a["params"]["config_sha256"]
        assert {k: v for k, v in b["params"].items() if k != "logs_dir"} == {
            k: v for k, v in a["params"].items() if k != "logs_dir"
        }


def test_every_request_of_a_replay_has_its_originals_payload_digest(record: tuple[str, list[Event]]) -> None:
    _, events = record
    for original, replay in _replays().items():
        before, after = payload_digests(events, original), payload_digests(events, replay)
        assert before and before == after
        plans = {
            run: [e.data["plan_sha256"] for e in events if e.kind == "plan.registered" and e.run_id == run]
            for run in (original, replay)
        }
        assert len(plans[original]) == 1 and plans[original] == plans[replay]
        # The replay's own note says what the events say.
        (note,) = [e.data for e in events if e.kind == "note.added" and e.data.get("replay_of") == original]
        assert note["matched"] == note["requests"] == len(before) and note["all_matched"] is True
        assert note["plan_matched"] is True and note["mismatched"] == []


def test_the_replays_ran_on_another_gpu_with_its_own_probes(record: tuple[str, list[Event]]) -> None:
    _, events = record
    started = _started(events)
    for original, replay in _replays().items():
        (old,), (new,) = replica_gpus(events, original), replica_gpus(events, replay)
        assert old != new and old.startswith("GPU-") and new.startswith("GPU-")
    probed: dict[str, set[str]] = defaultdict(set)
    for e in started.values():
        if e.data["experiment"].startswith("probe."):
            probed[e.data["experiment"]] |= {g["uuid"] for g in e.data["host"]["gpus"]}
    replayed_on = set().union(*(replica_gpus(events, r) for r in _replays().values()))
    ran_on = set().union(*(replica_gpus(events, r) for r in _replays()))
    assert set(probed) == {"probe.copy-ordering", "probe.lmcache-helpers", "probe.lmcache-pool"}
    assert all(uuids == replayed_on | ran_on for uuids in probed.values()), probed


def test_the_replay_passes_every_check_the_original_passed(record: tuple[str, list[Event]]) -> None:
    url, events = record
    for original, replay in _replays().items():
        verdicts: dict[str, dict[str, Any]] = {}
        for run in (original, replay):
            checks = [e.data for e in events if e.kind == "assertion.evaluated" and e.run_id == run]
            verdicts[run] = {
                "checks": sorted({c["check"] for c in checks}),
                "count": len(checks),
                "failed": [c for c in checks if not c["passed"]],
            }
        assert verdicts[original]["count"] > 0 and not verdicts[original]["failed"]
        assert verdicts[replay] == verdicts[original]
    result = ledger_cli("audit", "--db", url, "--publish")
    assert result.exit_code == 0, result.output


def test_the_documented_side_by_side_table_is_what_the_benchmark_derives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.gpu_screening import study

    figures = study(STUDY)
    capsys.readouterr()
    assert figures is not None
    by_run = {f["run_id"]: {row["size"]: row for row in f["sizes"]} for f in figures}
    ((original, replay),) = [(o, r) for o, r in _replays().items() if o in by_run]
    documented = {
        size: [float(x) for x in cells]
        for size, cells in documented_table("| size | cross ON/OFF, original |").items()
    }
    assert set(documented) == set(by_run[original]) == set(by_run[replay])
    for size, cells in documented.items():
        a, b = by_run[original][size], by_run[replay][size]
        derived = [
            a["cross_on_over_off"],
            b["cross_on_over_off"],
            a["cross_over_local1_on"],
            b["cross_over_local1_on"],
            a["cold_over_cross_on"],
            b["cold_over_cross_on"],
        ]
        assert cells == derived, size


def test_the_documented_calls_are_the_ones_that_ran() -> None:
    """docs/gpu-study.md's two gpu-study calls name the steps, pre-step commands and replays that
    each call's summary recorded, in that order."""
    doc = (STUDY.parents[2] / "docs" / "gpu-study.md").read_text()
    section = doc[doc.index("## Replayed on another H200") :]
    block = section[section.index("```bash") : section.index("```", section.index("```bash") + 3)]
    calls = [line for line in block.replace("\\\n    ", " ").splitlines() if "scripts/gpu-study" in line]
    summary = json.loads((STUDY / "summary.json").read_text())["calls"]
    assert len(calls) == len(summary) == 2
    final = ["verify", "audit", "report", "export"]
    for call, ran in zip(calls, summary, strict=True):
        steps = [s["name"] for s in ran["steps"]]
        assert all(s["rc"] == 0 for s in ran["steps"]), ran["steps"]
        wanted = call.split("--steps ")[1].split()[0].split(",")
        pre = [s for s in ran["steps"] if s["name"].startswith("pre-")]
        # The named steps in the driver's order (install, kvledger, engines; each --pre; each
        # --replay), then the final ones.
        expected = [n for n in ("install", "kvledger", "engines") if n in wanted]
        expected += [s["name"] for s in pre] + ["replay"] * call.count("--replay ")
        assert steps == expected + final, (steps, wanted)
        for step in pre:
            assert f"--pre '{step['name'].removeprefix('pre-')}={step['command']}'" in call, step
        replays = [s["command"][-2] for s in ran["steps"] if s["name"] == "replay"]
        assert [f"--replay {run}" for run in replays] == [
            f"--replay {part.split()[0]}" for part in call.split("--replay ")[1:]
        ]
        assert set(replays) <= set(_replays())


def test_the_pooled_table_counts_both_runs_block_pairs(record: tuple[str, list[Event]]) -> None:
    url, _ = record
    result = ledger_cli("report", "--db", url, "--json", "--pool-replays")
    assert result.exit_code == 0, result.output
    tables = json.loads(result.output)["tables"]
    ((original, replay),) = [
        (o, r) for o, r in _replays().items() if o in {c["run_id"] for c in tables["ttft"]}
    ]
    pooled = tables["ttft_series"]
    assert len(pooled) == len([c for c in tables["ttft"] if c["run_id"] == original]) == 15
    for cell in pooled:
        assert cell["series"] == original and cell["runs"] == [original, replay]
        assert cell["matched_units"] == 4 and cell["inference"]["mode"] == "descriptive"
