"""A replay of tests/data/gpu-exact-dense's screening on another H100, cut off by its call's deadline
(tests/data/gpu-exact-dense-replay).

tests/data/gpu-exact-dense's export imported, that host's probes recorded, then ``ledger replay`` of
the dense screening. The committed file holds the events after the imported head only, so the
ledger here is the dense study's export and then them, and its head must be the chain the host
verified. What the events show: every request the replay sent had the original's payload, on the
same kind of GPU; the call's deadline interrupted the third block, so the run is incomplete and
blocks publishing; and the replay registered another plan, because the model card's dense limit had
grown (its GPU evaluation, recorded in the same study after the screening) and the plan registers
the limit of the exact-value checks: so ``ledger report --pool-replays`` leaves it out of the
original's series and says the plan differs. (A replay now holds to the limit its original
registered: tests/experiments/test_replay_thresholds.py.) Every claim is derived from the events.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ledger import Event

from .._cli import ledger_cli
from .conftest import import_export, ledger_rows, payload_digests, replica_gpus

DATA = Path(__file__).resolve().parents[1] / "data"
STUDY = DATA / "gpu-exact-dense-replay"
Record = tuple[str, list[Event], dict[str, Any], int]  # ... and the imported study's head seq


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Record:
    url = f"sqlite:///{tmp_path_factory.mktemp('gpu-exact-dense-replay') / 'ledger.db'}"
    imported = import_export(DATA / "gpu-exact-dense" / "ledger.jsonl.xz", url)
    events = import_export(STUDY / "ledger-after.jsonl.xz", url)
    result = ledger_cli("report", "--db", url, "--json", "--pool-replays")
    assert result.exit_code == 0, result.output
    return url, events, json.loads(result.output), imported[-1].seq


def _replay(record: Record) -> tuple[str, str]:
    """The replay (the one run started after the imported study's head) and the run it replays."""
    _, events, _, head = record
    (replay,) = [e for e in events if e.kind == "run.started" and e.seq > head and e.data.get("replay_of")]
    return str(replay.run_id), str(replay.data["replay_of"])


def test_the_ledger_is_the_dense_study_and_the_hosts_events_after_it(record: Record) -> None:
    url, events, *_ = record
    verified = json.loads((STUDY / "verify.json").read_text())
    result = ledger_cli("verify", "--db", url)
    assert result.exit_code == 0, result.output
    assert events[-1].seq == verified["head_seq"] and events[-1].chain == verified["head_chain"]


def test_every_request_the_replay_sent_had_the_originals_payload_on_another_h100(record: Record) -> None:
    _, events, *_ = record
    replay, original = _replay(record)
    sent, planned = payload_digests(events, replay), payload_digests(events, original)
    assert sent and set(sent) < set(planned)  # cut off: fewer than the original sent
    assert all(planned[key] == digest for key, digest in sent.items())
    gpus = {
        e.run_id: e.data["gpu"]["name"] for e in events if e.kind == "deployment.launched" and e.data["gpu"]
    }
    assert gpus[replay] == gpus[original] and gpus[replay].startswith("NVIDIA H100")
    assert replica_gpus(events, replay).isdisjoint(replica_gpus(events, original))


def test_the_deadline_cut_the_replay_off_and_the_audit_blocks_publishing(record: Record) -> None:
    url, events, *_ = record
    replay, _ = _replay(record)
    (done,) = [e.data for e in events if e.kind == "run.finished" and e.run_id == replay]
    assert done["status"] == "aborted" and "interrupted" in done["error"]
    blocks = [e.data for e in events if e.kind == "block.finished" and e.run_id == replay]
    assert [b["status"] for b in blocks][-1] == "aborted" and len(blocks) < 4
    result = ledger_cli("audit", "--db", url, "--publish", "--json")
    assert result.exit_code != 0
    findings = json.loads(result.output)["findings"]
    blocking = {(f["code"], f["run_id"]) for f in findings if f["severity"] == "blocking"}
    assert ("run-incomplete", replay) in blocking
    assert {run for _, run in blocking} == {replay}  # the dense study itself still publishes


def test_what_the_replay_answered_was_exact(record: Record) -> None:
    url = record[0]
    replay, _ = _replay(record)
    rows = ledger_rows(
        url,
        f"""SELECT a.passed, q.step, b.arm FROM assertion_evaluated a JOIN request_sent q USING (request_id)
            JOIN block_started b ON b.block_id = q.block_id
            WHERE a."check" = 'exact_values' AND NOT q.warmup AND q.run_id = '{replay}'""",
    )
    assert rows and all(r["passed"] for r in rows)
    assert any(r["step"] == "cross" and r["arm"] == "ON" for r in rows)


def test_the_replay_registered_another_limit_of_exact_checks_and_is_not_pooled(record: Record) -> None:
    _, events, report, _ = record
    replay, original = _replay(record)
    plans = {e.run_id: dict(e.data) for e in events if e.kind == "plan.registered"}
    ours, theirs = plans[replay], plans[original]
    assert ours["plan_sha256"] != theirs["plan_sha256"]
    differing = {k for k in {*ours, *theirs} - {"plan_sha256"} if ours.get(k) != theirs.get(k)}
    assert differing == {"thresholds"}
    ours_limits, theirs_limits = ours["thresholds"], theirs["thresholds"]
    differing = {k for k in {*ours_limits, *theirs_limits} if ours_limits.get(k) != theirs_limits.get(k)}
    assert differing == {"exact_values_up_to_tokens"}
    before, after = theirs_limits["exact_values_up_to_tokens"], ours_limits["exact_values_up_to_tokens"]
    assert before < after
    # Either limit covers every size the plan sends: the same checks applied, yet another plan.
    assert all(size <= before for sizes in theirs["sizes"].values() for size in sizes)
    (left_out,) = report["tables"]["replays_not_pooled"]
    assert left_out["run_id"] == replay and left_out["replay_of"] == original
    assert left_out["differs"] == ["plan"] and left_out["hardware"] == left_out["original_hardware"]
    series = {tuple(c["runs"]) for c in report["tables"]["ttft_series"] if replay in c["runs"]}
    assert series == set()
