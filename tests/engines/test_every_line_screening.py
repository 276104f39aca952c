"""Every value line asked, end to end on real engines: micro chains OFF–ON–ON–OFF against the
``vllm`` target serving ``needle-exact``, with ``asked_lines=every`` and nothing else declared.

The card decides where the checks apply (its every-line evaluations, not an override), the ON
cross-replica reuses answer every value line from KV the LMCache service loaded, and the audit
reads each kept answer itself. Everything is asserted from the ledger the run wrote.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from experiments import fixture_text, needle
from reports import open_source

from .._cli import ledger_cli, param_args
from ._runs import RecordedRun, recorded

pytestmark = pytest.mark.engines

CHUNK = 256
SHAPE: dict[str, Any] = {
    "block_pairs": 2,
    "workloads": ["micro"],
    "sizes": [2000],
    "chains": 1,
    "warmups": 1,
    "warmup_tokens": 300,
    "model": "needle-exact",
    "asked_lines": "every",
}


@pytest.fixture(scope="module")
def run(engines: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordedRun]:
    url = f"sqlite:///{tmp_path_factory.mktemp('every-line-screening') / 'ledger.db'}"
    result = ledger_cli(
        "run", "screening", "--target", "vllm", "--db", url, "--no-progress", *param_args(SHAPE)
    )
    print(f"\nscreening, every line asked, on vllm: exit {result.exit_code}\n{result.output}")
    yield recorded(url, result)


def test_the_cards_every_line_limit_decides_where_the_checks_apply(run: RecordedRun) -> None:
    assert run.exit_code == 0, run.output
    (note,) = run.of("note.added")
    limit = needle.EXACT.load_card().every_line_max_tokens
    assert limit is not None and note.data["meaningful_up_to_tokens"] == limit
    assert "cites every-line evaluations" in note.data["text"]
    (plan,) = run.of("plan.registered")
    assert plan.data["thresholds"]["asked_lines"] == "every"
    assert plan.data["thresholds"]["exact_values_up_to_tokens"] == limit


def test_on_cross_replica_reuses_answer_every_value_line_from_the_loaded_kv(run: RecordedRun) -> None:
    checks = [a.data for a in run.of("assertion.evaluated")]
    assert checks and all(c["passed"] for c in checks), [c for c in checks if not c["passed"]][:3]
    arm = {e.block_id: e.data["arm"] for e in run.of("block.started")}
    sent = {e.data["request_id"]: e for e in run.of("request.sent") if not e.data["warmup"]}
    fixtures = {e.data["fixture_id"]: e.data for e in run.of("fixture.created")}
    hits = {e.data["request_id"]: e.data for e in run.of("hits.observed") if e.data.get("request_id")}
    first: dict[str, dict[str, Any]] = {}
    for e in run.of("response.received"):
        first.setdefault(e.data["request_id"], e.data)
    exact = [c for c in checks if c["check"] == "exact_values"]
    on_cross = [
        c
        for c in exact
        if sent[c["request_id"]].data["step"] == "cross" and arm[sent[c["request_id"]].block_id] == "ON"
    ]
    assert len(on_cross) == 2  # one a block, two ON blocks
    for c in on_cross:
        request = c["request_id"]
        fx, response = fixtures[sent[request].data["fixture_id"]], first[request]
        assert sorted(fx["expected"]) == sorted([*fixture_text.marks(fx["lines"]), "end_value"])
        assert len(fx["expected"]) > 3  # more than the seed's question asks
        shareable = (response["prompt_tokens"] - 1) // CHUNK * CHUNK
        assert hits[request]["external_hit_tokens"] == shareable > 0
        text = response["output_text_prefix"]
        assert hashlib.sha256(text.encode()).hexdigest() == response["text_sha256"]
        assert json.loads(text) == fx["expected"]


def test_the_audit_reads_each_kept_answer_itself(run: RecordedRun, tmp_path: Any) -> None:
    from ledger import open_ledger

    led = open_ledger(run.url)
    src = open_source(led, tmp_path / "snap", verify=True)
    try:
        src.rederive()
        rows = src.tuples(
            """SELECT answer_text IS NOT NULL, recorded_passed, derived_passed FROM kv_rederived
               WHERE "check" = 'exact_values'"""
        )
    finally:
        src.close()
        led.close()
    assert rows and all(whole and recorded and derived for whole, recorded, derived in rows)
