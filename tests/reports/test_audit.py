"""Every audit code's planted flaw is found, where it was planted; a clean ledger has no blocking finding."""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import fields
from pathlib import Path
from typing import Any

import orjson
import pytest

from reports import SEVERITY, audit, audit_json, open_source
from tests._synthetic import Flaws, Shape, generate
from tests.ledger._helpers import tamper_postgres, tamper_sqlite
from tests.reports.conftest import import_envelopes

# flaw switch → (audit code, which finding field must name the planted id)
PLANTED: dict[str, tuple[str, str | None]] = {
    "run_incomplete": ("run-incomplete", "run_id"),
    "namespace_leak": ("namespace-leak", "block_id"),
    "unpaired": ("unpaired-request", None),
    "payload_mismatch": ("pair-payload-mismatch", None),
    "gpu_mismatch": ("pair-gpu-mismatch", None),
    "warmup_in_measurement": ("warmup-in-measurement", "target"),
    "assertion_failed": ("assertion-failed", "target"),
    "assertion_inconsistent": ("assertion-inconsistent", "target"),
    "hits_inconsistent": ("hits-inconsistent", "target"),
    "off_external_hits": ("off-arm-external-hits", "target"),
    "missing_full_prefix": ("missing-full-prefix-hit", "target"),
    "counter_mismatch": ("counter-mismatch", "target"),
    "checkpoint_mismatch": ("checkpoint-mismatch", "run_id"),
    "checkpoint_unverified": ("checkpoint-unverified", "run_id"),
    "provenance_missing": ("provenance-missing", "run_id"),
    "validation_missing": ("validation-missing", None),
    "isolation_missing": ("isolation-missing", "target"),
    "order_unbalanced": ("order-unbalanced", None),
    "declared_exclusion": ("declared-exclusion", "target"),
    "probes_failing": ("validation-missing", None),
    "helper_failing": ("helper-probe-failed", "target"),
    "pinned_rounding": ("pinned-rounding", "run_id"),
    "block_failed": ("run-incomplete", None),  # the run finished failed; the block is excluded
    "not_restarted": ("blocks-not-restarted", "block_id"),
    "hash_seed_unset": ("hash-seed-unset", "target"),
    "ttft_method_mixed": ("ttft-method-mixed", "run_id"),
}
GPU_SHAPE = Shape(target="vllm", transfer_path="gpu")


def _shape(flaw: str) -> Shape:
    gpu = (
        "checkpoint_mismatch",
        "checkpoint_unverified",
        "probes_failing",
        "helper_failing",
        "pinned_rounding",
    )
    return GPU_SHAPE if flaw in gpu else Shape()


def test_every_flaw_switch_is_covered() -> None:
    assert {f.name for f in fields(Flaws)} == set(PLANTED)


def test_every_design_code_has_a_severity() -> None:
    codes = set(SEVERITY)
    assert {code for code, _ in PLANTED.values()} | {
        "chain-broken",
        "snapshot-mismatch",
        "assertion-not-independent",
        # Found in real result files of other tools: tests/collectors/test_result_imports.py.
        "import-unpaired",
        "import-no-hit-counters",
        "import-unvalidated",
        # A divergence's class is derived from the re-sends' answers: planted by the sim's own
        # faults in real runs (tests/reports/test_audit_sim.py), not by this generator.
        "state-corruption",
        "numeric-tie",
        "divergence-inconclusive",
        # Planted in real sim runs only (tests/reports/test_audit_sim.py), where the plan, the scrapes
        # and the launches they judge are the runner's own.
        "plan-deviation",
        "plan-unregistered",
        "metrics-missing",
        "known-incompatible-stack",
        "request-id-reused",
        "block-id-reused",
        "external-hits-unfound",
        "tier-warm-at-start",
    } == codes
    assert SEVERITY["assertion-not-independent"] == SEVERITY["declared-exclusion"] == "info"


@pytest.mark.parametrize("shape", [Shape(), GPU_SHAPE], ids=["sim", "vllm-gpu"])
def test_clean_ledger_has_no_blocking_finding(build: Any, shape: Shape) -> None:
    events, planted = generate(shape=shape)
    assert planted == {}
    findings = audit(build(events))
    assert [f for f in findings if f.severity == "blocking"] == []
    assert [f.code for f in findings] == ["assertion-not-independent"]
    assert "448 of 736" in findings[0].detail


