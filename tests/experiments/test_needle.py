"""The needle model's files: streams disjoint from the experiments', a checkpoint that
matches its manifest, a card that says what it serves. (Serving it: tests/engines.)"""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from collectors._checkpoint import audit_checkpoint
from experiments import fixture_text
from experiments._context import RunContext
from experiments.needle import CARD, CHECKPOINT, EXACT, MANIFEST, data, load_card


@pytest.mark.parametrize("seed", [0, 1, 7, 123456789, -3])
def test_training_and_evaluation_streams_are_disjoint_from_every_experiment_stream(seed: int) -> None:
    # Experiments name streams RunContext.fixture_key(...): the run's integer seed, then parts.
    ctx = SimpleNamespace(seed=seed)
    experiment_keys = {
        RunContext.fixture_key(ctx, *parts)
        for parts in [("micro", 0), ("session", 1500, "fixed", 0), ("warmup", 0), ("needle-train", 1)]  # type: ignore[arg-type]
    }
    for key in experiment_keys:
        int(key.split(":", 1)[0])  # an experiment key always starts with the seed
    ours = {data.train_key("long/1/0", 0), data.train_key(f"{seed}", 3), data.eval_key(1024, seed)}
    for key in ours:
        assert key.startswith((data.TRAIN_PREFIX, data.EVAL_PREFIX))
        with pytest.raises(ValueError):
            int(key.split(":", 1)[0])
    assert not experiment_keys & ours
    # Distinct keys are distinct streams: the values planted differ.
    assert fixture_text.value(data.train_key("x", 0), "value_000") != fixture_text.value(
        RunContext.fixture_key(ctx, "x", 0), "value_000"
    )  # type: ignore[arg-type]


def test_the_committed_checkpoint_matches_its_manifest_and_fits_the_size_limit() -> None:
    audit = audit_checkpoint(CHECKPOINT, "needle", MANIFEST)
    assert audit.matched is True, [f for f in audit.files if f.sha256 != f.expected_sha256]
    names = {f.name for f in audit.files}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    weights = next(f for f in audit.files if f.name == "model.safetensors")
    assert weights.bytes <= 25 * 10**6
    config = json.loads((CHECKPOINT / "config.json").read_text())
    # Other loaders read a top-level rope_theta and would silently fall back to 10000.
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]
    assert json.loads((CHECKPOINT / "tokenizer_config.json").read_text())["chat_template"]


