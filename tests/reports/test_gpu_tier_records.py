"""LMCache's own counters beside vLLM's, recorded on a GPU (tests/data/gpu-lmcache-tier).

The LMCache service of every ON block served its Prometheus counters, and the runner scraped
them around every window beside the replicas' (``metrics.scraped`` with ``replica`` ``tier``).
Everything below is derived from the committed export: the tier's scrapes against the windows,
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

STUDY = Path(__file__).resolve().parents[1] / "data" / "gpu-lmcache-tier"


class Recorded:
    def __init__(self, url: str, events: list[Event]) -> None:
        self.url, self.events = url, events

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    def runs(self, experiment: str) -> list[str]:
        return [str(e.run_id) for e in self.of("run.started") if e.data["experiment"] == experiment]

    def sql(self, statement: str) -> list[dict[str, Any]]:
        return ledger_rows(self.url, statement)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    url = f"sqlite:///{tmp_path_factory.mktemp('gpu-tier') / 'ledger.db'}"
    return Recorded(url, import_export(STUDY / "ledger.jsonl.xz", url))


def test_every_on_window_has_the_tiers_scrapes_and_no_off_window_does(study: Recorded) -> None:
    arm = {e.block_id: e.data["arm"] for e in study.of("block.started")}
    metrics = {e.block_id: e.data["metrics_endpoint"] for e in study.of("service.launched")}
    assert metrics and set(metrics) == {b for b, a in arm.items() if a == "ON"}
    assert all(url.startswith("http://127.0.0.1:") for url in metrics.values())
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