@pytest.mark.parametrize("flaw", sorted(PLANTED))
def test_planted_flaw_is_found(build: Any, flaw: str) -> None:
    events, planted = generate(shape=_shape(flaw), flaws=Flaws(**{flaw: True}))
    code, field = PLANTED[flaw]
    findings = [f for f in audit(build(events)) if f.code == code]
    assert findings, f"{flaw}: no {code} finding"
    assert all(f.severity == SEVERITY[code] for f in findings)
    if field is not None:
        assert planted[flaw] in {getattr(f, field) for f in findings}


def test_unpaired_names_the_orphan(build: Any) -> None:
    events, planted = generate(flaws=Flaws(unpaired=True))
    orphan_off = planted["unpaired"]
    sent = {e["data"]["request_id"] for e in events if e["kind"] == "request.sent"}
    assert orphan_off not in sent  # the OFF partner was never sent...
    (f,) = [f for f in audit(build(events)) if f.code == "unpaired-request"]
    assert "ON request" in f.detail and f.target in sent  # ...so its ON request is the orphan


def test_a_killed_run_is_one_finding_with_its_unpaired_requests_counted(build: Any) -> None:
    """A SIGKILL leaves a prefix of the run (events land in whole batches): cut it in block 3."""
    events, _ = generate()
    screening = [e for e in events if e["kind"] == "run.started"][-1]["run_id"]
    blocks = [e["block_id"] for e in events if e["kind"] == "block.started" and e["run_id"] == screening]
    cut = next(i for i, e in enumerate(events) if e["block_id"] == blocks[3] and e["kind"] == "request.sent")
    killed = events[:cut]
    findings = audit(build(killed))
    (incomplete,) = [f for f in findings if f.code == "run-incomplete"]
    sent = {e["data"]["request_id"]: e for e in killed if e["kind"] == "request.sent"}
    orphans = sum(e["block_id"] == blocks[2] and not e["data"]["warmup"] for e in sent.values())
    assert f"; {orphans} measured request(s) left without a partner" in incomplete.detail and orphans > 100
    assert incomplete.target == screening and incomplete.severity == "blocking"
    assert not [f for f in findings if f.code == "unpaired-request"]


def test_declared_exclusion_acknowledges_findings_in_that_block(build: Any) -> None:
    events, planted = generate(flaws=Flaws(namespace_leak=True))
    leaked = planted["namespace_leak"]
    run_id = next(e["run_id"] for e in events if e["block_id"] == leaked)
    events.append(
        {
            "id": "0190f000-0000-7000-8000-000000000001",
            "ts": "2026-09-20T00:00:00.000000Z",
            "kind": "exclusion.declared",
            "run_id": run_id,
            "block_id": None,
            "data": {"scope": "block", "target": leaked, "reason": "namespace leak across sizes"},
        }
    )
    findings = audit(build(events))
    assert not [f for f in findings if f.severity == "blocking"]
    leak = [f for f in findings if f.code == "namespace-leak"]
    assert leak and all(f.severity == "info" and "acknowledged" in f.detail for f in leak)


def test_chain_broken(build: Any, ledger_url: str) -> None:
    events, _ = generate()
    src = build(events)
    with src.ledger.database.connect() as conn:
        first = "SELECT min(seq) FROM events WHERE kind = 'response.received'"
        seq = conn.exec_driver_sql(first).scalar_one()
    edit = f"UPDATE events SET data = replace(data, '\"status\":200', '\"status\":201') WHERE seq = {seq}"
    # Bypass the immutability triggers as someone with raw database access would.
    (tamper_sqlite if ledger_url.startswith("sqlite") else tamper_postgres)(ledger_url, [edit])
    (f,) = [f for f in audit(src) if f.code == "chain-broken"]
    assert f.severity == "blocking" and f.target == str(seq)


def test_verification_started_at_open_finds_the_break(build: Any, ledger_url: str, tmp_path: Path) -> None:
    """``ledger audit`` starts the chain check when the source opens, beside the views."""
    events, _ = generate()
    ledger = build(events).ledger
    (tamper_sqlite if ledger_url.startswith("sqlite") else tamper_postgres)(
        ledger_url, ["UPDATE events SET data = '{}' WHERE seq = 7"]
    )
    src = open_source(ledger, tmp_path / "snapshots", verify=True)
    try:
        (f,) = [f for f in audit(src) if f.code == "chain-broken"]
        assert f.severity == "blocking" and f.target == "7"
        assert src.verification() is src.verification() and src.verification().first_bad_seq == 7
    finally:
        src.close()