def test_a_changed_checkpoint_file_no_longer_matches(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for f in CHECKPOINT.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = tmp_path / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 1e-06'))
    audit = audit_checkpoint(tmp_path, "needle", MANIFEST)
    assert audit.matched is False
    assert [f.name for f in audit.files if f.sha256 != f.expected_sha256] == ["config.json"]


def test_the_card_serves_only_sizes_measured_at_or_above_its_threshold() -> None:
    card = load_card(CARD)
    served = {n: a for n, a in card.accuracy_by_size.items() if n <= card.served_max_tokens}
    assert served and all(a >= card.threshold for a in served.values())
    assert card.served_max_tokens in card.accuracy_by_size
    assert all((card.min_margin_by_size[n] or 0.0) > 0 for n in served)
    # The first size above the limit is measured and below the threshold: the limit is not arbitrary.
    above = sorted(n for n in card.accuracy_by_size if n > card.served_max_tokens)
    assert not above or card.accuracy_by_size[above[0]] < card.threshold
    assert card.serves(card.served_max_tokens) and not card.serves(card.served_max_tokens + 1)
    assert not card.serves(None)


RECORDS = CHECKPOINT.parent / "records"


@pytest.mark.parametrize(
    ("card_path", "manifest_path", "engine"),
    [
        (CARD, MANIFEST, "vllm-gpu"),
        (CARD, MANIFEST, "vllm-cpu"),
        (CARD, MANIFEST, "vllm-cpu-32k"),
        # Checkpoints served before this one (`long`, `hold-3`, then `hold-4`): their cards and
        # manifests are kept beside the evaluation runs that made them.
        (RECORDS / "hold-4.card.json", RECORDS / "hold-4.MANIFEST.sha256.json", "vllm-gpu"),
        (RECORDS / "hold-4.card.json", RECORDS / "hold-4.MANIFEST.sha256.json", "vllm-cpu"),
        (RECORDS / "hold-3.card.json", RECORDS / "hold-3.MANIFEST.sha256.json", "vllm-cpu"),
        (RECORDS / "hold-3.card.json", RECORDS / "hold-3.MANIFEST.sha256.json", "vllm-cpu-32k"),
        (RECORDS / "long.card.json", RECORDS / "long.MANIFEST.sha256.json", "vllm-cpu"),
        (RECORDS / "long.card.json", RECORDS / "long.MANIFEST.sha256.json", "vllm-gpu"),
        # The constructed checkpoint's card (experiments/needle/construct.py).
        (EXACT.card, EXACT.manifest, "vllm-gpu"),
        (EXACT.card, EXACT.manifest, "vllm-cpu"),
    ],
    ids=[
        "committed-vllm-gpu",
        "committed-vllm-cpu",
        "committed-vllm-cpu-32k",
        "hold-4-vllm-gpu",
        "hold-4-vllm-cpu",
        "hold-3-vllm-cpu",
        "hold-3-vllm-cpu-32k",
        "long-vllm-cpu",
        "long-vllm-gpu",
        "exact-vllm-gpu",
        "exact-vllm-cpu",
    ],
)
def test_the_cards_vllm_figures_are_derived_from_the_committed_evaluation_run(  # type: ignore[no-untyped-def]
    tmp_path, card_path, manifest_path, engine
) -> None:
    """A card's figures come from recorded needle_eval runs on vLLM (the CPU engine; H200s):
    each export, imported into an empty ledger, verifies and gives the same figures again, and
    the checkpoint it evaluated is the one that card's manifest names."""
    from ledger import open_ledger, verify_ledger
    from reports import needle_figures as figures
    from tests._cli import ledger_cli

    card = json.loads(card_path.read_text())
    record = card["evaluations"][engine]
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    result = ledger_cli("import", str(CARD.parent / record["record"]), "--db", url)
    assert result.exit_code == 0, result.output
    led = open_ledger(url)
    try:
        assert verify_ledger(led).ok
        # The run the card names (an export may hold an earlier attempt that failed to start).
        (started,) = [e for e in led.events(kind="run.started") if e.run_id == record["run_id"]]
        assert started.data["experiment"] == "needle_eval"
        assert started.data["params"]["target"] == "vllm"
        (audit,) = list(led.events(run_id=record["run_id"], kind="checkpoint.audited"))
        got = figures(led, record["run_id"])
    finally:
        led.close()
    assert audit.data["matched"] is True  # the evaluated checkpoint is the card's own
    expected = json.loads(manifest_path.read_text())["files"]
    assert {f["name"]: f["sha256"] for f in audit.data["files"]} == expected
    assert {k: record[k] for k in got if k in record} == {k: got[k] for k in got if k in record}
    for size, acc in got["accuracy_by_size"].items():
        if card["source_by_size"][size] != engine:
            continue  # measured by an evaluation the card trusts first
        assert card["accuracy_by_size"][size] == acc and card["n_by_size"][size] == got["n_by_size"][size]
        assert card["min_margin_by_size"][size] == got["min_margin_by_size"][size]
    if card_path == CARD:  # the committed card serves a size only where every engine did
        for size, acc in got["accuracy_by_size"].items():
            assert card["accuracy_by_size"][size] <= acc, size


def _exact_cell(got: dict[str, Any]) -> str:
    """An in-process evaluation's exact cell: counts where a percentage could round a miss to
    "100 %" (200 fixtures or more), else the rounded percentage."""
    return f"{round(100 * got['accuracy'])} %" if got["n"] < 200 else f"{got['exact']}/{got['n']}"


def _records_row(run: str) -> list[str]:
    readme = (CHECKPOINT.parent / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith(f"| `{run}` |")]
    assert len(rows) == 1, run
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


@pytest.mark.parametrize(
    ("run", "sizes"),
    [
        ("extend", {"3072": 5, "4096": 6, "8192": 7, "16384": 8, "32768": 9}),
        ("extend-8k", {"4096": 6, "8192": 7, "16384": 8}),
        ("reach-1", {"4096": 5, "8192": 6, "16384": 8, "32768": 9}),
        ("reach-2", {"8192": 6, "11585": 7, "16384": 8, "32768": 9}),
        ("reach-3", {"8192": 6, "11585": 7, "16384": 8, "32768": 9}),
        ("reach-4", {"2048": 5, "8192": 6, "16384": 7, "32768": 8}),
        ("reach-4b", {"2048": 5, "8192": 6, "16384": 7, "32768": 8}),
        ("reach-5a", {"2048": 5, "8192": 6, "16384": 7, "32768": 8}),
        ("reach-5b", {"2048": 5, "8192": 6, "16384": 7, "32768": 8}),
        ("hold-1", {"2048": 6, "3072": 7, "8192": 8, "32768": 10}),
        ("hold-2", {"1024": 5, "2048": 6, "3072": 7, "8192": 8, "32768": 10}),
        ("hold-3", {"1024": 5, "2048": 6, "3072": 7, "8192": 8, "16384": 9, "32768": 10}),
        ("hold-4", {"1024": 5, "2048": 6, "3072": 7, "8192": 8, "16384": 9, "32768": 10}),
        ("hold-5a", {"1024": 5, "2048": 6, "3072": 7, "8192": 8, "16384": 9, "32768": 10}),
        ("hold-5b", {"1024": 5, "2048": 6, "3072": 7, "8192": 8, "16384": 9, "32768": 10}),
        ("hold-6", {"1024": 5, "2048": 6, "3072": 7, "8192": 8, "16384": 9, "32768": 10}),
    ],
)
def test_the_cards_continuation_table_is_derived_from_its_records(run: str, sizes: dict[str, int]) -> None:
    evaluation = json.loads((RECORDS / f"{run}.eval.json").read_text())
    done = [
        json.loads(line)["done"]
        for line in (RECORDS / f"{run}.train.log").read_text().splitlines()
        if '"done"' in line
    ]
    # hold-4's evaluation ran apart from its training (train.py --eval-only): "trained" is the
    # training record its checkpoint carries.
    assert done == [evaluation.get("training", evaluation.get("trained"))]
    row = _records_row(run)
    assert row[2] == f"{done[0]['steps']:,}"
    assert row[3] == f"{round(done[0]['train_seconds'])}"
    assert row[4] == f"{done[0]['frontier']:,}"
    for size, column in sizes.items():
        got = evaluation["eval"][size]
        assert row[column] == _exact_cell(got), (run, size)
    # Columns of sizes this run did not evaluate are marked as such, never left looking measured.
    measured = set(sizes.values())
    assert all(row[c] == "—" for c in range(5, len(row)) if c not in measured), row


def test_the_committed_weights_are_hold_6s() -> None:
    """The served checkpoint holds the weights the last continuation wrote, as its records name
    them: its training log's last record, and the evaluation made of exactly these weights."""
    trained = json.loads((CHECKPOINT / "config.json").read_text())["needle_training"]
    evaluation = json.loads((RECORDS / "hold-6.eval.json").read_text())
    assert trained == evaluation["training"]
    log = (RECORDS / "hold-6.train.log").read_text().splitlines()
    assert [json.loads(line)["done"] for line in log if '"done"' in line] == [trained]
    assert json.loads(MANIFEST.read_text())["variant"] == trained["variant"] == "hold"
    assert trained["frontier"] == 40960  # trained past the largest size it is asked to serve
    # It went on from hold-5a's weights (not committed), which went on from hold-4's.
    hold_5a = json.loads((RECORDS / "hold-5a.eval.json").read_text())["training"]
    assert hold_5a["init"] == "experiments/needle/checkpoint"
    previous = json.loads((RECORDS / "hold-4.MANIFEST.sha256.json").read_text())["files"]
    assert previous["model.safetensors"] != json.loads(MANIFEST.read_text())["files"]["model.safetensors"]


def test_hold_3s_32k_misses_on_the_engine_are_the_models_own(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The recorded in-process recheck scored the very prompts of the vLLM 32k run: fixture for
    fixture (by id), the weights were right where the engine was right and wrong where it was
    wrong, so the engine's misses are the model's, not the engine's numerics or cache."""
    import lzma

    recheck = json.loads((RECORDS / "hold-3.recheck-32k.json").read_text())
    hold_3 = json.loads((RECORDS / "hold-3.MANIFEST.sha256.json").read_text())
    assert recheck["weights_sha256"] == hold_3["files"]["model.safetensors"]
    with lzma.open(RECORDS / "hold-3.vllm-cpu-eval-32k.jsonl.xz", "rt") as lines:
        events = [json.loads(line) for line in lines]
    fixture_of = {
        e["data"]["request_id"]: e["data"]["fixture_id"]
        for e in events
        if e["kind"] == "request.sent" and not e["data"]["warmup"]
    }
    payload_of = {
        e["data"]["fixture_id"]: e["data"]["payload_sha256"] for e in events if e["kind"] == "fixture.created"
    }
    engine_exact = {
        fixture_of[e["data"]["request_id"]]: e["data"]["passed"]
        for e in events
        if e["kind"] == "assertion.evaluated" and e["data"]["check"] == "exact_values"
    }
    assert sorted(engine_exact.values()).count(False) == 2  # the card's 14 of 16
    rows = recheck["fixtures"]
    assert {r["fixture_id"] for r in rows if not engine_exact[r["fixture_id"]]} == {
        f for f, ok in engine_exact.items() if not ok
    }  # every engine miss was rechecked, and at least one engine hit beside them
    assert any(engine_exact[r["fixture_id"]] for r in rows)
    for r in rows:
        assert r["payload_sha256"] == payload_of[r["fixture_id"]]  # the very messages the engine got
        assert r["exact"] == engine_exact[r["fixture_id"]], r
        assert r["prompt_tokens"] == 32768 and (r["min_margin"] > 0) == r["exact"]


def test_a_card_serves_a_size_only_where_every_engine_measured_it_at_the_threshold(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Engine evaluations decide the sizes they measured, each by the engine that did worst there;
    in-process figures only fill in sizes no engine measured."""
    from experiments.needle import write_card

    def ev(acc: dict[str, float], margin: dict[str, float]) -> dict[str, Any]:
        return {"accuracy_by_size": acc, "min_margin_by_size": margin, "n_by_size": dict.fromkeys(acc, 8)}

    card = write_card(
        {
            "vllm-gpu": ev({"1024": 1.0, "2048": 1.0, "4096": 1.0}, {"1024": 5.0, "2048": 3.0, "4096": 2.0}),
            "vllm-cpu": ev(
                {"1024": 1.0, "2048": 1.0, "4096": 0.875}, {"1024": 4.0, "2048": 6.0, "4096": -1.0}
            ),
            "in-process": ev(
                {"2048": 0.5, "8192": 1.0, "16384": 0.5}, {"2048": -3.0, "8192": 1.0, "16384": -2.0}
            ),
        },
        path=tmp_path / "card.json",
    )
    assert card["source_by_size"] == {
        "1024": "vllm-cpu",  # both exact: the lower margin
        "2048": "vllm-gpu",  # both exact, GPU's margin lower; in process measured it, but engines decide
        "4096": "vllm-cpu",  # the CPU engine missed one
        "8192": "in-process",  # no engine measured it
        "16384": "in-process",
    }
    assert card["accuracy_by_size"]["4096"] == 0.875 and card["min_margin_by_size"]["1024"] == 4.0
    assert card["served_max_tokens"] == 2048  # 4096 is below the threshold on one engine
    assert json.loads((tmp_path / "card.json").read_text()) == card


def test_every_line_and_dense_evaluations_decide_their_own_card_part_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Evaluations that asked every value line decide ``every_line``, those that asked dense ones
    ``dense_lines``, by the same rules, and leave the card's own figures (the seed's question) and
    each other's as the others give them; a run asking either takes that limit, 0 where the card
    cites none."""
    from experiments._context import exact_values_limit
    from experiments.needle import load_card, write_card

    def ev(acc: dict[str, float], asks: str | None = None) -> dict[str, Any]:
        out = {
            "accuracy_by_size": acc,
            "min_margin_by_size": dict.fromkeys(acc, 5.0),
            "n_by_size": dict.fromkeys(acc, 8),
        }
        return out if asks is None else {**out, "asks": asks}

    spot_only = {"vllm-gpu": ev({"1024": 1.0, "8192": 1.0, "32768": 1.0})}
    before = write_card(spot_only, path=tmp_path / "before.json")
    card = write_card(
        {
            **spot_only,
            "vllm-gpu-every": ev({"1024": 1.0, "8192": 1.0, "32768": 0.5}, "every"),
            "vllm-cpu-every": ev({"1024": 1.0, "8192": 1.0}, "every"),
            "vllm-cpu-dense": ev({"1024": 1.0, "4096": 0.5, "8192": 1.0}, "dense"),
        },
        path=tmp_path / "card.json",
    )
    assert "every_line" not in before and "dense_lines" not in before
    assert {k: card[k] for k in before if k not in ("source", "evaluations")} == {
        k: v for k, v in before.items() if k not in ("source", "evaluations")
    }
    assert card["served_max_tokens"] == 32768
    assert card["every_line"]["served_max_tokens"] == 8192
    # Equal figures: the first listed decides (as for the card's own sizes).
    assert card["every_line"]["source_by_size"] == dict.fromkeys(["1024", "8192", "32768"], "vllm-gpu-every")
    # The dense part stops below the first size under the threshold, whatever comes after it.
    assert card["dense_lines"]["served_max_tokens"] == 1024
    assert card["dense_lines"]["source_by_size"] == dict.fromkeys(["1024", "4096", "8192"], "vllm-cpu-dense")
    loaded, plain = load_card(tmp_path / "card.json"), load_card(tmp_path / "before.json")
    assert loaded.longer_max_tokens == {"every": 8192, "dense": 1024} and plain.longer_max_tokens == {}
    assert [loaded.max_tokens_for(a) for a in fixture_text.ASKED_LINES] == [32768, 8192, 1024]
    assert [plain.max_tokens_for(a) for a in fixture_text.ASKED_LINES] == [32768, None, None]
    assert loaded.summary()["every_line_served_max_tokens"] == 8192
    assert loaded.summary()["dense_lines_served_max_tokens"] == 1024
    assert "every_line_served_max_tokens" not in plain.summary()
    assert "dense_lines_served_max_tokens" not in plain.summary()
    limits = [
        exact_values_limit(loaded.served_max_tokens, loaded.summary(), a) for a in fixture_text.ASKED_LINES
    ]
    assert limits == [32768, 8192, 1024]
    assert exact_values_limit(plain.served_max_tokens, plain.summary(), "every") == 0
    assert exact_values_limit(plain.served_max_tokens, plain.summary(), "dense") == 0
    assert exact_values_limit(None, None, "dense") is None  # no card: every size, any question


def _readme_table(after: str, header: str) -> list[list[str]]:
    """The cells of the first README table with ``header`` after the text ``after``."""
    lines = (CHECKPOINT.parent / "README.md").read_text().split(after, 1)[1].splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[head + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _margin(value: float) -> str:
    # Rounded half up from the recorded value, as a person reads 6.125 as 6.13.
    return str(Decimal(str(value)).quantize(Decimal("0.01"), ROUND_HALF_UP)).replace("-", "−")


def test_the_in_process_comparison_table_is_derived_from_its_records() -> None:
    """The README's table of hold-4 beside hold-3, on the same fixtures, cell for cell."""
    rows = _readme_table("## The checkpoint before, `hold-4`", "| prompt tokens | n | `hold-4` exact")
    runs = [
        json.loads((RECORDS / name).read_text())["eval"]
        for name in ("hold-4.eval.json", "hold-3.h200-256.eval.json")
    ]

    def cells(got: dict[str, Any]) -> list[str]:
        exact = "100 %" if got["exact"] == got["n"] else f"{100 * got['accuracy']:.1f} % ({got['exact']})"
        return [exact, _margin(got["min_margin"])]

    assert [row[0] for row in rows] == [f"{int(size):,}" for size in runs[0]]
    for row, size in zip(rows, runs[0], strict=True):
        assert runs[0][size]["n"] == runs[1][size]["n"] and row[1] == str(runs[0][size]["n"])
        assert row[2:] == cells(runs[0][size]) + cells(runs[1][size]), size


def test_the_committed_checkpoints_in_process_table_is_derived_from_its_record() -> None:
    """The README's in-process table of hold-6, cell for cell."""
    rows = _readme_table("## Evaluation", "| prompt tokens | n | `hold-6` exact")
    got = json.loads((RECORDS / "hold-6.eval.json").read_text())["eval"]
    assert [row[0] for row in rows] == [f"{int(size):,}" for size in got]
    for row, (size, ev) in zip(rows, got.items(), strict=True):
        assert row[1:] == [str(ev["n"]), _exact_cell(ev), _margin(ev["min_margin"])], size


@pytest.mark.parametrize(
    ("heading", "engines"),
    [
        ("**On vLLM 0.26.0 on an H200** (`hold-6`", ("vllm-gpu",)),
        ("**On vLLM 0.32.0, CPU** (`hold-6`)", ("vllm-cpu", "vllm-cpu-32k")),
    ],
    ids=["gpu", "cpu"],
)
def test_the_committed_checkpoints_engine_tables_are_the_cards_evaluations(
    heading: str, engines: tuple[str, ...]
) -> None:
    """The README's tables of the committed checkpoint on vLLM are card.json's evaluations,
    size for size (each re-derived from its run by the test above)."""
    rows = _readme_table(heading, "| prompt tokens | n | exact |")
    evaluations = json.loads(CARD.read_text())["evaluations"]
    cells = {
        int(n): [str(ev["n_by_size"][n]), f"{round(100 * acc)} %", _margin(ev["min_margin_by_size"][n])]
        for ev in (evaluations[name] for name in engines)
        for n, acc in ev["accuracy_by_size"].items()
    }
    assert [row[0] for row in rows] == [f"{n:,}" for n in sorted(cells)]
    for row, n in zip(rows, sorted(cells), strict=True):
        assert row[1:] == cells[n], n


@pytest.mark.parametrize(
    "asked, section, engines",
    [
        ("every", "### Every value line asked", ("vllm-cpu-every", "vllm-gpu-every")),
        ("dense", "### A value line in every chunk", ("vllm-cpu-dense", "vllm-gpu-dense")),
    ],
)
def test_needle_exacts_every_line_tables_are_the_cards_evaluations_that_asked_them(
    asked: str, section: str, engines: tuple[str, ...]
) -> None:
    """The README's every-line and dense tables: each engine's answers per size are the card's
    evaluations that asked that question (each re-derived from its run by the card test), the
    names asked the largest fixture's of those runs, and the card's part for that question
    serves it to the largest size."""
    import lzma

    data = json.loads(EXACT.card.read_text())
    evaluations = {n: e for n, e in data["evaluations"].items() if e.get("asks") == asked}
    assert sorted(evaluations) == sorted(engines)
    names: dict[int, int] = defaultdict(int)
    for item in evaluations.values():
        path = (EXACT.card.parent / item["record"]).resolve()
        with lzma.open(path, "rt") as f:
            for line in f:
                e = json.loads(line)
                if e["kind"] == "fixture.created" and e["data"].get("asked_lines") == asked:
                    size = e["data"]["nominal_tokens"]
                    names[size] = max(names[size], len(e["data"]["expected"]))
    cells: dict[int, list[str]] = defaultdict(lambda: [""] * len(engines))
    for column, name in enumerate(engines):
        ev = evaluations[name]
        for size, acc in ev["accuracy_by_size"].items():
            n = ev["n_by_size"][size]
            cells[int(size)][column] = f"{round(acc * n)}/{n}"
    rows = _readme_table(section, "| prompt tokens | vLLM 0.32.0, CPU |")
    assert [row[0] for row in rows] == [f"{n:,}" for n in sorted(cells)]
    for row, size in zip(rows, sorted(cells), strict=True):
        assert row[1:] == [*cells[size], str(names[size])], size
    assert data[fixture_text.CARD_PARTS[asked]]["served_max_tokens"] == max(cells)


def test_the_committed_card_is_what_its_cited_evaluations_give(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``python -m experiments.needle.card`` derives every cited evaluation again (ledger
    exports imported, verified and read as events) and writes card.json byte for byte."""
    from experiments.needle import card as card_command

    fresh = tmp_path / "card.json"
    card_command.build(card_path=fresh)
    assert fresh.read_text() == CARD.read_text()
    assert card_command.main(["--check"]) == 0


def test_the_card_refuses_an_evaluation_of_another_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A cited run whose checkpoint audit does not match the manifest is refused by name."""
    from experiments.needle import card as card_command

    manifest = json.loads(MANIFEST.read_text())
    name = sorted(manifest["files"])[0]
    manifest["files"][name] = "0" * 64
    other = tmp_path / "MANIFEST.sha256.json"
    other.write_text(json.dumps(manifest))
    with pytest.raises(
        card_command.CardSourceError, match=r"vllm-gpu-eval\.jsonl\.xz: run .* another checkpoint"
    ):
        card_command.build(manifest_path=other, card_path=tmp_path / "card.json")
    assert not (tmp_path / "card.json").exists()


_EVERY = 'asks = "every"\n'
_DENSE = 'asks = "dense"\n'


@pytest.mark.parametrize(
    "cited, edited, refusal",
    [
        ('name = "vllm-gpu"\n', 'name = "vllm-gpu"\n' + _EVERY, "asked 'spot' lines, the card"),
        ('name = "vllm-cpu-every"\n' + _EVERY, 'name = "vllm-cpu-every"\n', "asked 'every' lines, the card"),
        ('name = "in-process-cpu"\n', 'name = "in-process-cpu"\n' + _EVERY, "in-process record asks"),
        ('name = "vllm-cpu-dense"\n' + _DENSE, 'name = "vllm-cpu-dense"\n' + _EVERY, "asked 'dense' lines"),
        ('name = "vllm-cpu-every"\n' + _EVERY, 'name = "vllm-cpu-every"\n' + _DENSE, "asked 'every' lines"),
    ],
    ids=[
        "spot-run-cited-for-every",
        "every-run-cited-for-spot",
        "in-process-cited-for-every",
        "dense-run-cited-for-every",
        "every-run-cited-for-dense",
    ],
)  # fmt: skip
def test_the_card_refuses_an_evaluation_cited_for_a_question_its_run_did_not_ask(
    tmp_path: Path, cited: str, edited: str, refusal: str
) -> None:
    """A run cited for every-line or dense questions must have asked them (its run.started params),
    and the other way round; an in-process record asks the seed's question only."""
    from experiments.needle import card as card_command

    sources = EXACT.sources.read_text()
    assert sources.count(cited) == 1
    edited_sources = tmp_path / "card.toml"
    edited_sources.write_text(sources.replace(cited, edited))
    with pytest.raises(card_command.CardSourceError, match=refusal):
        card_command.build(edited_sources, EXACT.manifest, tmp_path / "card.json")
    assert not (tmp_path / "card.json").exists()


# --- needle-exact: the constructed checkpoint ------------------------------------------------------


def test_needle_exact_matches_its_manifest_and_is_what_construct_describes() -> None:
    from experiments.needle import construct

    audit = audit_checkpoint(EXACT.checkpoint, EXACT.name, EXACT.manifest)
    assert audit.matched is True, [f for f in audit.files if f.sha256 != f.expected_sha256]
    config = json.loads((EXACT.checkpoint / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == construct.ROPE_THETA
    assert (config["head_dim"], config["num_attention_heads"]) == (construct.HEAD_DIM, len(construct.OFFSETS))
    assert config["num_key_value_heads"] == 1 and config["num_hidden_layers"] == 2
    assert config["max_position_embeddings"] == construct.MAX_POSITIONS
    assert json.loads((EXACT.checkpoint / "tokenizer_config.json").read_text())["chat_template"]


def test_needle_exact_offset_heads_find_their_offset_at_every_distance_it_serves() -> None:
    """The layer-1 score at its own offset beats every other distance up to 262,144 tokens by more
    than the softmax needs to ignore a quarter of a million keys (e^-20 each), and the content
    pairs turn by less than 0.01 rad over the whole span."""
    from experiments.needle import construct

    own, margin = construct.offset_margin()
    assert margin > 20.0 and own < 250.0  # large enough to choose, small enough for bf16 scores
    inv = construct.inverse_frequencies()
    assert inv[construct.STATIC_FIRST] * construct.MAX_POSITIONS < 0.01
    # The recorded figures are the function's.
    recorded = json.loads((construct.HERE / "exact" / "config.json").read_text())["needle_construction"]
    assert recorded["offset_margin"] == round(margin, 3) and recorded["offset_score"] == round(own, 3)


def test_needle_exact_card_serves_every_size_its_engines_measured_and_no_further() -> None:
    from experiments.needle import card as card_command

    card = EXACT.load_card()
    assert card_command.main(["--model", "needle-exact", "--check"]) == 0
    assert all(a == 1.0 for a in card.accuracy_by_size.values())
    assert card.served_max_tokens == max(card.accuracy_by_size) == 256_000
    data = json.loads(EXACT.card.read_text())
    # Past 32,768 tokens the GPU engine is the only one that measured, and it decides those sizes.
    assert {s for s, src in data["source_by_size"].items() if int(s) > 32768} == {"65536", "131072", "256000"}
    assert all(data["source_by_size"][s] == "vllm-gpu" for s in ("65536", "131072", "256000"))


@pytest.mark.parametrize("record", ["exact", "hold-6"])
def test_an_answer_reads_the_kv_of_its_asked_lines_and_no_other(record: str) -> None:
    """experiments/needle/coverage.py's records: with one 256-token chunk of a cached prefix made
    wrong (zeroed, or another chunk's KV), an answer went wrong only where the chunk holds a line
    the question asks for (needle-exact: in every such chunk), and so asking every value line sees
    wrong KV in more chunks than the fixture's three names do."""
    found = json.loads((RECORDS / f"{record}.coverage.json").read_text())
    assert found["fixtures"]
    for fixture in found["fixtures"]:
        for question in ("fixture", "every_mark"):
            got, where = fixture[question], (fixture["size"], question)
            for kind in ("zeroed", "misplaced"):
                caught = got["chunks_caught"][kind]
                assert got["wrong_answers"][kind] == len(caught)
                if not got["clean_exact"]:  # wrong with no fault: every fault leaves it wrong
                    assert len(caught) == got["chunks_tried"], where
                elif record == "exact":
                    assert caught == got["chunks_with_asked_lines"], where
                else:
                    assert caught and set(caught) <= set(got["chunks_with_asked_lines"]), where
        asked, every = fixture["fixture"], fixture["every_mark"]
        if every["clean_exact"]:
            assert set(asked["chunks_caught"]["zeroed"]) < set(every["chunks_caught"]["zeroed"])
    assert all(f[q]["clean_exact"] for f in found["fixtures"] for q in ("fixture", "every_mark")) == (
        record == "exact"
    )
    for question, by_fault in found["totals"].items():
        for kind, total in by_fault.items():
            wrong = sum(f[question]["wrong_answers"][kind] for f in found["fixtures"])
            assert total["wrong_answers"] == wrong


def test_with_a_value_line_in_every_chunk_every_wrong_chunk_changes_the_answer() -> None:
    """experiments/needle/coverage.py's dense record: with a value line every few lines (closer than
    a chunk's tokens) every chunk of the cached prefix holds some of one, and needle-exact's answer
    to every value line went wrong for each chunk made wrong, where asking every value line of the
    fixtures' own spacing saw only the chunks that hold one."""
    dense = json.loads((RECORDS / "exact-dense.coverage.json").read_text())
    spaced = {
        f["size"]: f["every_mark"]
        for f in json.loads((RECORDS / "exact.coverage.json").read_text())["fixtures"]
    }
    # The spacing of the experiments' asked_lines=dense, closer than the fixtures' own.
    assert dense["dense_every"] == fixture_text.DENSE_EVERY < fixture_text.MARK_EVERY and dense["fixtures"]
    assert set(dense["totals"]) == {"dense_marks"}
    for fixture in dense["fixtures"]:
        got, size = fixture["dense_marks"], fixture["size"]
        assert got["clean_exact"], size
        tried = list(range(1, got["chunks_tried"] + 1))
        assert got["chunks_with_asked_lines"] == tried, size  # every chunk holds part of a value line
        for kind in ("zeroed", "misplaced"):
            assert got["chunks_caught"][kind] == tried, (size, kind)
            assert got["wrong_answers"][kind] == len(tried)
        if size in spaced:  # more names than one every MARK_EVERY lines, and more chunks seen
            assert got["names_asked"] > spaced[size]["names_asked"]
            assert got["wrong_answers"]["zeroed"] > spaced[size]["wrong_answers"]["zeroed"]
    for kind, total in dense["totals"]["dense_marks"].items():
        assert total["wrong_answers"] == sum(
            f["dense_marks"]["wrong_answers"][kind] for f in dense["fixtures"]
        )
        assert total["chunks_tried"] == sum(f["dense_marks"]["chunks_tried"] for f in dense["fixtures"])


def coverage_rows() -> list[list[str]]:
    """The README's coverage table from the records: per size, each question's names and, per
    checkpoint, the chunks whose wrong KV changed the answer of those faulted."""
    found = {
        name: {f["size"]: f for f in json.loads((RECORDS / f"{name}.coverage.json").read_text())["fixtures"]}
        for name in ("exact", "hold-6", "exact-dense")
    }

    def cell(fixture: dict[str, Any] | None, question: str) -> str:
        if fixture is None:
            return ""
        got = fixture[question]
        if not got["clean_exact"]:
            return "wrong unfaulted"
        return f"{got['wrong_answers']['zeroed']} of {got['chunks_tried']}"

    rows = []
    for size in sorted(found["exact"]):
        row = [f"{size:,}"]
        for question in ("fixture", "every_mark"):
            row.append(str(found["exact"][size][question]["names_asked"]))
            row += [cell(found[name].get(size), question) for name in ("exact", "hold-6")]
        dense = found["exact-dense"].get(size)
        row += [str(dense["dense_marks"]["names_asked"]), cell(dense, "dense_marks")] if dense else ["", ""]
        rows.append(row)
    return rows


def test_the_coverage_table_is_derived_from_its_records() -> None:
    rows = _readme_table("### What an answer reads", "| prompt tokens | fixture's question")
    assert rows == coverage_rows()
    totals = json.loads((RECORDS / "exact.coverage.json").read_text())["totals"]
    text = (CHECKPOINT.parent / "README.md").read_text()
    for question in ("fixture", "every_mark"):
        got = totals[question]["zeroed"]
        assert f"{got['wrong_answers']} of {got['chunks_tried']}" in text.split("### What an answer reads")[1]
