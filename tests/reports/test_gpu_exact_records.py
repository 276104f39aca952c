"""Exact answers at 256,000 tokens on a GPU, KV loaded by LMCache included (tests/data/gpu-exact-256k).

The trained needle answers nothing past 40,960 tokens, so the committed GPU studies check exact
values only up to 32k. This study serves ``needle-exact`` (experiments/needle/construct.py), whose
weights are written to read the fixtures' grammar: its needle_eval answered every fixture at every
size to 256,000 tokens, and the screening's exact-value checks at 256,000 held on every step of
both arms, the ON cross-replica reuse answered from the KV the LMCache service loaded. Every claim
is derived from the committed export's events.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from experiments.needle import EXACT

from .conftest import import_export, ledger_rows

STUDY = Path(__file__).resolve().parents[1] / "data" / "gpu-exact-256k"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    found = f"sqlite:///{tmp_path_factory.mktemp('gpu-exact') / 'ledger.db'}"
    import_export(STUDY / "ledger.jsonl.xz", found)
    return found


def _exact_checks(url: str, experiment: str) -> list[dict[str, Any]]:
    return ledger_rows(
        url,
        f"""SELECT q.nominal_tokens, q.step, b.arm, r.prompt_tokens, h.external_hit_tokens, a.passed
            FROM assertion_evaluated a JOIN request_sent q USING (request_id)
            JOIN response_received r USING (request_id) LEFT JOIN hits_observed h USING (request_id)
            JOIN block_started b ON b.block_id = q.block_id JOIN run_started s ON s.run_id = q.run_id
            WHERE a."check" = 'exact_values' AND s.experiment = '{experiment}' AND NOT q.warmup""",
    )


def test_every_run_served_the_constructed_checkpoint_its_manifest_names(url: str) -> None:
    audits = ledger_rows(url, "SELECT run_id, data FROM events WHERE kind = 'checkpoint.audited'")
    expected = json.loads(EXACT.manifest.read_text())["files"]
    assert len(audits) == 3  # needle_eval, validation, screening
    for row in audits:
        data = json.loads(row["data"])
        assert data["matched"] is True and {f["name"]: f["sha256"] for f in data["files"]} == expected


def test_needle_eval_answered_every_fixture_at_every_size_to_256k(url: str) -> None:
    by_size: dict[int, list[bool]] = defaultdict(list)
    for row in _exact_checks(url, "needle_eval"):
        by_size[int(row["nominal_tokens"])].append(bool(row["passed"]))
        assert row["prompt_tokens"] <= row["nominal_tokens"]
    assert sorted(by_size) == [1024, 8192, 32768, 65536, 131072, 256000]
    assert all(len(v) == 16 and all(v) for v in by_size.values()), {k: sum(v) for k, v in by_size.items()}


def test_answers_from_kv_the_service_loaded_are_exact_at_256k(url: str) -> None:
    rows = _exact_checks(url, "screening")
    assert rows and all(r["passed"] for r in rows)
    assert {r["nominal_tokens"] for r in rows} == {256000}
    cross_on = [r for r in rows if r["step"] == "cross" and r["arm"] == "ON"]
    # Each ON cross-replica reuse loaded (nearly) its whole 256k prompt through the connector.
    assert len(cross_on) == 2
    assert all(r["external_hit_tokens"] >= r["prompt_tokens"] - 256 for r in cross_on), cross_on
    steps = {(r["arm"], r["step"]) for r in rows}
    assert steps == {
        (arm, s) for arm in ("OFF", "ON") for s in ("cold", "cross", "local1", "local2", "receiver_local")
    }


def test_validation_checked_exact_values_past_the_trained_models_frontier(url: str) -> None:
    rows = _exact_checks(url, "validation")
    assert rows and all(r["passed"] for r in rows)
    assert max(r["nominal_tokens"] for r in rows) == 128000
