"""needle-exact asked every line of a dense stream on a GPU (tests/data/gpu-exact-dense).

tests/data/gpu-exact-pooled's export imported on another H100, that host's probes recorded, then
runs that ask a dense stream's every value line and ``end_value`` (``asked_lines=dense``: a value
line every 10 lines, closer than LMCache's 256-token chunk): the needle evaluation to 131,072
tokens, a screening of the micro chains at 8,000 and 32,768 tokens, and validation (its long chain
at 128,000). Every claim below is derived from the committed export's events: what was asked, that
each fixture holds more asked lines than its prompt has chunks, that every answer was kept whole
and was exact, and the ON cross-replica reuses that answered every line from KV the LMCache service
loaded, where a wrong chunk anywhere in the shared prefix would have changed the answer.
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

STUDY = Path(__file__).resolve().parents[1] / "data" / "gpu-exact-dense"
IMPORTED = Path(__file__).resolve().parents[1] / "data" / "gpu-exact-pooled"
CHUNK = 256  # the LMCache service's chunk (STUDY.json's chunk_size, checked with every study)
Record = tuple[str, list[Event]]


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Record:
    url = f"sqlite:///{tmp_path_factory.mktemp('gpu-exact-dense') / 'ledger.db'}"
    return url, import_export(STUDY / "ledger.jsonl.xz", url)


def _dense_runs(events: list[Event]) -> dict[str, str]:
    """The runs that asked a dense stream's lines: run id → experiment."""
    return {
        str(e.run_id): e.data["experiment"]
        for e in events
        if e.kind == "run.started" and e.data["params"].get("asked_lines") == "dense"
    }


def test_the_study_extends_the_imported_one_on_another_gpu(record: Record) -> None:
    url, events = record
    imported = import_export(IMPORTED / "ledger.jsonl.xz", url.replace("ledger.db", "imported.db"))
    # The imported export, event for event, then this host's runs after it.
    assert [e.chain for e in events[: len(imported)]] == [e.chain for e in imported]
    runs = _dense_runs(events)
    assert sorted(runs.values()) == ["needle_eval", "screening", "validation"]
    new = {str(e.run_id) for e in events[len(imported) :] if e.kind == "run.started"}
    assert set(runs) < new  # the probes of this host besides
    here = set().union(*(replica_gpus(events, r) for r in runs))
    before = set().union(*(replica_gpus(events, str(e.run_id)) for e in imported if e.kind == "run.started"))
    assert len(here) == 1 and here.isdisjoint(before)


def test_every_dense_run_served_needle_exact_and_passed_every_check(record: Record) -> None:
    _, events = record
    expected = json.loads(EXACT.manifest.read_text())["files"]
    for run in _dense_runs(events):
        (audit,) = [e.data for e in events if e.kind == "checkpoint.audited" and e.run_id == run]
        assert audit["matched"] is True and {f["name"]: f["sha256"] for f in audit["files"]} == expected
        checks = [e.data for e in events if e.kind == "assertion.evaluated" and e.run_id == run]
        assert checks and all(c["passed"] for c in checks)
        assert any(c["check"] == "exact_values" for c in checks)
        (done,) = [e.data for e in events if e.kind == "run.finished" and e.run_id == run]
        assert done["status"] == "completed"


