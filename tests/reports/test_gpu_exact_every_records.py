"""needle-exact asked every value line on a GPU (tests/data/gpu-exact-every).

tests/data/gpu-exact-pooled's export imported on another H100, that host's probes recorded, then
runs that ask every value line and ``end_value`` (``asked_lines=every``): the needle evaluation to
256,000 tokens, a screening of the micro chains at 8,000 and 65,536 tokens, validation, and a
second screening at 128,000 tokens from a second work folder. Every claim below is derived from
the committed export's events: what was asked, that every answer was kept whole and was exact, the
ON cross-replica reuses that answered every value line from KV the LMCache service loaded, and why
the last screening alone does not publish.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from experiments import fixture_text
from experiments.needle import EXACT
from ledger import Event

from .._cli import ledger_cli
from .conftest import import_export, replica_gpus

STUDY = Path(__file__).resolve().parents[1] / "data" / "gpu-exact-every"
IMPORTED = Path(__file__).resolve().parents[1] / "data" / "gpu-exact-pooled"
Record = tuple[str, list[Event]]


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Record:
    url = f"sqlite:///{tmp_path_factory.mktemp('gpu-exact-every') / 'ledger.db'}"
    return url, import_export(STUDY / "ledger.jsonl.xz", url)


def _every_runs(events: list[Event]) -> dict[str, str]:
    """The runs that asked every value line: run id → experiment."""
    return {
        str(e.run_id): e.data["experiment"]
        for e in events
        if e.kind == "run.started" and e.data["params"].get("asked_lines") == "every"
    }


def test_the_study_extends_the_imported_one_on_another_host(record: Record) -> None:
    url, events = record
    imported = import_export(IMPORTED / "ledger.jsonl.xz", url.replace("ledger.db", "imported.db"))
    # The imported export, event for event, then this host's runs after it.
    assert [e.chain for e in events[: len(imported)]] == [e.chain for e in imported]
    runs = _every_runs(events)
    assert sorted(runs.values()) == ["needle_eval", "screening", "screening", "validation"]
    new = {str(e.run_id) for e in events[len(imported) :] if e.kind == "run.started"}
    assert set(runs) < new  # the probes of this host besides
    here = set().union(*(replica_gpus(events, r) for r in runs))
    before = set().union(*(replica_gpus(events, str(e.run_id)) for e in imported if e.kind == "run.started"))
    assert len(here) == 1 and here.isdisjoint(before)


def test_every_run_served_needle_exact_and_passed_every_check(record: Record) -> None:
    _, events = record
    expected = json.loads(EXACT.manifest.read_text())["files"]
    for run in _every_runs(events):
        (audit,) = [e.data for e in events if e.kind == "checkpoint.audited" and e.run_id == run]
        assert audit["matched"] is True and {f["name"]: f["sha256"] for f in audit["files"]} == expected
        checks = [e.data for e in events if e.kind == "assertion.evaluated" and e.run_id == run]
        assert checks and all(c["passed"] for c in checks)
        assert any(c["check"] == "exact_values" for c in checks)
        (done,) = [e.data for e in events if e.kind == "run.finished" and e.run_id == run]
        assert done["status"] == "completed"


def test_each_fixture_asked_every_value_line_and_each_answer_is_kept_whole_and_exact(record: Record) -> None:
    _, events = record
    runs = _every_runs(events)
    fixtures = {
        e.data["fixture_id"]: e.data for e in events if e.kind == "fixture.created" and e.run_id in runs
    }
    for fx in fixtures.values():
        assert fx["asked_lines"] == "every"
        # Every value line among the fixture's lines, and end_value (the event keeps keys sorted).
        assert sorted(fx["expected"]) == sorted([*fixture_text.marks(fx["lines"]), "end_value"])
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
    names_by_size: dict[int, int] = {}
    for request in checked:
        fx, response = fixtures[sent[request]["fixture_id"]], first[request]
        text = response["output_text_prefix"]
        assert hashlib.sha256(text.encode()).hexdigest() == response["text_sha256"]  # the whole answer
        assert json.loads(text) == fx["expected"] and len(json.loads(text)) == len(fx["expected"])
        room = fx["answer_tokens"] + fx["answer_tokens"] // 8 + 16
        # The answer's room, or the run's own max_tokens where that is more.
        assert sent[request]["params"]["max_tokens"] == max(run_max_tokens[sent[request]["run"]], room)
        assert response["output_tokens"] < room
        names_by_size[fx["nominal_tokens"]] = len(fx["expected"])
    # The answers grow with the prompt: one name for each value line in it.
    sizes = sorted(names_by_size)
    assert sizes[-1] == 256000 and [names_by_size[s] for s in sizes] == sorted(names_by_size.values())
    assert names_by_size[256000] > 10 * names_by_size[8000]


def test_the_needle_evaluation_answered_every_line_exactly_at_every_size(record: Record) -> None:
    url, events = record
    from ledger import open_ledger
    from reports import needle_figures

    (run,) = [r for r, name in _every_runs(events).items() if name == "needle_eval"]
    led = open_ledger(url)
    try:
        figures = needle_figures(led, run)
    finally:
        led.close()
    assert sorted(figures["accuracy_by_size"], key=int) == [
        "1024",
        "8192",
        "32768",
        "65536",
        "131072",
        "256000",
    ]
    assert set(figures["accuracy_by_size"].values()) == {1.0}
    card = json.loads(EXACT.card.read_text())
    assert card["evaluations"]["vllm-gpu-every"]["accuracy_by_size"] == figures["accuracy_by_size"]
    assert card["every_line"]["served_max_tokens"] == 256000


def test_on_cross_replica_reuses_loaded_their_prefix_and_answered_every_line(record: Record) -> None:
    _, events = record
    screenings = [r for r, name in _every_runs(events).items() if name == "screening"]
    arm = {e.block_id: e.data["arm"] for e in events if e.kind == "block.started"}
    sent = {e.data["request_id"]: e for e in events if e.kind == "request.sent" and e.run_id in screenings}
    hits = {
        e.data["request_id"]: e.data for e in events if e.kind == "hits.observed" and e.data.get("request_id")
    }
    prompt = {e.data["request_id"]: e.data["prompt_tokens"] for e in events if e.kind == "response.received"}
    cross: dict[int, list[bool]] = defaultdict(list)
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
            assert hits[request]["external_hit_tokens"] >= prompt[request] - 256  # the whole shared prefix
            cross[q.data["nominal_tokens"]].append(e.data["passed"])
    # Two ON blocks a screening, one cross-replica reuse each, every one exact.
    assert {size: len(v) for size, v in cross.items()} == {8000: 2, 65536: 2, 128000: 2}
    assert all(all(v) for v in cross.values())


def test_the_last_screening_alone_is_blocked_by_its_work_folders_config(record: Record) -> None:
    """Its ON config differs from the validated one in the engine site's path alone (env
    PYTHONPATH): another config, with no validation of its own. Every other run publishes."""
    url, events = record
    runs = _every_runs(events)
    configs: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.kind == "deployment.launched" and e.run_id in runs and e.data["arm"] == "ON":
            configs.setdefault(str(e.run_id), e.data["config"])
    by_digest = {json.dumps(c, sort_keys=True) for c in configs.values()}
    assert len(by_digest) == 2
    first, last = (configs[r] for r in (min(configs), max(configs)))
    differing = {k for k in first.keys() | last.keys() if first.get(k) != last.get(k)}
    env = {k for k in first["env"].keys() | last["env"].keys() if first["env"].get(k) != last["env"].get(k)}
    assert differing == {"env"} and env == {"PYTHONPATH"}
    for run in runs:
        result = ledger_cli("audit", "--db", url, "--run", run, "--publish", "--json")
        findings = json.loads(result.output)["findings"]
        blocking = {f["code"] for f in findings if f["severity"] == "blocking"}
        assert blocking == ({"validation-missing"} if run == max(configs) else set()), (run, blocking)
        assert result.exit_code == (1 if blocking else 0)
