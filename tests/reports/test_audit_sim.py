"""Every audit code planted in the ledger of a real ``sim`` run, and found where it was planted.

One validation run and one clean screening run (small shape, fast sim clock) are shared by the
module; the sim's own faults make their own runs. Flaws that no fault produces are planted the
way an imported or hand-edited ledger carries them: the run's envelopes are edited and imported
into a fresh ledger (sealed again, so the chain verifies), or appended through the ledger's API.
A SIGKILL is a prefix of the run's envelopes (events land in whole batches). Planting tests check
the code, its severity and the finding's target; a clean run draws no blocking finding.
"""

from __future__ import annotations

import copy
import io
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from ledger import NewEvent, export_jsonl, open_ledger
from ledger._cli import cli
from reports import SEVERITY, Finding, audit, open_source
from reports._source import run_scope
from tests._synthetic import LMCACHE_VERSION, Flaws, Generator
from tests.ledger._helpers import tamper_sqlite
from tests.reports._sim_shape import FAST, SMALL, VALIDATION

pytestmark = pytest.mark.slow

Envelope = dict[str, Any]
PLANTED: set[str] = set()


def plants(*codes: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Mark a test as planting ``codes`` (the module must plant every code the audit has)."""
    PLANTED.update(codes)
    return lambda test: test


def _envelopes(url: str) -> list[Envelope]:
    led = open_ledger(url)
    try:
        buf = io.BytesIO()
        export_jsonl(led, buf)
    finally:
        led.close()
    keys = ("id", "ts", "kind", "run_id", "block_id", "data")
    return [{k: e[k] for k in keys} for e in map(orjson.loads, buf.getvalue().splitlines())]


def _run(url: str, experiment: str, *params: str) -> list[Envelope]:
    """``ledger run EXPERIMENT`` on the sim into a fresh ledger at ``url``; its envelopes."""
    result = CliRunner().invoke(
        cli, ["run", experiment, "--db", url, "--target", "sim", *FAST, *params], catch_exceptions=False
    )
    assert result.exit_code in (0, 1), result.output  # 1: the run itself found a failure
    return _envelopes(url)


class Sim:
    """The module's sim runs: validation + clean screening, and one screening per fault (cached)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.validation = _run(self._url("validation"), "validation", *VALIDATION)
        self.screening = _run(self._url("clean"), "screening", *SMALL)
        self._faults: dict[str, list[Envelope]] = {}

    def _url(self, name: str) -> str:
        return f"sqlite:///{self.folder / (name + '.db')}"

    def clean(self) -> list[Envelope]:
        """Validation then the clean screening: a publishable ledger (a fresh copy to edit)."""
        return copy.deepcopy(self.validation + self.screening)

    def fault(self, *params: str) -> list[Envelope]:
        """Validation then a screening run with ``params`` (e.g. a sim fault)."""
        key = " ".join(params)
        if key not in self._faults:
            self._faults[key] = _run(self._url(f"fault{len(self._faults)}"), "screening", *SMALL, *params)
        return copy.deepcopy(self.validation + self._faults[key])


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Sim:
    return Sim(tmp_path_factory.mktemp("sim"))


@pytest.fixture
def found(build_lite: Any) -> Callable[[list[Envelope]], list[Finding]]:
    """Import envelopes into a fresh SQLite ledger (sealed again) and audit it."""
    return lambda envelopes: audit(build_lite(envelopes))


# --- reading and editing envelopes ---------------------------------------------------------------


def _screening_run(envs: list[Envelope]) -> str:
    return next(
        e["run_id"] for e in envs if e["kind"] == "run.started" and e["data"]["experiment"] == "screening"
    )


def _screening(envs: list[Envelope], kind: str) -> list[Envelope]:
    run_id = _screening_run(envs)
    return [e for e in envs if e["kind"] == kind and e["run_id"] == run_id]


def _arms(envs: list[Envelope]) -> dict[str, str]:
    return {e["block_id"]: e["data"]["arm"] for e in envs if e["kind"] == "block.started"}


def _request(envs: list[Envelope], arm: str, step: str, workload: str = "micro", nth: int = 0) -> Envelope:
    """The ``nth`` measured request.sent of ``arm`` at ``step``."""
    arms = _arms(envs)
    return [
        e
        for e in envs
        if e["kind"] == "request.sent"
        and not e["data"]["warmup"]
        and arms.get(e["block_id"]) == arm
        and e["data"]["step"] == step
        and e["data"]["workload"] == workload
    ][nth]


def _of(envs: list[Envelope], kind: str, request_id: str, **match: Any) -> Envelope:
    return next(
        e
        for e in envs
        if e["kind"] == kind
        and e["data"].get("request_id") == request_id
        and all(e["data"].get(k) == v for k, v in match.items())
    )


def _fixture(envs: list[Envelope], check: Envelope) -> Envelope:
    """The fixture.created of a check's request."""
    fixture_id = _of(envs, "request.sent", check["data"]["request_id"])["data"]["fixture_id"]
    return next(e for e in envs if e["kind"] == "fixture.created" and e["data"]["fixture_id"] == fixture_id)


def _codes(findings: list[Finding]) -> dict[str, set[str | None]]:
    out: dict[str, set[str | None]] = {}
    for f in findings:
        out.setdefault(f.code, set()).add(f.target)
    return out


def _one(findings: list[Finding], code: str, target: str | None = None) -> Finding:
    hits = [f for f in findings if f.code == code and (target is None or f.target == target)]
    assert hits, f"no {code} finding{'' if target is None else ' at ' + target}: {_codes(findings)}"
    assert all(f.severity == SEVERITY[code] for f in hits)
    return hits[0]


def _blocking(findings: list[Finding]) -> set[str]:
    return {f.code for f in findings if f.severity == "blocking"}


# --- the clean run ---------------------------------------------------------------------------------


@plants("assertion-not-independent")
def test_a_clean_sim_run_has_no_blocking_finding(sim: Sim, found: Any) -> None:
    findings = found(sim.clean())
    assert _blocking(findings) == set(), [f.detail for f in findings if f.severity == "blocking"]
    assert {f.code for f in findings} == {"assertion-not-independent"}
    assert _screening_run(sim.clean()) in _codes(findings)["assertion-not-independent"]


@plants("import-unpaired", "import-no-hit-counters", "import-unvalidated")
def test_an_imported_result_file_beside_a_clean_sim_run_lacks_what_the_run_has(
    sim: Sim, found: Any, tmp_path: Path
) -> None:
    # A real vllm-bench result file (written by the tool against the CPU engine), imported as a
    # user would; the three findings fall on the import's run, none on the sim's.
    url = f"sqlite:///{tmp_path / 'imported.db'}"
    bench = Path(__file__).parents[1] / "data" / "imports" / "vllm-bench.json"
    result = CliRunner().invoke(cli, ["--db", url, "import", "--from", "vllm-bench", str(bench)])
    assert result.exit_code == 0, result.output
    imported = _envelopes(url)
    (import_run,) = {e["run_id"] for e in imported}
    findings = found(sim.clean() + imported)
    lacks = {"import-unpaired", "import-no-hit-counters", "import-unvalidated"}
    assert {f.code for f in findings if f.run_id == import_run} == lacks
    assert _blocking([f for f in findings if f.run_id != import_run]) == set()
    assert all(f.severity == "blocking" for f in findings if f.code in lacks)


# --- the sim's own faults ----------------------------------------------------------------------------


@plants("namespace-leak")
def test_namespace_leak_fault(sim: Sim, found: Any) -> None:
    envs = sim.fault("--param", "fault=namespace-leak")
    findings = found(envs)
    leaked = {f.target for f in findings if f.code == "namespace-leak"}
    cold = {
        e["data"]["request_id"]: e["data"]["nominal_tokens"]
        for e in _screening(envs, "request.sent")
        if e["data"]["step"] == "cold" and not e["data"]["warmup"]
    }
    assert leaked and {cold[r] for r in leaked if r} == {2000}  # the larger size hit its sibling's prefix
    assert "cached tokens" in _one(findings, "namespace-leak").detail


@plants("assertion-failed")
def test_corrupt_transfer_fault_fails_the_checks_and_draws_no_inconsistency(sim: Sim, found: Any) -> None:
    findings = found(sim.fault("--param", "sim_fault=corrupt-transfer"))
    failed = _one(findings, "assertion-failed")
    assert "failed: expected" in failed.detail
    assert not {"assertion-inconsistent", "hits-inconsistent"} & _blocking(findings)


def _triaged(envs: list[Envelope]) -> dict[str, Envelope]:
    """The screening run's divergence.triaged events by divergent request id."""
    return {e["data"]["request_id"]: e for e in _screening(envs, "divergence.triaged")}


def _failed_answers(envs: list[Envelope]) -> set[str]:
    """Measured answers of the screening run whose exact values or cold reference failed."""
    measured = {e["data"]["request_id"] for e in _screening(envs, "request.sent") if not e["data"]["warmup"]}
    return {
        e["data"]["request_id"]
        for e in _screening(envs, "assertion.evaluated")
        if e["data"]["check"] in ("exact_values", "matches_cold_reference")
        and not e["data"]["passed"]
        and e["data"]["request_id"] in measured
    }


@plants("state-corruption")
def test_corrupt_transfer_divergences_are_triaged_as_state_corruption(sim: Sim, found: Any) -> None:
    envs = sim.fault("--param", "sim_fault=corrupt-transfer")
    triaged = _triaged(envs)
    assert set(triaged) == _failed_answers(envs) and triaged  # every divergent answer, once
    sent = {e["data"]["request_id"]: e["data"] for e in _screening(envs, "request.sent")}
    for request_id, event in triaged.items():
        d = event["data"]
        assert d["classification"] == "state-corruption" and d["resends_agree"], d
        assert d["margin"] is not None and d["margin"] >= d["tie_margin"]
        # Both re-sends went to the replica that answered, under one fresh salt, as probes.
        cold, repeat = sent[d["cold_request_id"]], sent[d["repeat_request_id"]]
        assert cold["replica"] == repeat["replica"] == sent[request_id]["replica"]
        assert cold["namespace"] == repeat["namespace"] != sent[request_id]["namespace"]
        assert cold["probe"] == repeat["probe"] == "triage" and not cold["warmup"]
        assert d["batch_invariant"] == {"available": False, "detail": "the sim has no batch-invariant mode"}
    findings = found(envs)
    assert {f.target for f in findings if f.code == "state-corruption"} == set(triaged)
    assert "the cold re-sends agree" in _one(findings, "state-corruption").detail
    assert not {"numeric-tie", "divergence-inconclusive"} & set(_codes(findings))
    # The probes are never measured: the accounting counts what the plan measured.
    (finished,) = _screening(envs, "run.finished")
    probes = [e for e in _screening(envs, "request.sent") if e["data"].get("probe")]
    assert finished["data"]["probes"] == len(probes) >= 2 * len(triaged)


@plants("numeric-tie")
def test_near_tie_divergences_are_triaged_as_numeric_ties(sim: Sim, found: Any) -> None:
    envs = sim.fault("--param", "sim_fault=near-tie:margin=0.02")
    triaged = _triaged(envs)
    assert set(triaged) == _failed_answers(envs) and triaged
    triggers = {e["data"]["trigger"] for e in triaged.values()}
    assert triggers == {"exact_values", "matches_cold_reference"}
    for event in triaged.values():
        d = event["data"]
        assert d["classification"] == "numeric-tie" and not d["resends_agree"], d
        assert d["margin"] == pytest.approx(0.02) and d["first_divergent_token"] is not None
    findings = found(envs)
    assert {f.target for f in findings if f.code == "numeric-tie"} == set(triaged)
    assert all(f.severity == "info" for f in findings if f.code == "numeric-tie")
    assert "top-2 margin 0.02" in _one(findings, "numeric-tie").detail
    assert not {"state-corruption", "divergence-inconclusive"} & set(_codes(findings))


@plants("divergence-inconclusive")
def test_a_wide_margin_where_cold_answers_disagree_is_inconclusive(sim: Sim, found: Any) -> None:
    envs = sim.fault("--param", "sim_fault=near-tie:margin=0.02")
    event = next(iter(_triaged(envs).values()))
    event["data"]["margin"] = 4.0  # as a ledger edited by hand: the audit derives the class again
    finding = _one(found(envs), "divergence-inconclusive", event["data"]["request_id"])
    assert "recorded as numeric-tie" in finding.detail and finding.severity == "warning"


@plants("isolation-missing")
def test_a_deployment_with_caching_off_fails_its_isolation_certificate(sim: Sim, found: Any) -> None:
    envs = sim.fault("--param", "sim_fault=cache-off")
    (cert,) = _screening(envs, "isolation.certified")
    assert cert["data"]["passed"] is False and cert["data"]["repeat_hit_tokens"] == 0
    assert "the repeat under salt A hit nothing" in cert["data"]["problems"][0]
    finding = _one(found(envs), "isolation-missing", cert["data"]["config_sha256"])
    assert "failed in this run" in finding.detail


def test_a_tier_that_ignores_the_salt_fails_the_isolation_certificate(sim: Sim, found: Any) -> None:
    envs = sim.fault("--param", "sim_fault=namespace-leak@tier")
    (cert,) = _screening(envs, "isolation.certified")
    data = cert["data"]
    assert data["passed"] is False and data["repeat_hit_tokens"] > 0
    # Replica 1 never saw the payload: what it found under salt B came from the tier, under salt A.
    other = {o["replica"]: o for o in data["other_salt"]}
    assert other[1]["external_hit_tokens"] > 0 and other[1]["local_hit_tokens"] == 0
    assert any("replica 1 under salt B saw" in p for p in data["problems"])
    assert "isolation-missing" in _blocking(found(envs))


def test_a_certificate_recorded_as_passed_is_held_to_its_probes_leak(sim: Sim, found: Any) -> None:
    # The tier that ignores the salt, its certificate rewritten as passing (every recorded tier
    # zeroed, no problems): replica 1's probe under salt B still saw external hits in its own
    # hits.observed, and those fail the certificate again.
    envs = sim.fault("--param", "sim_fault=namespace-leak@tier")
    (cert,) = _screening(envs, "isolation.certified")
    data = cert["data"]
    data.update(passed=True, problems=[], other_salt_hit_tokens=0)
    for other in data["other_salt"]:
        other.update(local_hit_tokens=0, external_hit_tokens=0, cached_tokens=0)
    finding = _one(found(envs), "isolation-missing", data["config_sha256"])
    assert "recorded as passed, but its own probes' observations fail it" in finding.detail
    assert "replica 1 under salt B saw" in finding.detail and "external hit tokens" in finding.detail


def _cache_off_forged(sim: Sim, tier: str) -> tuple[list[Envelope], dict[str, Any]]:
    """A caching-off run, its certificate rewritten as passing on a repeat that hit 4,096 tokens
    of ``tier`` (as recorded): the ledger, and the certificate's data."""
    envs = sim.fault("--param", "sim_fault=cache-off")
    (cert,) = _screening(envs, "isolation.certified")
    data = cert["data"]
    data.update(passed=True, problems=[], repeat_hit_tokens=4096)
    data["repeat"].update({tier: 4096})
    return envs, data


@pytest.mark.parametrize("tier", ["local_hit_tokens", "lmcache_hit_tokens"])
def test_a_certificate_recorded_as_passed_is_held_to_its_probes_cache_off(
    sim: Sim, found: Any, tier: str
) -> None:
    # Caching off, its certificate rewritten as passing with a repeat that hit, on the replica's
    # prefix cache or on LMCache's lookup counter alone (the one tier no response or hits record
    # carries): the repeat's own response, hits.observed and scrapes say it hit nothing.
    envs, data = _cache_off_forged(sim, tier)
    finding = _one(found(envs), "isolation-missing", data["config_sha256"])
    assert "the repeat under salt A hit nothing on any tier" in finding.detail


LOOKUP_HITS = "lmcache_mp_lookup_hit_tokens_total"


def _tier_scrapes(
    envs: list[Envelope], request_id: str, before: float | dict[str, float], after: float | dict[str, float]
) -> None:
    """Scrapes of the shared tier around ``request_id`` (as a run with a tier URL records them),
    put after the request's own scrapes in place of the ones the run took: their samples, or the
    LMCache lookup counter's value."""
    envs[:] = [
        e
        for e in envs
        if not (
            e["kind"] == "metrics.scraped"
            and e["data"]["request_id"] == request_id
            and e["data"]["replica"] == "tier"
        )
    ]
    last = max(
        i
        for i, e in enumerate(envs)
        if e["kind"] == "metrics.scraped" and e["data"]["request_id"] == request_id
    )
    template = envs[last]
    added = [
        {
            **template,
            "id": str(uuid.uuid4()),
            "data": {
                **template["data"],
                "replica": "tier",
                "endpoint": "http://127.0.0.1:1",
                "phase": phase,
                "samples": samples if isinstance(samples, dict) else {LOOKUP_HITS: samples},
            },
        }
        for phase, samples in (("before", before), ("after", after))
    ]
    envs[last + 1 : last + 1] = added


@pytest.mark.parametrize(("tier", "replica", "certified"), [(4096, None, True), (0, 4096, False)])
def test_the_lmcache_lookup_tier_is_the_probes_own_scrapes(
    sim: Sim, found: Any, tier: int, replica: int | None, certified: bool
) -> None:
    # Caching off, its certificate rewritten as passing on LMCache's lookup counter alone. Where the
    # repeat's tier scrapes do show the lookup hits, the certificate passes re-derived; where the
    # tier's show none, the replica's own counter does not stand in for it (the tier is what the
    # run scraped for LMCache, as collectors/_metrics.py reads it).
    envs, data = _cache_off_forged(sim, "lmcache_hit_tokens")
    repeat = data["repeat_request_id"]
    _tier_scrapes(envs, repeat, 0, tier)
    if replica is not None:
        for e in envs:
            if (
                e["kind"] == "metrics.scraped"
                and e["data"]["request_id"] == repeat
                and e["data"]["replica"] != "tier"
            ):
                e["data"]["samples"][LOOKUP_HITS] = 0 if e["data"]["phase"] == "before" else replica
    missing = [f for f in found(envs) if f.code == "isolation-missing"]
    if certified:
        assert missing == []
    else:
        (finding,) = missing
        assert "the repeat under salt A hit nothing on any tier" in finding.detail


@pytest.mark.parametrize("salted", [True, False], ids=["its-own-salt", "another-salt"])
def test_a_probe_under_salt_b_is_held_to_the_tiers_own_counters(sim: Sim, found: Any, salted: bool) -> None:
    # A clean run's certificate, passing as recorded; the tier's scrapes around replica 0's probe
    # under salt B show lookup hits, in the series of that probe's own salt or of another salt.
    # Either is a lookup that hit (a leak); only the first is a hit under its own salt.
    envs = sim.clean()
    (cert,) = _screening(envs, "isolation.certified")
    (probe,) = [o for o in cert["data"]["other_salt"] if o["replica"] == 0]
    sent = _of(envs, "request.sent", probe["request_id"])
    salt = sent["data"]["namespace"] if salted else "kvl-someone-else"
    series = f'{LOOKUP_HITS}{{cache_salt="{salt}",model_name="m"}}'
    _tier_scrapes(envs, probe["request_id"], {series: 0.0}, {series: 512.0})
    finding = _one(found(envs), "isolation-missing", cert["data"]["config_sha256"])
    assert "replica 0 under salt B saw 512 LMCache lookup hit tokens" in finding.detail
    assert ("replica 0 under salt B saw 512 LMCache hit tokens of its salt" in finding.detail) is salted


@plants("external-hits-unfound")
def test_external_hits_the_tiers_own_lookups_did_not_find(sim: Sim, found: Any) -> None:
    # A clean run: on every ON cross-replica reuse LMCache's lookups found what vLLM loaded. The
    # tier's after-scrape of one such request rewritten so that its lookups found nothing more:
    # vLLM's external hits now exceed what the service found, and the window is named.
    envs = sim.clean()  # no blocking finding: test_a_clean_sim_run_has_no_blocking_finding
    cross = _request(envs, "ON", "cross")
    rid = cross["data"]["request_id"]
    loaded = _of(envs, "hits.observed", rid)["data"]["external_hit_tokens"]
    before, after = (_of(envs, "metrics.scraped", rid, replica="tier", phase=p) for p in ("before", "after"))
    assert loaded > 0 and any(LOOKUP_HITS in k for k in after["data"]["samples"])
    for key in after["data"]["samples"]:
        if key.startswith(LOOKUP_HITS):
            after["data"]["samples"][key] = before["data"]["samples"].get(key, 0.0)
    finding = _one(found(envs), "external-hits-unfound", rid)
    assert f"{loaded} external hit tokens loaded through the connector" in finding.detail
    assert "the shared tier's own lookups found 0" in finding.detail


def test_a_certificate_whose_probes_are_gone_proves_nothing(sim: Sim, found: Any) -> None:
    # A clean run's certificate, its probes' request.sent dropped: what it names is no longer there.
    envs = sim.clean()
    (cert,) = _screening(envs, "isolation.certified")
    named = {cert["data"]["prime_request_id"], cert["data"]["repeat_request_id"]}
    kept = [e for e in envs if not (e["kind"] == "request.sent" and e["data"]["request_id"] in named)]
    finding = _one(found(kept), "isolation-missing", cert["data"]["config_sha256"])
    assert "the prime under salt A is no isolation probe of this run's" in finding.detail


def _certified_by_another_run(sim: Sim) -> tuple[list[Envelope], str, str, Envelope]:
    """The clean ledger and a second screening run of the same config (another seed), only the
    first screening run's certificate kept (the validation run certifies the config too): the
    ledger, the certifying run, the uncertified run and the certificate."""
    second = sim.fault("--seed", "2")[len(sim.validation) :]
    certifier, uncertified = _screening_run(sim.screening), _screening_run(second)
    envs = [e for e in sim.clean() + second if e["kind"] != "isolation.certified" or e["run_id"] == certifier]
    (cert,) = _screening(envs, "isolation.certified")
    launched = {e["data"]["config_sha256"] for e in second if e["kind"] == "deployment.launched"}
    assert certifier != uncertified and cert["data"]["config_sha256"] in launched
    return envs, certifier, uncertified, cert


def _isolation_of(ledger: Any, run: str, scoped: bool) -> list[Finding]:
    src = open_source(ledger, runs=[run] if scoped else None, verify=True)
    try:
        return [f for f in audit(src, run) if f.code == "isolation-missing"]
    finally:
        src.close()


def test_a_run_without_its_own_certificate_is_certified_by_another_runs_re_derived(
    sim: Sim, build_lite: Any
) -> None:
    # The second run measured the config with no certificate of its own: the first run's, passing
    # as recorded and re-derived from the first run's probes, certifies it, in the second run's own
    # audit too (whose source then holds the first run's observations).
    envs, certifier, uncertified, _ = _certified_by_another_run(sim)
    ledger = build_lite(envs).ledger
    assert certifier in run_scope(ledger, [uncertified]).runs
    assert _isolation_of(ledger, uncertified, scoped=True) == []
    assert _isolation_of(ledger, uncertified, scoped=False) == []


def test_a_run_without_its_own_certificate_reads_only_the_latest_certifiers_run(
    sim: Sim, build_lite: Any
) -> None:
    # Two screening runs certify the config; the scope of a run without its own certificate holds
    # the run of the latest, not every run that ever certified it (a ledger of thousands of runs
    # would otherwise put them all in one run's scope, or in the group of the validation run).
    envs, earlier, uncertified, _ = _certified_by_another_run(sim)
    third = sim.fault("--seed", "3")[len(sim.validation) :]
    latest = _screening_run(third)
    ledger = build_lite(envs + third).ledger
    scope = run_scope(ledger, [uncertified]).runs
    assert latest in scope and earlier not in scope and uncertified in scope
    assert _isolation_of(ledger, uncertified, scoped=True) == []


def test_another_runs_certificate_its_probes_fail_certifies_nothing(sim: Sim, build_lite: Any) -> None:
    # The certifying run's certificate still recorded as passed, its probes' request.sent gone: it
    # is no proof for its own run, nor for the run that relied on it, in either run's own audit.
    envs, certifier, uncertified, cert = _certified_by_another_run(sim)
    named = {cert["data"]["prime_request_id"], cert["data"]["repeat_request_id"]}
    kept = [e for e in envs if not (e["kind"] == "request.sent" and e["data"]["request_id"] in named)]
    ledger = build_lite(kept).ledger
    for scoped in (True, False):
        (relying,) = _isolation_of(ledger, uncertified, scoped)
        assert relying.severity == "blocking" and relying.target == cert["data"]["config_sha256"]
        assert "no isolation certificate of its own in this run" in relying.detail
        assert f"the config's latest recorded as passed (run {certifier}'s, seq " in relying.detail
        assert "the prime under salt A is no isolation probe of this run's" in relying.detail
        (own,) = _isolation_of(ledger, certifier, scoped)
        assert "recorded as passed, but its own probes' observations fail it" in own.detail


def test_a_validation_run_its_observations_contradict_validates_nothing(sim: Sim, build_lite: Any) -> None:
    # One of the validation run's checks, recorded as passed, its response's cached tokens raised by
    # one (no longer what the hit counters add up to): the re-derivation fails it (that run's own
    # assertion-inconsistent). The screening run's own audit, which does not report the validation
    # run's findings, must not publish on it.
    envs = sim.clean()
    run = _screening_run(envs)
    check = next(
        e
        for e in envs
        if e["kind"] == "assertion.evaluated"
        and e["run_id"] != run
        and e["data"]["check"] == "counters_match"
        and e["data"]["passed"]
    )
    _of(envs, "response.received", check["data"]["request_id"])["data"]["cached_tokens"] += 1
    src = build_lite(envs)
    assert _one(audit(src), "assertion-inconsistent").run_id == check["run_id"]
    own = audit(src, run)
    assert "assertion-inconsistent" not in {f.code for f in own}
    missing = _one(own, "validation-missing")
    assert missing.run_id == run
    assert "its validation run passed it as recorded, but its checks' observations fail it" in missing.detail


def test_a_clean_run_certifies_each_on_config_once_before_measuring(sim: Sim, found: Any) -> None:
    envs = copy.deepcopy(sim.screening)
    (cert,) = _screening(envs, "isolation.certified")
    on = {e["block_id"] for e in envs if e["kind"] == "block.started" and e["data"]["arm"] == "ON"}
    assert cert["data"]["passed"] is True and cert["block_id"] in on
    assert cert["data"]["other_salt_hit_tokens"] == 0 < cert["data"]["repeat_hit_tokens"]
    # Before the block's first measured request, after its warmups.
    block = [e for e in envs if e["kind"] == "request.sent" and e["block_id"] == cert["block_id"]]
    kinds = ["warmup" if e["data"]["warmup"] else e["data"].get("probe") or "measured" for e in block]
    assert kinds.index("isolation") > kinds.index("warmup") and kinds.index("measured") > max(
        i for i, k in enumerate(kinds) if k == "isolation"
    )
    # Without its certificate the same run is isolation-missing.
    stripped = [e for e in envs if e["kind"] != "isolation.certified"]
    assert "no isolation certificate" in _one(found(stripped), "isolation-missing").detail


@plants("counter-mismatch", "missing-full-prefix-hit")
def test_stale_counters_fault(sim: Sim, found: Any) -> None:
    envs = sim.fault("--param", "sim_fault=stale-counters")
    findings = found(envs)
    assert "prefix-query increment 0" in _one(findings, "counter-mismatch").detail
    cross = {_request(envs, "ON", "cross", nth=i)["data"]["request_id"] for i in range(2)}
    assert cross <= {f.target for f in findings if f.code == "missing-full-prefix-hit"}
    # Stale counters are what the scrapes say: the recorded hits and verdicts agree with them.
    assert not {"assertion-inconsistent", "hits-inconsistent"} & _blocking(findings)


@plants("hash-seed-unset")
def test_replicas_launched_without_a_hash_seed(sim: Sim, found: Any) -> None:
    envs = sim.fault("--param", "hash_seed=null")
    config = next(
        e["data"]["config_sha256"]
        for e in _screening(envs, "deployment.launched")
        if _arms(envs)[e["block_id"]] == "ON"
    )
    assert "PYTHONHASHSEED (unset)" in _one(found(envs), "hash-seed-unset", config).detail


@plants("run-incomplete")
def test_a_dying_replica_fails_the_run(sim: Sim, found: Any) -> None:
    envs = sim.fault("--param", "sim_fault=truncated-stream:die=1@replica=1")
    findings = found(envs)
    incomplete = _one(findings, "run-incomplete", _screening_run(envs))
    assert incomplete.detail == "screening run finished failed"
    assert "unpaired-request" not in _codes(findings)


def test_a_killed_run_is_one_finding_with_its_unpaired_requests_counted(sim: Sim, found: Any) -> None:
    """SIGKILL in the fourth block: the run is a prefix of its batches, without run.finished."""
    envs = sim.clean()
    blocks = [e["block_id"] for e in _screening(envs, "block.started")]
    cut = next(
        i for i, e in enumerate(envs) if e["block_id"] == blocks[3] and e["kind"] == "session.finished"
    )
    findings = found(envs[:cut])
    third = sum(
        e["kind"] == "request.sent" and e["block_id"] == blocks[2] and not e["data"]["warmup"] for e in envs
    )
    partial = sum(
        e["kind"] == "request.sent" and e["block_id"] == blocks[3] and not e["data"]["warmup"]
        for e in envs[:cut]
    )
    detail = _one(findings, "run-incomplete", _screening_run(envs)).detail
    assert detail == (
        f"screening run has no run.finished; {third - partial} measured request(s) left "
        "without a partner in the other arm"
    )
    assert third - partial > 10 and "unpaired-request" not in _codes(findings)


# --- tampering: a verdict its observations contradict ------------------------------------------------


@plants("hits-inconsistent", "assertion-inconsistent")
def test_cutting_recorded_external_hits_to_a_third_is_found(sim: Sim, found: Any) -> None:
    envs = sim.clean()
    rid = _request(envs, "ON", "cross")["data"]["request_id"]
    hits = _of(envs, "hits.observed", rid)["data"]
    full = hits["external_hit_tokens"]
    hits["external_hit_tokens"] = full // 3  # the full_prefix_hit assertion still says passed
    assert _of(envs, "assertion.evaluated", rid, check="full_prefix_hit")["data"]["passed"] is True
    findings = found(envs)
    assert _one(findings, "hits-inconsistent", rid).detail == (
        f"replica {hits['replica']}: hits.observed records prefix queries {hits['prefix_queries']}, local 0, "
        f"external {full // 3}; its metrics.scraped before/after give prefix queries "
        f"{hits['prefix_queries']}, local 0, external {full}"
    )
    inconsistent = {
        f.detail.split(" ")[0]: f.detail
        for f in findings
        if f.code == "assertion-inconsistent" and f.target == rid
    }
    shareable = _of(envs, "assertion.evaluated", rid, check="full_prefix_hit")["data"]["expected"]
    assert inconsistent["full_prefix_hit"] == (
        f"full_prefix_hit recorded passed (expected {shareable}, observed {full}); its observations give "
        f"failed (expected {shareable}, observed {full // 3})"
    )
    assert "counters_match recorded passed" in inconsistent["counters_match"]
    assert f"hit {full // 3} external" in _one(findings, "missing-full-prefix-hit", rid).detail


def test_recorded_lmcache_lookups_are_held_to_the_tiers_own_scrapes(sim: Sim, found: Any) -> None:
    # A clean run records LMCache's lookups of every ON window from the tier's scrapes around it
    # (the clean test: no hits-inconsistent). One cross-replica reuse's recorded lookup hits
    # doubled: its own replica's scrapes still agree with the rest of the record, the tier's not.
    envs = sim.clean()
    rid = _request(envs, "ON", "cross")["data"]["request_id"]
    hits = _of(envs, "hits.observed", rid)["data"]
    requested, found_tokens = hits["lmcache_requested_tokens"], hits["lmcache_hit_tokens"]
    assert found_tokens is not None and found_tokens > 0 and requested >= found_tokens
    hits["lmcache_hit_tokens"] = 2 * found_tokens
    findings = found(envs)
    detail = _one(findings, "hits-inconsistent", rid).detail
    assert detail.endswith(
        f"LMCache lookups requested {requested}, hit {2 * found_tokens}; its metrics.scraped before/after "
        f"give prefix queries {hits['prefix_queries']}, local {hits['local_hit_tokens']}, external "
        f"{hits['external_hit_tokens']}, LMCache lookups requested {requested}, hit {found_tokens} "
        "(the shared tier's)"
    )


def test_recorded_lmcache_lookups_without_the_tiers_scrapes_are_inconsistent(sim: Sim, found: Any) -> None:
    # A cross-replica reuse's tier scrapes dropped: its recorded lookups have nothing behind them,
    # and the replica's own scrapes (the sim's expose no LMCache counter) give none.
    envs = sim.clean()
    rid = _request(envs, "ON", "cross")["data"]["request_id"]
    hits = _of(envs, "hits.observed", rid)["data"]
    assert hits["lmcache_hit_tokens"] is not None
    kept = [
        e
        for e in envs
        if not (
            e["kind"] == "metrics.scraped"
            and e["data"]["replica"] == "tier"
            and e["data"]["request_id"] == rid
        )
    ]
    detail = _one(found(kept), "hits-inconsistent", rid).detail
    assert detail.endswith(
        f"external {hits['external_hit_tokens']}, LMCache lookups requested None, hit None"
    )


def test_a_hand_edited_verdict_is_inconsistent(sim: Sim, found: Any) -> None:
    """A failing check (corrupt transfer) edited to say passed."""
    envs = sim.fault("--param", "sim_fault=corrupt-transfer")
    edited = next(
        e
        for e in envs
        if e["kind"] == "assertion.evaluated"
        and not e["data"]["passed"]
        and e["data"]["check"] == "matches_cold_reference"
    )
    edited["data"]["passed"] = True
    rid = edited["data"]["request_id"]
    findings = found(envs)
    detail = _one(findings, "assertion-inconsistent", rid).detail
    assert detail.startswith("matches_cold_reference recorded passed")
    assert "observations give failed" in detail
    failed = [f.detail for f in findings if f.code == "assertion-failed" and f.target == rid]
    assert any(d.startswith("matches_cold_reference fails on its observations") for d in failed)
    assert all(d.endswith("(recorded as passed)") for d in failed if "fails on its observations" in d)


def test_an_exact_value_check_against_another_expectation_is_inconsistent(sim: Sim, found: Any) -> None:
    envs = sim.clean()
    check = next(e for e in _screening(envs, "assertion.evaluated") if e["data"]["check"] == "exact_values")
    name = sorted(check["data"]["expected"])[0]
    check["data"]["expected"][name] += 1
    check["data"]["observed"][name] += 1  # answer and expectation edited alike; the verdict left passed
    findings = found(envs)
    detail = _one(findings, "assertion-inconsistent", check["data"]["request_id"]).detail
    # The whole answer is stored (its digest matches): the values are read from it, and agree with
    # the fixture; the recorded expectation and values do not.
    values = orjson.dumps(_fixture(envs, check)["data"]["expected"], option=orjson.OPT_SORT_KEYS).decode()
    answer = _of(envs, "response.received", check["data"]["request_id"])["data"]["output_text_prefix"]
    assert detail.endswith(
        f"its observations give passed (expected {values}, observed {answer}) — the "
        "recorded expectation is not its fixture's"
    )


# --- flaws no fault makes: edited envelopes or appended events ----------------------------------------


@plants("unpaired-request")
def test_unpaired_request(sim: Sim, found: Any) -> None:
    envs = sim.clean()
    off = _request(envs, "OFF", "local1")["data"]
    on = _request(envs, "ON", "local1")
    gone = off["request_id"]
    kept = [
        e
        for e in envs
        if e["data"].get("request_id") != gone and e["data"].get("reference_request_id") != gone
    ]
    on_ids = {
        e["data"]["request_id"]
        for e in kept
        if e["kind"] == "request.sent" and e["block_id"] == on["block_id"] and e["data"]["step"] == "local1"
    }
    findings = found(kept)
    unpaired = _one(findings, "unpaired-request")
    assert unpaired.target in on_ids and "ON request" in unpaired.detail


@plants("pair-payload-mismatch", "pair-gpu-mismatch")
def test_pair_mismatches(sim: Sim, found: Any) -> None:
    envs = sim.clean()
    payload, gpu = (_request(envs, "OFF", "local2", nth=n)["data"] for n in (0, 1))
    payload["payload_sha256"] = "0" * 64
    gpu["gpu"] = {"index": 7, "name": "sim", "uuid": None}
    findings = found(envs)
    assert (
        f"payload differs from OFF partner {payload['request_id']}"
        in _one(findings, "pair-payload-mismatch").detail
    )
    mismatch = _one(findings, "pair-gpu-mismatch")
    assert f"target GPU differs from OFF partner {gpu['request_id']}" in mismatch.detail


@plants("warmup-in-measurement")
def test_warmup_in_measurement(sim: Sim, found: Any) -> None:
    envs = sim.clean()
    session = _screening(envs, "session.finished")[0]
    warmup = next(
        e["data"]["request_id"]
        for e in envs
        if e["kind"] == "request.sent" and e["block_id"] == session["block_id"] and e["data"]["warmup"]
    )
    session["data"]["requests"].append(warmup)
    assert _one(found(envs), "warmup-in-measurement", warmup)


@plants("off-arm-external-hits")
def test_off_arm_external_hits(sim: Sim, found: Any) -> None:
    envs = sim.clean()
    rid = _request(envs, "OFF", "cross")["data"]["request_id"]
    _of(envs, "hits.observed", rid)["data"]["external_hit_tokens"] = 512
    findings = found(envs)
    assert _one(findings, "off-arm-external-hits", rid).detail == "OFF block observed 512 external hit tokens"
    assert _one(findings, "hits-inconsistent", rid)  # the scrapes say 0


@plants("checkpoint-mismatch", "checkpoint-unverified", "declared-exclusion")
def test_appended_checkpoint_audits_and_exclusion(sim: Sim, found: Any, build_lite: Any) -> None:
    envs = sim.clean()
    run_id = _screening_run(envs)
    block = _screening(envs, "block.started")[0]["block_id"]
    ledger = build_lite(envs).ledger
    file = {"name": "model.safetensors", "bytes": 10, "sha256": "a" * 64}
    audited = {"stable": True, "missing": []}
    ledger.append_many(
        [
            NewEvent(
                "checkpoint.audited",
                {
                    **audited,
                    "path": "/models/bad",
                    "revision": "r1",
                    "matched": False,
                    "files": [{**file, "expected_sha256": "b" * 64}],
                },
                run_id,
            ),
            NewEvent(
                "checkpoint.audited",
                {**audited, "path": "/models/bare", "revision": None, "matched": None, "files": [file]},
                run_id,
            ),
            NewEvent(
                "exclusion.declared",
                {"scope": "block", "target": block, "reason": "host maintenance"},
                run_id,
            ),
        ]
    )
    src = open_source(ledger)
    try:
        findings = audit(src)
    finally:
        src.close()
    assert "model.safetensors (SHA-256)" in _one(findings, "checkpoint-mismatch", "/models/bad").detail
    assert _one(findings, "checkpoint-unverified", "/models/bare")
    assert _one(findings, "declared-exclusion", block).detail == "block excluded: host maintenance"


@plants("provenance-missing")
@pytest.mark.parametrize("branch", ["code version", "package versions", "launch records", "checkpoint audit"])
def test_every_branch_of_provenance_missing(sim: Sim, found: Any, branch: str) -> None:
    envs = sim.clean()
    run_id = _screening_run(envs)
    started = next(e for e in envs if e["kind"] == "run.started" and e["run_id"] == run_id)["data"]
    if branch == "code version":
        started["code"] = {"commit": None}
    elif branch == "package versions":
        started["packages"] = {}
    elif branch == "launch records":
        envs = [e for e in envs if not (e["kind"] == "deployment.launched" and e["run_id"] == run_id)]
    else:  # a vllm run must audit its checkpoint
        started["params"]["target"] = "vllm"
    assert _one(found(envs), "provenance-missing", run_id).detail == f"run lacks {branch}"


@plants("validation-missing")
def test_screening_without_a_validation_run(sim: Sim, found: Any) -> None:
    envs = copy.deepcopy(sim.screening)
    config = next(
        e["data"]["config_sha256"]
        for e in envs
        if e["kind"] == "deployment.launched" and _arms(envs)[e["block_id"]] == "ON"
    )
    assert "service regression" in _one(found(envs), "validation-missing", config).detail


@plants("order-unbalanced")
def test_blocks_in_another_order(sim: Sim, found: Any) -> None:
    envs = sim.clean()
    third, fourth = [e["data"] for e in _screening(envs, "block.started")][2:]
    third["index"], fourth["index"] = fourth["index"], third["index"]  # ran OFF–ON–OFF–ON
    detail = _one(found(envs), "order-unbalanced", "OFF–ON–OFF–ON").detail
    assert "but the run recorded order" in detail


def test_a_run_planned_with_one_arm_is_not_paired(sim: Sim, found: Any) -> None:
    """needle_eval plans one OFF block: no ON partner is missing, and no order can be unbalanced."""
    url = sim._url("needle_eval")
    envs = _run(url, "needle_eval", "--param", "sizes=[1024]", "--param", "fixtures=2")
    assert [e["data"]["order"] for e in envs if e["kind"] == "block.started"] == [["OFF"]]
    codes = _codes(found(envs))
    assert not {"unpaired-request", "order-unbalanced"} & set(codes), codes
    report = CliRunner().invoke(cli, ["report", "--db", url, "--markdown"], catch_exceptions=False)
    assert report.exit_code == 0 and "unpaired" not in report.output, report.output


def test_a_paired_plan_that_lost_its_on_blocks_is_still_paired(sim: Sim, found: Any) -> None:
    """The plan (recorded order), not the blocks that happened to run, decides that a run is paired."""
    envs = sim.clean()
    on = {b for b, arm in _arms(envs).items() if arm == "ON"}
    kept = [e for e in envs if e["block_id"] not in on]
    findings = found(kept)
    unbalanced = _one(findings, "order-unbalanced", "OFF–OFF").detail
    assert 'recorded order ["OFF","ON","ON","OFF"]' in unbalanced
    assert _one(findings, "unpaired-request").detail.startswith("OFF request")


# --- the stack guard ------------------------------------------------------------------------------

EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"


@plants("metrics-missing")
def test_a_counter_missing_from_the_scrapes_is_not_a_zero(sim: Sim, found: Any) -> None:
    """Replica 1 of the first ON block scraped without the connector's hit counter: its windows record
    null external hits, which the tables would read as zero; the audit blocks instead."""
    envs = sim.clean()
    block = next(b for b, arm in _arms(_screening(envs, "block.started")).items() if arm == "ON")
    edited = 0
    for e in envs:
        if e["block_id"] != block or str(e["data"].get("replica")) != "1":
            continue
        if e["kind"] == "metrics.scraped":
            samples = e["data"]["samples"]
            for key in [k for k in samples if k == EXTERNAL_HITS or k.startswith(EXTERNAL_HITS + "{")]:
                del samples[key]
        elif e["kind"] == "hits.observed":
            e["data"]["external_hit_tokens"] = None
            edited += 1
    findings = found(envs)
    missing = _one(findings, "metrics-missing", "replica 1")
    assert missing.block_id == block
    assert missing.detail.startswith(
        f"{EXTERNAL_HITS} missing from {edited} window(s)' scrapes (vLLM 0.33.0+sim"
    )
    assert len([f for f in findings if f.code == "metrics-missing"]) == 1
    assert "hits-inconsistent" not in _codes(findings)  # the scrapes and the record agree: both lack it


@plants("known-incompatible-stack")
def test_an_on_config_on_a_known_bad_stack(sim: Sim, found: Any) -> None:
    envs = sim.clean()
    on = {b for b, arm in _arms(_screening(envs, "block.started")).items() if arm == "ON"}
    configs = set()
    for e in _screening(envs, "deployment.launched"):
        if e["block_id"] in on:
            e["data"]["engine_version"], e["data"]["lmcache_version"] = "0.26.0", "0.5.2"
            configs.add(e["data"]["config_sha256"])
    findings = found(envs)
    (config,) = configs
    detail = _one(findings, "known-incompatible-stack", config).detail
    assert detail.startswith("vLLM 0.26.0 with LMCache 0.5.2: LMCache 0.5.2 stores KV in a packed layout")
    assert "metrics-missing" not in _codes(findings)  # vLLM 0.26 exposes the same hit counters


# --- pre-registration ----------------------------------------------------------------------------


def _measured(envs: list[Envelope], block_id: str, workload: str, step: str) -> int:
    return sum(
        1
        for e in envs
        if e["kind"] == "request.sent"
        and e["block_id"] == block_id
        and not e["data"]["warmup"]
        and (e["data"]["workload"], e["data"]["step"]) == (workload, step)
    )


@plants("plan-deviation")
def test_a_run_held_to_another_plan_deviates_where_it_differs(sim: Sim, found: Any) -> None:
    envs = sim.clean()
    (plan,) = _screening(envs, "plan.registered")
    plan["data"]["requests_per_block"]["micro"]["cold"] += 1
    plan["data"]["sizes"]["micro"] = plan["data"]["sizes"]["micro"][:1]
    plan["data"]["thresholds"]["chunk_size"] *= 2
    plan["data"]["order"] = ["ON", "OFF", "OFF", "ON"]
    findings = [f for f in found(envs) if f.code == "plan-deviation"]
    assert all(f.severity == "blocking" for f in findings)
    blocks = _screening(envs, "block.started")
    by_block: dict[str | None, str] = {}
    for f in findings:
        by_block[f.block_id] = by_block.get(f.block_id, "") + " | " + f.detail
    counted = [f for f in findings if "micro/cold" in f.detail]
    assert len(counted) == len(blocks)  # every block sent one cold micro request fewer than registered
    for b in blocks:
        sent = _measured(envs, b["block_id"], "micro", "cold")
        assert f"micro/cold: {sent} sent, {sent + 1} registered" in by_block[b["block_id"]]
    orders = [
        f.detail for f in findings if f.target and f.target.startswith("block ") and " ran " in f.detail
    ]
    assert len(orders) == len(blocks)  # the registered order is the mirror image of the one that ran
    run_level = " | ".join(f.detail for f in findings if f.block_id is None)
    assert "micro sizes ran [1000, 2000], registered [1000]" in run_level
    assert "full_prefix_hit checked with chunk [256], registered 512" in run_level


@pytest.mark.parametrize("where", ["late", "lost"])
def test_a_plan_registered_late_or_lost_deviates(sim: Sim, found: Any, where: str) -> None:
    envs = sim.clean()
    (plan,) = _screening(envs, "plan.registered")
    envs.remove(plan)
    if where == "late":
        first = next(
            i for i, e in enumerate(envs) if e["kind"] == "request.sent" and e["run_id"] == plan["run_id"]
        )
        envs.insert(first + 1, plan)
    detail = _one(found(envs), "plan-deviation", plan["run_id"]).detail
    assert (
        detail
        == {
            "late": "plan registered after the run's first request",
            "lost": "no plan.registered before the first request",
        }[where]
    )


@plants("plan-unregistered")
def test_a_run_recorded_before_plans_were_registered(sim: Sim, found: Any) -> None:
    """A run whose runner registered no plans (run.started without registers_plan) is a warning:
    it predates pre-registration; its blocks are judged by what they recorded."""
    envs = sim.clean()
    run_id = _screening_run(envs)
    envs = [e for e in envs if not (e["kind"] == "plan.registered" and e["run_id"] == run_id)]
    next(e for e in envs if e["kind"] == "run.started" and e["run_id"] == run_id)["data"].pop(
        "registers_plan"
    )
    findings = found(envs)
    assert "predates pre-registration" in _one(findings, "plan-unregistered", run_id).detail
    assert not [f for f in findings if f.code == "plan-deviation"]
    assert _blocking(findings) == set()


def test_an_experiment_that_sends_more_than_it_registered(sim: Sim, found: Any, tmp_path: Path) -> None:
    """A real sim run of an experiment whose last block sends one request more than its plan says."""
    script = tmp_path / "drifting.py"
    script.write_text(DRIFTING, encoding="utf-8")
    envs = _run(sim._url("drifting"), str(script))
    last = _screening_blocks(envs)[-1]
    findings = found(envs)
    deviation = _one(findings, "plan-deviation", "block 3")
    assert deviation.block_id == last and deviation.detail == "OFF block: micro/cold: 2 sent, 1 registered"
    assert len([f for f in findings if f.code == "plan-deviation"]) == 1


def _screening_blocks(envs: list[Envelope]) -> list[str]:
    return [e["block_id"] for e in envs if e["kind"] == "block.started"]


DRIFTING = """
NAME = "drifting"
PARAMS = {"block_pairs": 2, "namespace_tag": None}


def planned(params):
    return {"blocks": 4, "requests_per_block": 1, "warmups_per_block": 0}


def plan(params):
    return {"requests": {"micro": {"cold": 1}}, "sizes": {"micro": [1000]}}


async def run(ctx):
    async def block(b):
        for i in range(2 if b.index == 3 else 1):
            ns = ctx.namespace("drift", b.index, i)
            fx = await ctx.fixture(ctx.fixture_key("drift", i), 1000, ns)
            await b.request(fx.messages, replica=0, namespace=ns, workload="micro", step="cold",
                            key=f"drift/{i}", fixture=fx, prompt_tokens=fx.prompt_tokens)

    await ctx.run_blocks(ctx.block_plan(ctx.params["block_pairs"]), block)
"""


@plants("blocks-not-restarted")
def test_blocks_not_restarted(sim: Sim, found: Any) -> None:
    envs = sim.clean()
    started = _screening(envs, "block.started")[0]
    started["data"]["restarted"] = False
    assert _one(found(envs), "blocks-not-restarted", started["block_id"])


@plants("tier-warm-at-start")
def test_a_shared_tier_that_held_data_before_the_block_began(sim: Sim, found: Any) -> None:
    # The sim starts a fresh tier for every ON block and records it empty (0 stored chunks: the
    # clean run draws no such warning). The second ON block's record edited to say the tier
    # already held 12 chunks and, as LMCache's service would say it, 3 MiB.
    envs = sim.clean()
    arms = _arms(envs)
    inspected = [e for e in _screening(envs, "cache.inspected") if arms[e["block_id"]] == "ON"]
    assert [e["data"]["lmcache_stored_objects"] for e in inspected] == [0, 0]
    assert all(e["data"]["lmcache_metric"] == "sim_lmcache_stored_chunks" for e in inspected)
    warm = inspected[1]
    warm["data"].update(
        lmcache_stored_objects=12,
        lmcache_stored_bytes=3 << 20,
        lmcache_bytes_metric="lmcache_mp_l1_memory_usage_bytes",
    )
    findings = found(envs)
    assert [f.target for f in findings if f.code == "tier-warm-at-start"] == [warm["block_id"]]
    assert _one(findings, "tier-warm-at-start", warm["block_id"]).detail.endswith(
        "the shared tier held 12 (sim_lmcache_stored_chunks) and 3,145,728 "
        "(lmcache_mp_l1_memory_usage_bytes) before the block's first request: what earlier "
        "blocks stored can be served in this one"
    )


@plants("ttft-method-mixed")
def test_ttft_dated_by_different_methods(sim: Sim, found: Any) -> None:
    # Two real runs, the second choosing httpx: each uniform, the ledger-wide table mixed.
    other = sim.fault("--param", "ttft_method=httpx-read")[len(sim.validation) :]
    envs = sim.clean() + other
    assert {e["data"]["ttft_method"] for e in other if e["kind"] == "response.received"} == {"httpx-read"}
    runs = _one(found(envs), "ttft-method-mixed", "runs")
    assert f"httpx-read: {_screening_run(other)[:8]}" in runs.detail


@plants("ttft-method-mixed")
def test_one_run_dated_by_two_methods(sim: Sim, found: Any) -> None:
    # One run whose measured response was dated in user space (the kernel gave that read no stamp).
    envs = sim.clean()
    rid = _request(envs, "ON", "cross")["data"]["request_id"]
    response = _of(envs, "response.received", rid)["data"]
    kernel = response["ttft_method"]
    response["ttft_method"] = "socket-read"
    mixed = _one(found(envs), "ttft-method-mixed", _screening_run(envs))
    assert "socket-read (1)" in mixed.detail and f"{kernel} (" in mixed.detail


def _probe_run(make: Callable[[Generator], None], **flaws: bool) -> list[Envelope]:
    """A GPU probe run as recorded on a GPU host and imported (tests/_synthetic.py writes it)."""
    gen = Generator(flaws=Flaws(**flaws))
    make(gen)
    return gen.out


@plants("pinned-rounding")
def test_a_rounded_pinned_pool_probe_imported_beside_the_run(sim: Sim, found: Any) -> None:
    probe = _probe_run(Generator.pool_probes, pinned_rounding=True)
    finding = _one(found(sim.clean() + probe), "pinned-rounding", f"{(1 << 30) + 4096} bytes")
    assert finding.run_id == probe[0]["run_id"] and f"reserved {1 << 31} bytes" in finding.detail


@plants("helper-probe-failed")
def test_an_on_config_on_the_lazy_allocator_whose_helper_probe_failed(sim: Sim, found: Any) -> None:
    envs = sim.clean()
    on = [e for e in _screening(envs, "deployment.launched") if _arms(envs)[e["block_id"]] == "ON"]
    for launch in on:  # as the vllm target records a GPU-path LMCache launch on its lazy allocator
        launch["data"].update(
            transfer_path="gpu", lmcache_version=LMCACHE_VERSION, lmcache_allocator="lazy", lmcache_ops=False
        )
    detail = _one(
        found(envs + _probe_run(Generator.helper_probes)),
        "helper-probe-failed",
        on[0]["data"]["config_sha256"],
    ).detail
    assert detail.startswith(f"lazy allocator on LMCache {LMCACHE_VERSION}: ") and "failed" in detail


@plants("chain-broken")
def test_an_edited_row_breaks_the_chain(sim: Sim, build_lite: Any, sqlite_url: str) -> None:
    src = build_lite(sim.clean())
    seq = src.scalar("SELECT min(seq) FROM events WHERE kind = 'hits.observed'")
    tamper_sqlite(
        sqlite_url,
        [f"UPDATE events SET data = replace(data, '\"replica\":', '\"replica\": ') WHERE seq = {seq}"],
    )
    assert _one(audit(src), "chain-broken", str(seq))


@plants("snapshot-mismatch")
def test_a_tampered_snapshot_file(sim: Sim, build_lite: Any, tmp_path: Path) -> None:
    ledger = build_lite(sim.clean()).ledger
    root = tmp_path / "snapshots"
    open_source(ledger, root).close()
    target = next(
        p
        for p in sorted(root.rglob("*.parquet"))
        if "projection" in str(p) and "ttft_s" in pq.read_schema(p).names
    )
    table = pq.read_table(target)
    column = table.schema.get_field_index("ttft_s")
    halved = table.set_column(column, "ttft_s", pc.multiply(table.column("ttft_s"), 0.5))
    pq.write_table(halved, target)
    src = open_source(ledger, root, verify=True)
    try:
        assert _one(audit(src), "snapshot-mismatch")
    finally:
        src.close()


def _sent(envs: list[Envelope], run_id: str) -> list[Envelope]:
    """The measured request.sent of ``run_id``."""
    return [
        e for e in envs if e["kind"] == "request.sent" and e["run_id"] == run_id and not e["data"]["warmup"]
    ]


@plants("request-id-reused")
def test_a_request_id_sent_twice_in_a_run_is_found(sim: Sim, found: Any) -> None:
    # A measured ON request's request.sent re-labelled with an OFF request's id: two request.sent
    # carry that id, and every table would join the first response, hits and assertions of that
    # id to both.
    envs = sim.clean()
    run = _screening_run(envs)
    taken = _request(envs, "OFF", "cold")["data"]["request_id"]
    _request(envs, "ON", "cold")["data"]["request_id"] = taken
    reused = [f for f in found(envs) if f.code == "request-id-reused"]
    assert [(f.run_id, f.target) for f in reused] == [(run, taken)]
    assert reused[0].severity == "blocking"
    assert "2 request.sent carry this request id (2 of them this run's" in reused[0].detail


def test_a_request_id_sent_by_two_runs_is_found_in_each(sim: Sim, found: Any) -> None:
    # A screening request re-labelled with a request id of the validation run: one finding for each
    # run that sent it, each naming both runs.
    envs = sim.clean()
    run = _screening_run(envs)
    validation = next(e["run_id"] for e in envs if e["kind"] == "run.started" and e["run_id"] != run)
    taken = _sent(envs, validation)[0]["data"]["request_id"]
    _sent(envs, run)[0]["data"]["request_id"] = taken
    reused = [f for f in found(envs) if f.code == "request-id-reused"]
    assert sorted((f.run_id, f.target) for f in reused) == sorted([(run, taken), (validation, taken)])
    assert all(", ".join(sorted([run, validation])) in f.detail for f in reused)
    assert all(f.severity == "blocking" for f in reused)


@plants("block-id-reused")
def test_a_block_id_started_by_two_runs_is_found_in_each(sim: Sim, found: Any) -> None:
    # The screening run's first block, every event of it, re-labelled with the id of the validation
    # run's block (as two ledgers merged by hand could carry it): one finding for each run, and no
    # request-id-reused for the requests the joins then meet twice.
    envs = sim.clean()
    run = _screening_run(envs)
    (validation_block,) = {e["block_id"] for e in envs if e["kind"] == "block.started" and e["run_id"] != run}
    first = next(e["block_id"] for e in envs if e["kind"] == "block.started" and e["run_id"] == run)
    for e in envs:
        if e["block_id"] == first:
            e["block_id"] = validation_block
    findings = found(envs)
    reused = [f for f in findings if f.code == "block-id-reused"]
    assert sorted(f.run_id for f in reused) == sorted(
        {e["run_id"] for e in envs if e["kind"] == "run.started"}
    )
    assert {f.target for f in reused} == {validation_block}
    assert all(f.severity == "blocking" and "2 block.started carry this block id" in f.detail for f in reused)
    assert not [f for f in findings if f.code == "request-id-reused"]


def test_every_audit_code_is_planted_in_a_sim_ledger() -> None:
    assert set(SEVERITY) == PLANTED, sorted(set(SEVERITY) ^ PLANTED)