def test_each_fixture_asked_more_lines_than_its_prompt_has_chunks_and_each_answer_is_whole_and_exact(
    record: Record,
) -> None:
    _, events = record
    runs = _dense_runs(events)
    fixtures = {
        e.data["fixture_id"]: e.data for e in events if e.kind == "fixture.created" and e.run_id in runs
    }
    for fx in fixtures.values():
        assert fx["asked_lines"] == "dense"
        # Every value line of the dense stream among the fixture's lines, and end_value.
        every = fixture_text.marks(fx["lines"], fixture_text.DENSE_EVERY)
        assert sorted(fx["expected"]) == sorted([*every, "end_value"])
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
    sparse_by_size: dict[int, int] = {}  # what an every-line question asks of the same lines
    for request in checked:
        fx, response = fixtures[sent[request]["fixture_id"]], first[request]
        text = response["output_text_prefix"]
        assert hashlib.sha256(text.encode()).hexdigest() == response["text_sha256"]  # the whole answer
        assert json.loads(text) == fx["expected"] and len(json.loads(text)) == len(fx["expected"])
        room = fx["answer_tokens"] + fx["answer_tokens"] // 8 + 16
        assert sent[request]["params"]["max_tokens"] == max(run_max_tokens[sent[request]["run"]], room)
        assert response["output_tokens"] < room
        # More asked lines than whole chunks before the question: lines closer than a chunk.
        if fx["nominal_tokens"] >= 1000:
            assert len(fx["expected"]) > response["prompt_tokens"] // CHUNK, (request, fx["nominal_tokens"])
        names_by_size[fx["nominal_tokens"]] = len(fx["expected"])
        sparse_by_size[fx["nominal_tokens"]] = len(fixture_text.marks(fx["lines"])) + 1
    assert max(names_by_size) == 131072 and names_by_size[131072] > 700
    # Four times as many value lines as an every-line question asks of the same lines.
    assert all(names_by_size[s] >= 3 * sparse_by_size[s] for s in names_by_size if s >= 8000)


def test_the_needle_evaluation_answered_every_dense_line_exactly_and_the_card_cites_it(
    record: Record,
) -> None:
    url, events = record
    from ledger import open_ledger
    from reports import needle_figures

    (run,) = [r for r, name in _dense_runs(events).items() if name == "needle_eval"]
    led = open_ledger(url)
    try:
        figures = needle_figures(led, run)
    finally:
        led.close()
    assert sorted(figures["accuracy_by_size"], key=int) == ["1024", "8192", "32768", "65536", "131072"]
    assert set(figures["accuracy_by_size"].values()) == {1.0}
    card = json.loads(EXACT.card.read_text())
    cited = card["evaluations"]["vllm-gpu-dense"]
    assert cited["asks"] == "dense" and cited["run_id"] == run
    assert cited["accuracy_by_size"] == figures["accuracy_by_size"]
    assert card["dense_lines"]["served_max_tokens"] == 131072
    assert {card["dense_lines"]["source_by_size"][s] for s in ("65536", "131072")} == {"vllm-gpu-dense"}


def test_on_cross_replica_reuses_loaded_their_whole_prefix_and_answered_every_dense_line(
    record: Record,
) -> None:
    _, events = record
    runs = _dense_runs(events)
    arm = {e.block_id: e.data["arm"] for e in events if e.kind == "block.started"}
    sent = {e.data["request_id"]: e for e in events if e.kind == "request.sent" and e.run_id in runs}
    hits = {
        e.data["request_id"]: e.data for e in events if e.kind == "hits.observed" and e.data.get("request_id")
    }
    prompt = {e.data["request_id"]: e.data["prompt_tokens"] for e in events if e.kind == "response.received"}
    cross: dict[tuple[str, int], list[bool]] = defaultdict(list)
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
            cross[(runs[str(q.run_id)], q.data["nominal_tokens"])].append(e.data["passed"])
    # Two ON blocks in the screening, one reuse each a size; validation's two directional chains.
    assert {k: len(v) for k, v in cross.items()} == {
        ("screening", 8000): 2,
        ("screening", 32768): 2,
        ("validation", 128000): 1,
        ("validation", 32000): 1,
    }
    assert all(all(v) for v in cross.values())


def test_the_whole_export_publishes(record: Record) -> None:
    url, _ = record
    result = ledger_cli("audit", "--db", url, "--publish", "--json")
    findings = json.loads(result.output)["findings"]
    assert result.exit_code == 0 and not [f for f in findings if f["severity"] == "blocking"], findings