def test_audit_json_is_sorted_and_names_the_head(build: Any) -> None:
    events, _ = generate(flaws=Flaws(assertion_failed=True, counter_mismatch=True, declared_exclusion=True))
    src = build(events)
    result = audit_json(src)
    assert result["head"] == src.head.chain
    keys = [(f["severity"] != "blocking", f["code"]) for f in result["findings"]]
    assert keys == sorted(keys)
    assert set(result["findings"][0]) == {"code", "severity", "run_id", "block_id", "target", "detail"}


def test_run_scope(build: Any) -> None:
    gen_events, _ = generate(flaws=Flaws(assertion_failed=True))
    src = build(gen_events)
    runs = [e["run_id"] for e in gen_events if e["kind"] == "run.started"]
    validation, screening = runs
    assert any(f.code == "assertion-failed" for f in audit(src, screening))
    assert not any(f.code == "assertion-failed" for f in audit(src, validation))


def test_audit_md_documents_every_code_with_its_severity() -> None:
    text = (Path(__file__).parents[2] / "reports" / "AUDIT.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z-]+)` \| (blocking|warning|info) \|", text, re.M)
    assert dict(rows) == SEVERITY and len(rows) == len(SEVERITY)


@pytest.mark.parametrize("forged", ["first", "second"])
def test_exact_values_are_rederived_from_the_requests_first_response(tmp_path: Path, forged: str) -> None:
    """A request answered twice: its exact_values check is re-derived from the first response only.
    The forged response carries a whole answer (its prefix is the text its digest names) that the
    fixture's expected values contradict. First, it makes the recorded pass inconsistent; second,
    after the real one, it changes nothing."""
    events, _ = generate()
    check = next(
        e for e in events if e["kind"] == "assertion.evaluated" and e["data"]["check"] == "exact_values"
    )
    request = check["data"]["request_id"]
    assert check["data"]["passed"] is True
    (at, response) = next(
        (i, e)
        for i, e in enumerate(events)
        if e["kind"] == "response.received" and e["data"]["request_id"] == request
    )
    wrong = orjson.dumps({key: -1 for key in check["data"]["expected"]}).decode()
    other = {
        **response,
        "id": str(uuid.UUID(int=uuid.UUID(response["id"]).int ^ 1)),
        "data": {
            **response["data"],
            "output_text_prefix": wrong,
            "text_sha256": hashlib.sha256(wrong.encode()).hexdigest(),
        },
    }
    events.insert(at if forged == "first" else at + 1, other)
    led = import_envelopes(f"sqlite:///{tmp_path / 'ledger.db'}", events)
    src = open_source(led, tmp_path / "snap", verify=True)
    try:
        src.rederive()
        (derived,) = src.tuples(
            "SELECT derived_passed FROM kv_rederived WHERE request_id = $r AND \"check\" = 'exact_values'",
            {"r": request},
        )
        inconsistent = [
            f for f in audit(src) if f.code == "assertion-inconsistent" and request in str(f.target)
        ]
    finally:
        src.close()
        led.close()
    assert derived == (forged == "second",)
    assert bool(inconsistent) == (forged == "first")


