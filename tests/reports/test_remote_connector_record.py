"""Why the in-process connector's loaded KV gave wrong answers, from the record of a GPU host.

``tests/data/gpu-remote-ops`` holds one H200's byte, helper and pinned-pool probes and a
validation run of LMCache 0.5.3's in-process connector (``LMCacheConnectorV1`` with an
``lm://`` server, ``lmcache_mode`` "remote"), with launches that record the copy path each
replica's LMCache resolved. It rules out the seed's copy failure as the cause: the replicas ran
LMCache's compiled ops and its mixed allocator, whose copies passed every byte check on the same
host, and still every answer computed from loaded KV was wrong while every answer the engine
computed itself was right. Everything here is derived from the export's events.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger import Event

from .._cli import ledger_cli
from .conftest import import_export, ledger_rows

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu-remote-ops"


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Event]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('remote') / 'ledger.db'}"
    return url, import_export(DATA / "ledger.jsonl.xz", url)


def test_the_export_verifies_and_its_report_rederives(record: tuple[str, list[Event]]) -> None:
    url, events = record
    verified = ledger_cli("verify", "--db", url, "--json")
    assert verified.exit_code == 0 and f'"count": {len(events)}' in verified.output, verified.output
    report = ledger_cli("report", "--db", url, "--markdown")
    assert report.exit_code == 0 and report.output == (DATA / "report.md").read_text(encoding="utf-8")


def test_the_replicas_ran_the_in_process_connector_on_compiled_ops(record: tuple[str, list[Event]]) -> None:
    _, events = record
    on = [e.data for e in events if e.kind == "deployment.launched" and e.data["arm"] == "ON"]
    assert len(on) == 2 and {d["replica"] for d in on} == {0, 1}
    for d in on:
        lmcache = d["lmcache"]
        assert lmcache["mode"] == "remote" and lmcache["connector"]["kv_connector"] == "LMCacheConnectorV1"
        assert lmcache["ops"] is True and "replicas' Python" in lmcache["ops_observed"]
        assert lmcache["allocator"]["in_use"] == "mixed" and d["transfer_path"] == "gpu"


def test_the_copy_paths_it_ran_passed_every_byte_check_on_this_host(record: tuple[str, list[Event]]) -> None:
    _, events = record
    helpers = [e.data for e in events if e.kind == "probe.helper"]
    ran = [h for h in helpers if h["allocator"] == "mixed" and h["with_ops"]]
    assert ran and all(h["passed"] for h in ran)
    # The probes can fail: without compiled ops the lazy allocator's raw copy returned stale bytes.
    assert any(not h["passed"] for h in helpers if h["allocator"] == "lazy" and not h["with_ops"])
    copies = [e.data for e in events if e.kind == "probe.copy" and e.data["method"] != "raw_fallback"]
    assert copies and all(c["passed"] for c in copies)


def test_answers_are_right_when_computed_and_wrong_whenever_kv_was_loaded(
    record: tuple[str, list[Event]],
) -> None:
    url, _ = record
    rows = ledger_rows(
        url,
        """SELECT q.step, a."check", a.passed, h.external_hit_tokens, h.local_hit_tokens
           FROM assertion_evaluated a JOIN request_sent q USING (request_id)
           JOIN hits_observed h USING (request_id)
           WHERE a."check" IN ('exact_values', 'matches_cold_reference') AND NOT q.warmup""",
    )
    loaded = [r for r in rows if r["external_hit_tokens"]]
    computed = [r for r in rows if not r["external_hit_tokens"] and not r["local_hit_tokens"]]
    assert loaded and computed
    assert not any(r["passed"] for r in loaded), loaded
    assert all(r["passed"] for r in computed), computed
    # One of the loaded ones was a cold request under a fresh salt: the salt did not isolate.
    salted = ledger_rows(url, """SELECT passed FROM assertion_evaluated WHERE "check" = 'salt_control'""")
    assert salted and not any(r["passed"] for r in salted)


def test_the_audit_names_state_corruption_not_ties(record: tuple[str, list[Event]]) -> None:
    """Each wrong answer's divergence is triaged from its cold re-sends, which agree with each
    other: a wrong state, not a near tie; and the gate blocks."""
    url, _ = record
    result = ledger_cli("audit", "--db", url, "--json")
    assert result.exit_code == 0, result.output
    findings = json.loads(result.output)["findings"]
    codes = {f["code"] for f in findings}
    assert {"state-corruption", "assertion-failed"} <= codes and "numeric-tie" not in codes
    assert all("the cold re-sends agree" in f["detail"] for f in findings if f["code"] == "state-corruption")
    assert ledger_cli("audit", "--db", url, "--publish").exit_code == 1
