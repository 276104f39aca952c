"""Validation on clean and faulty sim; replay from the recorded source; byte-identical bodies."""

from __future__ import annotations

from pathlib import Path

import pytest

from .._cli import ledger_cli, param_args
from .conftest import SMALL, events, run_ids

SMALL_VALIDATION = {
    "size": 6000,
    "reverse_size": 2000,
    "session_size": 1500,
    "session_turns": 3,
    "turn_growth": 300,
    "warmup_tokens": 300,
}


def _validate(url: str, *extra: str) -> object:
    return ledger_cli(
        "run", "validation", "--db", url, "--no-progress", *param_args(SMALL_VALIDATION), *extra
    )


def test_validation_passes_on_clean_sim(sqlite_url: str) -> None:
    result = _validate(sqlite_url)
    assert result.exit_code == 0, result.output
    (rid,) = run_ids(sqlite_url)
    config = events(sqlite_url, "run.started", rid)[0].data["params"]["config_sha256"]
    checks = [e.data for e in events(sqlite_url, "assertion.evaluated", rid)]
    assert checks and all(c["passed"] and c["config_sha256"] == config for c in checks)
    names = {c["check"] for c in checks}
    assert {"exact_values", "zero_hits", "full_prefix_hit", "salt_control", "matches_cold_reference"} <= names
    launched = events(sqlite_url, "deployment.launched", rid)
    assert {e.data["config_sha256"] for e in launched} == {config}
    assert events(sqlite_url, "run.finished", rid)[0].data["status"] == "completed"


@pytest.mark.parametrize("fault", ["corrupt-transfer", "unordered-copy"])
def test_validation_fails_with_an_injected_transfer_fault(sqlite_url: str, fault: str) -> None:
    result = _validate(sqlite_url, "--param", f"sim_fault={fault}")
    assert result.exit_code == 1, result.output
    (rid,) = run_ids(sqlite_url)
    failed = {e.data["check"] for e in events(sqlite_url, "assertion.evaluated", rid) if not e.data["passed"]}
    assert {"exact_values", "matches_cold_reference"} <= failed
    finished = events(sqlite_url, "run.finished", rid)[0].data
    assert finished["status"] == "completed" and finished["failed_assertions"] > 0


def test_the_config_digest_tells_configurations_apart(sqlite_url: str) -> None:
    assert _validate(sqlite_url).exit_code == 0
    assert _validate(sqlite_url, "--param", "sim_fault=corrupt-transfer").exit_code == 1
    digests = [e.data["params"]["config_sha256"] for e in events(sqlite_url, "run.started")]
    assert len(set(digests)) == 2


def test_replay_sends_byte_identical_requests(sqlite_url: str) -> None:
    shape = {**SMALL, "sizes": [1000], "window_sessions": [2]}
    assert (
        ledger_cli("run", "screening", "--db", sqlite_url, "--no-progress", *param_args(shape)).exit_code == 0
    )
    (original,) = run_ids(sqlite_url)
    result = ledger_cli("replay", original, "--db", sqlite_url, "--no-progress")
    assert result.exit_code == 0, result.output
    assert "all matched" in result.output
    replayed = next(r for r in run_ids(sqlite_url) if r != original)
    assert events(sqlite_url, "run.started", replayed)[0].data["replay_of"] == original

    def bodies(rid: str) -> dict[str, str]:
        return {
            e.data["request_key"].split("/", 1)[1] + str(e.data["warmup"]): e.data["payload_sha256"]
            for e in events(sqlite_url, "request.sent", rid)
        }

    assert bodies(original) == bodies(replayed) and len(bodies(original)) > 20
    note = events(sqlite_url, "note.added", replayed)[0].data
    assert note["all_matched"] and note["matched"] == note["requests"]
    # The replay registered the same plan, field for field, before its first request.
    (plan,), (again,) = (events(sqlite_url, "plan.registered", rid) for rid in (original, replayed))
    assert (
        plan.data == again.data and note["plan_matched"] and note["plans"] == [plan.data["plan_sha256"]] * 2
    )
    first_request = events(sqlite_url, "request.sent", replayed)[0]
    assert again.seq < first_request.seq
    blocks = [e.data["arm"] for e in events(sqlite_url, "block.started", replayed)]
    assert again.data["order"] == blocks and again.data["seed"] == plan.data["seed"]


def test_replay_uses_the_recorded_source_not_the_current_file(sqlite_url: str, tmp_path: Path) -> None:
    script = tmp_path / "mine.py"
    text = (Path(__file__).resolve().parents[2] / "experiments/examples/hello.py").read_text()
    script.write_text(text)
    assert ledger_cli("run", str(script), "--db", sqlite_url, "--no-progress").exit_code == 0
    (original,) = run_ids(sqlite_url)
    script.write_text(text.replace('"size": 2000', '"size": 2500'))  # the file moves on
    result = ledger_cli("replay", original, "--db", sqlite_url, "--no-progress")
    assert result.exit_code == 0, result.output
    replayed = next(r for r in run_ids(sqlite_url) if r != original)
    assert events(sqlite_url, "run.started", replayed)[0].data["params"]["size"] == 2000


def test_replay_of_an_unknown_run_is_bad_usage(sqlite_url: str) -> None:
    result = ledger_cli("replay", "no-such-run", "--db", sqlite_url, "--no-progress")
    assert result.exit_code == 2 and "no-such-run" in result.output