def _window_events(run_id: str, scraped: bool, queries: int | None = 100) -> list[dict[str, Any]]:
    """A window-level hits.observed with no block (the envelope's block_id is optional), and where
    ``scraped`` the two scrapes of its window whose counters give exactly what it records."""
    ids = iter(range(1, 100))

    def event(kind: str, data: dict[str, Any]) -> dict[str, Any]:
        n = next(ids)
        return {
            "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{n}")),
            "ts": f"2026-09-{12 if run_id == 'run-a' else 13}T00:00:{n:02d}.000000Z",
            "kind": kind,
            "run_id": run_id,
            "block_id": None,
            "data": data,
        }

    def scrape(phase: str, queries: float, local: float) -> dict[str, Any]:
        samples = {
            'vllm:prefix_cache_queries_total{engine="0"}': queries,
            'vllm:prefix_cache_hits_total{engine="0"}': local,
            'vllm:external_prefix_cache_hits_total{engine="0"}': 0.0,
        }
        return event(
            "metrics.scraped",
            {
                "replica": 0,
                "endpoint": "e",
                "samples": samples,
                "phase": phase,
                "request_id": None,
                "window": "w",
                "error": None,
            },
        )

    out = []
    if scraped:
        out.append(scrape("before", 0.0, 0.0))
        out.append(scrape("after", 100.0, 50.0))
    out.append(
        event(
            "hits.observed",
            {
                "request_id": None,
                "window": "w",
                "replica": 0,
                "prefix_queries": queries,
                "local_hit_tokens": 50,
                "external_hit_tokens": 0,
            },
        )
    )
    return out


def test_hits_are_held_to_their_own_runs_scrapes(build_lite: Any) -> None:
    """A window's scrapes stand behind the hits records of their own run only: two runs' blockless
    windows of one name and replica are not one window. Run B recorded hits that no scrape of its
    own gives; run A's scrapes of a window of the same name give the same deltas, and must not
    stand in for them."""
    src = build_lite([*_window_events("run-a", scraped=True), *_window_events("run-b", scraped=False)])
    found = [f for f in audit(src) if f.code == "hits-inconsistent"]
    assert [f.run_id for f in found] == ["run-b"]
    assert "no metrics.scraped before/after stands behind it" in found[0].detail
    rows = src.tuples("SELECT run_id, scraped, inconsistent FROM kv_hits_rederived ORDER BY run_id")
    assert rows == [("run-a", True, False), ("run-b", False, True)]


def test_a_runs_missing_counters_are_judged_by_its_own_scrapes(build_lite: Any) -> None:
    """metrics-missing reads the scrapes of the hits record's own run: run B, never scraped, recorded
    no prefix queries; run A's scrapes of a window of the same name do not make that a missing
    counter of B's (it is B's hits that no scrape stands behind)."""
    src = build_lite(
        [*_window_events("run-a", scraped=True), *_window_events("run-b", scraped=False, queries=None)]
    )
    findings = audit(src)
    assert [f.run_id for f in findings if f.code == "metrics-missing"] == []
    assert [f.run_id for f in findings if f.code == "hits-inconsistent"] == ["run-b"]


def _gpu_ledger_with_bad_bytes(kind: str, field: str, value: str) -> list[dict[str, Any]]:
    """A clean GPU-shaped ledger whose first passing ``kind`` check with ``field`` = ``value`` now
    records mismatching bytes, its verdict left as passed."""
    events, planted = generate(shape=GPU_SHAPE)
    assert planted == {}
    forged = next(
        e for e in events if e["kind"] == kind and e["data"][field] == value and e["data"]["passed"]
    )
    forged["data"]["mismatching_bytes"] = 4096
    return events


def test_a_copy_probe_is_judged_by_its_bytes(build_lite: Any) -> None:
    """A probe.copy of an ordered method recorded as passed over mismatching bytes counts as the
    failed check its observation makes it: the bytes layer fails and publishing blocks."""
    src = build_lite(_gpu_ledger_with_bad_bytes("probe.copy", "method", "wait_then_fallback"))
    ((checks, passed),) = src.tuples(
        "SELECT sum(checks), sum(passed) FROM kv_probe_copy WHERE method = 'wait_then_fallback'"
    )
    assert passed == checks - 1
    assert "validation-missing" in {f.code for f in audit(src) if f.severity == "blocking"}


def test_a_helper_probe_is_judged_by_its_bytes(build_lite: Any) -> None:
    """A probe.helper check recorded as passed over mismatching bytes counts as failed: the helper
    layer of the config on the path the seed found sound (the mixed allocator) then fails."""
    src = build_lite(_gpu_ledger_with_bad_bytes("probe.helper", "allocator", "mixed"))
    ((failed,),) = src.tuples("SELECT sum(failed) FROM kv_probe_helper WHERE allocator = 'mixed'")
    assert failed == 1
    (missing,) = [f for f in audit(src) if f.code == "validation-missing"]
    assert (
        missing.severity == "blocking" and "no passing runtime helpers (LMCache) (failed)" in missing.detail
    )
