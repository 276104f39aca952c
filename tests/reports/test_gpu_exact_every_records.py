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

import json
from pathlib import Path
from typing import Any

import pytest

from experiments.needle import EXACT
from ledger import Event

from .._cli import ledger_cli
from . import _exact_studies as exact
from .conftest import import_export

STUDY = Path(__file__).resolve().parents[1] / "data" / "gpu-exact-every"
Record = tuple[str, list[Event]]


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Record:
    url = f"sqlite:///{tmp_path_factory.mktemp('gpu-exact-every') / 'ledger.db'}"
    return url, import_export(STUDY / "ledger.jsonl.xz", url)


def test_the_study_extends_the_imported_one_on_another_host(record: Record) -> None:
    runs = exact.assert_extends_the_imported_study_on_another_gpu(*record, "every")
    assert sorted(runs.values()) == ["needle_eval", "screening", "screening", "validation"]


def test_every_run_served_needle_exact_and_passed_every_check(record: Record) -> None:
    _, events = record
    exact.assert_served_needle_exact_and_passed_every_check(events, exact.asked_runs(events, "every"))


def test_each_fixture_asked_every_value_line_and_each_answer_is_kept_whole_and_exact(record: Record) -> None:
    _, events = record
    names_by_size = {
        fx["nominal_tokens"]: len(fx["expected"]) for fx, _ in exact.checked_answers(events, "every")
    }
    # The answers grow with the prompt: one name for each value line in it.
    sizes = sorted(names_by_size)
    assert sizes[-1] == 256000 and [names_by_size[s] for s in sizes] == sorted(names_by_size.values())
    assert names_by_size[256000] > 10 * names_by_size[8000]


def test_the_needle_evaluation_answered_every_line_exactly_at_every_size(record: Record) -> None:
    figures = exact.evaluation_figures(*record, "every")
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
    # Two ON blocks a screening, one reuse each a size; validation's two directional chains.
    assert exact.on_cross_replica_reuses(events, "every") == {
        ("screening", 8000): 2,
        ("screening", 65536): 2,
        ("screening", 128000): 2,
        ("validation", 128000): 1,
        ("validation", 32000): 1,
    }


def test_the_last_screening_alone_is_blocked_by_its_work_folders_config(record: Record) -> None:
    """Its ON config differs from the validated one in the engine site's path alone (env
    PYTHONPATH): another config, with no validation of its own. Every other run publishes."""
    url, events = record
    runs = exact.asked_runs(events, "every")
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
