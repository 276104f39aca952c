"""LMCache's own counters beside vLLM's, recorded on a GPU (tests/data/gpu-lmcache-tier up to
128k tokens, tests/data/gpu-lmcache-256k at 256k and in concurrent windows).

The LMCache service of every ON block served its Prometheus counters, and the runner scraped
them around every window beside the replicas' (``metrics.scraped`` with ``replica`` ``tier``).
Everything below is derived from the committed exports: the tier's scrapes against the windows,
the service's lookup hits against the tokens vLLM loaded through the connector, each
certificate's LMCache tiers, and the audit re-deriving them.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from ledger import Event

from .._cli import ledger_cli
from .._tier import tier_scrapes
from .conftest import import_export, ledger_rows

DATA = Path(__file__).resolve().parents[1] / "data"
STUDY = DATA / "gpu-lmcache-tier"
STUDY_256K = DATA / "gpu-lmcache-256k"


class Recorded:
    def __init__(self, url: str, events: list[Event]) -> None:
        self.url, self.events = url, events

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    def runs(self, experiment: str) -> list[str]:
        return [str(e.run_id) for e in self.of("run.started") if e.data["experiment"] == experiment]

    def sql(self, statement: str) -> list[dict[str, Any]]:
        return ledger_rows(self.url, statement)


def _imported(tmp_path_factory: pytest.TempPathFactory, path: Path) -> Recorded:
    url = f"sqlite:///{tmp_path_factory.mktemp(path.name) / 'ledger.db'}"
    return Recorded(url, import_export(path / "ledger.jsonl.xz", url))


def _arms_and_tier_endpoints(study: Recorded) -> tuple[dict[Any, str], dict[Any, str]]:
    """Each block's arm, and each ON block's service metrics endpoint (every ON block has one,
    on the host's loopback, and no OFF block does)."""
    arm = {e.block_id: e.data["arm"] for e in study.of("block.started")}
    metrics = {e.block_id: e.data["metrics_endpoint"] for e in study.of("service.launched")}
    assert metrics and set(metrics) == {b for b, a in arm.items() if a == "ON"}
    assert all(url.startswith("http://127.0.0.1:") for url in metrics.values())
    return arm, metrics


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return _imported(tmp_path_factory, STUDY)


def test_every_on_window_has_the_tiers_scrapes_and_no_off_window_does(study: Recorded) -> None:
    arm, metrics = _arms_and_tier_endpoints(study)
    scraped = tier_scrapes(study.of("metrics.scraped"), metrics)
    # The interrupted run's last window has its replica's before-scrape and nothing after it.
    (aborted,) = [e.run_id for e in study.of("run.finished") if e.data["status"] == "aborted"]
    cut = {e.block_id for e in study.of("exclusion.declared") if e.run_id == aborted}
    for block, a in arm.items():
        want, taken = scraped[block]
        if a == "OFF":
            assert not taken, block
        elif block not in cut:
            assert taken == want, block
    assert sum(1 for a in arm.values() if a == "ON") == len(metrics) == 5  # validation's, 2 + 2


def _steps(study: Recorded, run: str) -> dict[tuple[str, str], dict[str, int]]:
    rows = study.sql(f"""
        SELECT q.workload, q.step, h.external_hit_tokens AS ext, h.local_hit_tokens AS loc,
               h.lmcache_hit_tokens AS lm_hit, h.lmcache_requested_tokens AS lm_req
        FROM request_sent q JOIN hits_observed h USING (request_id)
        JOIN block_started b ON b.block_id = q.block_id
        WHERE b.arm = 'ON' AND q.run_id = '{run}' AND NOT q.warmup AND q.probe IS NULL""")
    out: dict[tuple[str, str], dict[str, int]] = defaultdict(Counter)
    for r in rows:
        for k in ("ext", "loc", "lm_hit", "lm_req"):
            out[(r["workload"], r["step"])][k] += r[k]
        out[(r["workload"], r["step"])]["n"] += 1
    return out


def test_lmcaches_lookups_found_what_vllm_loaded_and_nothing_cold(study: Recorded) -> None:
    for run in study.runs("screening"):
        steps = _steps(study, run)
        cross = steps["micro", "cross"]
        # Every token vLLM loaded from the service on a cross-replica reuse, the service's own
        # lookups found, no more and no fewer.
        assert cross["n"] > 0 and cross["ext"] > 0 and cross["lm_hit"] == cross["ext"], cross
        for step in (("micro", "cold"), ("generation", "cold")):
            assert steps[step]["n"] > 0 and steps[step]["lm_hit"] == 0 < steps[step]["lm_req"], step
        # A local reuse is looked up too, and found, though vLLM serves it from its own cache:
        # the service's hit counters count lookups, not loads.
        local = steps["micro", "local1"]
        assert local["lm_hit"] > 0 and local["loc"] > local["ext"], local


def test_every_certificate_read_lmcaches_tiers_and_the_audit_agrees(study: Recorded) -> None:
    certs = study.of("isolation.certified")
    assert len(certs) == 1 + len(study.runs("screening"))  # validation's and each screening's
    for cert in certs:
        d = cert.data
        assert d["passed"] and not d["problems"], d
        assert d["repeat"]["lmcache_salt_hit_tokens"] > 0 and d["repeat"]["lmcache_hit_tokens"] > 0
        for other in d["other_salt"]:
            assert other["lmcache_hit_tokens"] == 0 == other["lmcache_salt_hit_tokens"], other
    result = ledger_cli("audit", "--db", study.url, "--json")
    assert result.exit_code == 0, result.output
    codes = {f["code"] for f in json.loads(result.output)["findings"]}
    assert "isolation-missing" not in codes and "hits-inconsistent" not in codes, codes


def test_each_complete_run_publishes_alone(study: Recorded) -> None:
    statuses = {e.run_id: e.data["status"] for e in study.of("run.finished")}
    for run in [*study.runs("validation"), *study.runs("screening")]:
        result = ledger_cli("audit", "--db", study.url, "--run", run, "--publish")
        assert result.exit_code == (0 if statuses[run] == "completed" else 1), (run, result.output)


# --- 256k tokens, and concurrent windows (tests/data/gpu-lmcache-256k) ------------------------------


@pytest.fixture(scope="module")
def study_256k(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return _imported(tmp_path_factory, STUDY_256K)


def test_at_256k_every_on_window_has_the_tiers_scrapes(study_256k: Recorded) -> None:
    arm, metrics = _arms_and_tier_endpoints(study_256k)
    scraped = tier_scrapes(study_256k.of("metrics.scraped"), metrics)
    for block, a in arm.items():
        want, taken = scraped[block]
        assert taken == ({} if a == "OFF" else want), block
    # The concurrent windows are among the windows the tier was scraped around.
    windows = {k[1] for b, (_, taken) in scraped.items() for k in taken if k[1]}
    assert windows == {"window/4/fixed", "window/4/alternating"}, windows
    assert {e.data["status"] for e in study_256k.of("run.finished")} == {"completed"}


def test_at_256k_lmcaches_lookups_found_exactly_what_vllm_loaded(study_256k: Recorded) -> None:
    screenings = study_256k.runs("screening")
    assert len(screenings) == 2  # the run and its replay
    for run in screenings:
        (sizes,) = study_256k.sql(f"""SELECT DISTINCT q.nominal_tokens AS size, r.prompt_tokens AS prompt
                                      FROM request_sent q JOIN response_received r USING (request_id)
                                      WHERE q.run_id = '{run}' AND q.workload = 'micro'""")
        assert sizes == {"size": 256000, "prompt": 256000}
        steps = _steps(study_256k, run)
        cross, cold = steps["micro", "cross"], steps["micro", "cold"]
        # Every one of the 256,000 prompt tokens of each cross-replica reuse vLLM loaded through
        # the connector, and the service's lookups found each of them; cold, they found none.
        assert cross["n"] == 2 and cross["ext"] == cross["lm_hit"] == cross["lm_req"] == 2 * 256000, cross
        assert cold["n"] == 2 and cold["lm_hit"] == 0 and cold["lm_req"] == 2 * 256000, cold


def test_a_concurrent_windows_lookups_are_the_tiers_whole_delta(study_256k: Recorded) -> None:
    """Each replica's record of a window carries the tier's whole delta (it cannot be split); the
    replicas' external hits summed never exceed it, and where sessions alternate replicas they
    are exactly what the service found. Where each session stays on its replica, vLLM serves the
    reuse locally and loads nothing, while the service's lookups still find it."""
    rows = study_256k.sql("""SELECT h.run_id, h.block_id, h."window", b.arm,
                                    sum(h.external_hit_tokens) AS ext, sum(h.local_hit_tokens) AS loc,
                                    count(DISTINCT h.lmcache_hit_tokens) AS tier_values,
                                    max(h.lmcache_hit_tokens) AS lm_hit, count(*) AS replicas
                             FROM hits_observed h JOIN block_started b USING (block_id)
                             WHERE h.request_id IS NULL GROUP BY ALL""")
    on = [r for r in rows if r["arm"] == "ON"]
    assert len(on) == 2 * 2 * 2  # two runs, two ON blocks each, two windows each
    for r in on:
        assert r["replicas"] == 2 and r["tier_values"] == 1 and r["lm_hit"] > 0, r
        assert r["ext"] <= r["lm_hit"], r
        if r["window"] == "window/4/alternating":
            assert r["ext"] == r["lm_hit"] and r["loc"] == 0, r
        else:
            assert r["ext"] == 0 and r["loc"] > 0, r
    assert all(r["lm_hit"] is None and r["ext"] == 0 for r in rows if r["arm"] == "OFF")


def test_the_replay_sent_the_same_bytes_and_both_runs_publish(study_256k: Recorded) -> None:
    # Request by request (its key, as `ledger replay` compares them): the same payload digests.
    original, replay = study_256k.runs("screening")
    rows = study_256k.sql(f"""SELECT run_id, request_key, payload_sha256 FROM request_sent
                              WHERE run_id IN ('{original}', '{replay}') AND request_key IS NOT NULL""")
    sent = {
        run: {r["request_key"]: r["payload_sha256"] for r in rows if r["run_id"] == run}
        for run in (original, replay)
    }
    assert sent[original] == sent[replay] and len(sent[original]) > 90
    for run in [*study_256k.runs("validation"), original, replay]:
        result = ledger_cli("audit", "--db", study_256k.url, "--run", run, "--publish")
        assert result.exit_code == 0, (run, result.output)
