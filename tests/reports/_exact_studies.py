"""Claims shared by the GPU studies whose runs ask longer questions of ``needle-exact``.

``tests/data/gpu-exact-every`` (``asked_lines=every``) and ``tests/data/gpu-exact-dense``
(``asked_lines=dense``) each import ``tests/data/gpu-exact-pooled``'s export, then run the needle
evaluation, screenings and validation asking every value line of their stream. Each function here
derives one claim from a study's events, for either question.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from experiments import fixture_text
from experiments.needle import EXACT
from ledger import Event, open_ledger
from reports import needle_figures

from .conftest import import_export, replica_gpus

DATA = Path(__file__).resolve().parents[1] / "data"
IMPORTED = DATA / "gpu-exact-pooled"
CHUNK = 256  # the LMCache service's chunk (each STUDY.json's chunk_size, checked with every study)


def asked_runs(events: list[Event], asked: str) -> dict[str, str]:
    """The runs that asked ``asked`` lines: run id → experiment."""
    return {
        str(e.run_id): e.data["experiment"]
        for e in events
        if e.kind == "run.started" and e.data["params"].get("asked_lines") == asked
    }


def assert_extends_the_imported_study_on_another_gpu(
    url: str, events: list[Event], asked: str
) -> dict[str, str]:
    """The imported export, event for event, then this host's runs after it, on one GPU that
    none of the imported runs used; the runs that asked ``asked`` lines."""
    imported = import_export(IMPORTED / "ledger.jsonl.xz", url.replace("ledger.db", "imported.db"))
    assert [e.chain for e in events[: len(imported)]] == [e.chain for e in imported]
    runs = asked_runs(events, asked)
    new = {str(e.run_id) for e in events[len(imported) :] if e.kind == "run.started"}
    assert set(runs) < new  # the probes of this host besides
    here = set().union(*(replica_gpus(events, r) for r in runs))
    before = set().union(*(replica_gpus(events, str(e.run_id)) for e in imported if e.kind == "run.started"))
    assert len(here) == 1 and here.isdisjoint(before)
    return runs


def assert_served_needle_exact_and_passed_every_check(events: list[Event], runs: dict[str, str]) -> None:
    expected = json.loads(EXACT.manifest.read_text())["files"]
    for run in runs:
        (audit,) = [e.data for e in events if e.kind == "checkpoint.audited" and e.run_id == run]
        assert audit["matched"] is True and {f["name"]: f["sha256"] for f in audit["files"]} == expected
        checks = [e.data for e in events if e.kind == "assertion.evaluated" and e.run_id == run]
        assert checks and all(c["passed"] for c in checks)
        assert any(c["check"] == "exact_values" for c in checks)
        (done,) = [e.data for e in events if e.kind == "run.finished" and e.run_id == run]
        assert done["status"] == "completed"


def checked_answers(events: list[Event], asked: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each exact-value check's (fixture, first response), after holding the fixture to its
    question (every value line of its stream and ``end_value``) and the response to the whole,
    exact answer in the room the request gave it."""
    runs = asked_runs(events, asked)
    fixtures = {
        e.data["fixture_id"]: e.data for e in events if e.kind == "fixture.created" and e.run_id in runs
    }
    for fx in fixtures.values():
        assert fx["asked_lines"] == asked
        every = fixture_text.marks(fx["lines"], fixture_text.marks_every(asked))
        assert sorted(fx["expected"]) == sorted([*every, "end_value"])  # the event keeps keys sorted
    sent = {
        e.data["request_id"]: {**e.data, "run": e.run_id}
        for e in events
        if e.kind == "request.sent" and e.run_id in runs
    }
    run_max_tokens = {e.run_id: e.data["params"].get("max_tokens") for e in events if e.kind == "run.started"}
    first: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.kind == "response.received" and e.data["request_id"] in sent:
            first.setdefault(e.data["request_id"], e.data)
    checked = [
        e.data["request_id"]
        for e in events
        if e.kind == "assertion.evaluated" and e.run_id in runs and e.data["check"] == "exact_values"
    ]
    assert checked
    answers = []
    for request in checked:
        fx, response = fixtures[sent[request]["fixture_id"]], first[request]
        text = response["output_text_prefix"]
        assert hashlib.sha256(text.encode()).hexdigest() == response["text_sha256"]  # the whole answer
        assert json.loads(text) == fx["expected"] and len(json.loads(text)) == len(fx["expected"])
        room = fx["answer_tokens"] + fx["answer_tokens"] // 8 + 16
        # The answer's room, or the run's own max_tokens where that is more.
        assert sent[request]["params"]["max_tokens"] == max(run_max_tokens[sent[request]["run"]], room)
        assert response["output_tokens"] < room
        answers.append((fx, response))
    return answers


def evaluation_figures(url: str, events: list[Event], asked: str) -> dict[str, Any]:
    """The figures of the study's needle evaluation that asked ``asked`` lines."""
    (run,) = [r for r, name in asked_runs(events, asked).items() if name == "needle_eval"]
    led = open_ledger(url)
    try:
        return {**needle_figures(led, run), "run_id": run}
    finally:
        led.close()


def on_cross_replica_reuses(events: list[Event], asked: str) -> dict[tuple[str, int], int]:
    """How many measured ON cross-replica reuses, by (experiment, nominal size), after holding each
    to the whole shared prefix loaded through the connector and to an exact answer."""
    runs = asked_runs(events, asked)
    arm = {e.block_id: e.data["arm"] for e in events if e.kind == "block.started"}
    sent = {e.data["request_id"]: e for e in events if e.kind == "request.sent" and e.run_id in runs}
    hits = {
        e.data["request_id"]: e.data for e in events if e.kind == "hits.observed" and e.data.get("request_id")
    }
    prompt = {e.data["request_id"]: e.data["prompt_tokens"] for e in events if e.kind == "response.received"}
    cross: dict[tuple[str, int], int] = defaultdict(int)
    for e in events:
        if (
            e.kind != "assertion.evaluated"
            or e.data["check"] != "exact_values"
            or e.data["request_id"] not in sent
        ):
            continue
        q = sent[e.data["request_id"]]
        if q.data["step"] == "cross" and arm[q.block_id] == "ON" and not q.data["warmup"]:
            request = q.data["request_id"]
            assert hits[request]["external_hit_tokens"] >= prompt[request] - CHUNK  # the whole shared prefix
            assert e.data["passed"], request
            cross[(runs[str(q.run_id)], q.data["nominal_tokens"])] += 1
    return dict(cross)
