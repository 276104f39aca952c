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

import json
from pathlib import Path

import pytest

from experiments import fixture_text
from experiments.needle import EXACT
from ledger import Event

from .._cli import ledger_cli
from . import _exact_studies as exact
from .conftest import import_export

STUDY = Path(__file__).resolve().parents[1] / "data" / "gpu-exact-dense"
Record = tuple[str, list[Event]]


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Record:
    url = f"sqlite:///{tmp_path_factory.mktemp('gpu-exact-dense') / 'ledger.db'}"
    return url, import_export(STUDY / "ledger.jsonl.xz", url)


def test_the_study_extends_the_imported_one_on_another_gpu(record: Record) -> None:
    runs = exact.assert_extends_the_imported_study_on_another_gpu(*record, "dense")
    assert sorted(runs.values()) == ["needle_eval", "screening", "validation"]


def test_every_dense_run_served_needle_exact_and_passed_every_check(record: Record) -> None:
    _, events = record
    exact.assert_served_needle_exact_and_passed_every_check(events, exact.asked_runs(events, "dense"))


def test_each_fixture_asked_more_lines_than_its_prompt_has_chunks_and_each_answer_is_whole_and_exact(
    record: Record,
) -> None:
    _, events = record
    names_by_size: dict[int, int] = {}
    sparse_by_size: dict[int, int] = {}  # what an every-line question asks of the same lines
    for fx, response in exact.checked_answers(events, "dense"):
        # More asked lines than whole chunks before the question: lines closer than a chunk.
        if fx["nominal_tokens"] >= 1000:
            assert len(fx["expected"]) > response["prompt_tokens"] // exact.CHUNK, fx["fixture_id"]
        names_by_size[fx["nominal_tokens"]] = len(fx["expected"])
        sparse_by_size[fx["nominal_tokens"]] = len(fixture_text.marks(fx["lines"])) + 1
    assert max(names_by_size) == 131072 and names_by_size[131072] > 700
    # Four times as many value lines as an every-line question asks of the same lines.
    assert all(names_by_size[s] >= 3 * sparse_by_size[s] for s in names_by_size if s >= 8000)


def test_the_needle_evaluation_answered_every_dense_line_exactly_and_the_card_cites_it(
    record: Record,
) -> None:
    figures = exact.evaluation_figures(*record, "dense")
    assert sorted(figures["accuracy_by_size"], key=int) == ["1024", "8192", "32768", "65536", "131072"]
    assert set(figures["accuracy_by_size"].values()) == {1.0}
    card = json.loads(EXACT.card.read_text())
    cited = card["evaluations"]["vllm-gpu-dense"]
    assert cited["asks"] == "dense" and cited["run_id"] == figures["run_id"]
    assert cited["accuracy_by_size"] == figures["accuracy_by_size"]
    assert card["dense_lines"]["served_max_tokens"] == 131072
    assert {card["dense_lines"]["source_by_size"][s] for s in ("65536", "131072")} == {"vllm-gpu-dense"}


def test_on_cross_replica_reuses_loaded_their_whole_prefix_and_answered_every_dense_line(
    record: Record,
) -> None:
    _, events = record
    # Two ON blocks in the screening, one reuse each a size; validation's two directional chains.
    assert exact.on_cross_replica_reuses(events, "dense") == {
        ("screening", 8000): 2,
        ("screening", 32768): 2,
        ("validation", 128000): 1,
        ("validation", 32000): 1,
    }


def test_the_whole_export_publishes(record: Record) -> None:
    url, _ = record
    result = ledger_cli("audit", "--db", url, "--publish", "--json")
    findings = json.loads(result.output)["findings"]
    assert result.exit_code == 0 and not [f for f in findings if f["severity"] == "blocking"], findings
