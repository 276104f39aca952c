"""The screening over the real sim on loopback, into a real SQLite ledger."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from experiments._loader import load
from experiments.runner import prepare_params

from .._cli import ledger_cli, param_args
from .._tier import tier_scrapes
from .conftest import REPO, SMALL, events, run_ids


def _run(url: str, *extra: str) -> object:
    return ledger_cli("run", "screening", "--db", url, "--no-progress", *extra)


def test_counts_follow_the_shape(sqlite_url: str) -> None:
    result = _run(sqlite_url, *param_args(SMALL))
    assert result.exit_code == 0, result.output
    (rid,) = run_ids(sqlite_url)
    exp = load("screening")
    plan = exp.planned(prepare_params(exp, "sim", SMALL))
    sent = events(sqlite_url, "request.sent", rid)
    per_block: Counter[tuple[str | None, bool]] = Counter(
        (e.block_id, e.data["warmup"]) for e in sent if not e.data.get("probe")
    )
    blocks = [e for e in events(sqlite_url, "block.started", rid)]
    assert [b.data["arm"] for b in blocks] == ["OFF", "ON", "ON", "OFF"]
    for b in blocks:
        assert per_block[(b.block_id, False)] == plan["requests_per_block"] == 20 + 6 + 4 + 20
        assert per_block[(b.block_id, True)] == 2
    # Warmups reached every replica before measuring.
    warm = {(e.block_id, e.data["replica"]) for e in sent if e.data["warmup"]}
    assert len(warm) == 2 * len(blocks)
    finished = events(sqlite_url, "run.finished", rid)[0].data
    assert finished["status"] == "completed" and finished["measured"] == 4 * 50
    # ON and OFF send identical payloads (pairing by payload SHA-256); the isolation
    # certificate's probes, once before the first ON block measures, are not paired.
    by_arm: dict[str, set[str]] = {}
    arm_of = {b.block_id: b.data["arm"] for b in blocks}
    probes = [e for e in sent if e.data.get("probe")]
    assert {e.data["probe"] for e in probes} == {"isolation"} and len(probes) == 2 + 2
    assert {arm_of[e.block_id] for e in probes} == {"ON"} and finished["probes"] == len(probes)
    for e in sent:
        if e.data.get("probe"):
            continue
        by_arm.setdefault(arm_of[e.block_id], set()).add(e.data["payload_sha256"])
    assert by_arm["ON"] == by_arm["OFF"]
    kinds = Counter(e.kind for e in events(sqlite_url, run_id=rid))
    for kind in (
        "deployment.launched",
        "service.launched",
        "fixture.created",
        "hits.observed",
        "metrics.scraped",
        "session.finished",
        "window.finished",
        "assertion.evaluated",
    ):
        assert kinds[kind] > 0, kind


def test_on_blocks_scrape_the_shared_tier_around_every_window(sqlite_url: str) -> None:
    # LMCache's own lookup counters (the sim's tier serves them as the service does) are recorded
    # beside the replicas' around every ON window, single request or concurrent; OFF blocks share
    # through nothing and scrape none.
    result = _run(sqlite_url, *param_args(SMALL))
    assert result.exit_code == 0, result.output
    (rid,) = run_ids(sqlite_url)
    arm = {e.block_id: e.data["arm"] for e in events(sqlite_url, "block.started", rid)}
    services = {e.block_id: e.data["endpoint"] for e in events(sqlite_url, "service.launched", rid)}
    scraped = tier_scrapes(events(sqlite_url, "metrics.scraped", rid), services)
    for block, a in arm.items():
        want, taken = scraped[block]
        assert want and taken == (want if a == "ON" else {}), (block, a)
    assert sum(a == "ON" for a in arm.values()) == 2
    hits = events(sqlite_url, "hits.observed", rid)
    assert all((e.data["lmcache_hit_tokens"] is not None) == (arm[e.block_id] == "ON") for e in hits)
    # The certificate's LMCache tiers were read from them, none left unproven.
    (cert,) = events(sqlite_url, "isolation.certified", rid)
    tiers = [cert.data["repeat"], *cert.data["other_salt"]]
    assert all(None not in (t["lmcache_hit_tokens"], t["lmcache_salt_hit_tokens"]) for t in tiers)
    assert cert.data["repeat"]["lmcache_salt_hit_tokens"] > 0 and cert.data["passed"]


def test_default_shape_is_the_seed_design() -> None:
    exp = load("screening")
    plan = exp.planned(prepare_params(exp, "sim", {}))
    assert plan == {
        "micro": 40,
        "session": 48,
        "generation": 8,
        "concurrency": 96,
        "blocks": 4,
        "warmups_per_block": 6,
        "requests_per_block": 192,
    }
    params = prepare_params(exp, "sim", {})
    assert params["order"] is None and params["block_pairs"] == 2


@pytest.mark.slow
def test_default_screening_end_to_end(sqlite_url: str) -> None:
    """The default screening shape on sim: 4 x (192 + 6), at time scale 0.001 (the target's
    default is 0.005): what is asserted counts requests, blocks and failed checks, none of which
    depends on how long the sim sleeps."""
    result = _run(sqlite_url, "--param", "time_scale=0.001")
    assert result.exit_code == 0, result.output
    (rid,) = run_ids(sqlite_url)
    blocks = events(sqlite_url, "block.started", rid)
    assert [b.data["arm"] for b in blocks] == ["OFF", "ON", "ON", "OFF"]
    assert [b.data["gpu_swap"] for b in blocks] == [False, False, True, True]
    sent = events(sqlite_url, "request.sent", rid)
    counts = Counter((e.block_id, e.data["warmup"]) for e in sent if not e.data.get("probe"))
    for b in blocks:
        assert counts[(b.block_id, False)] == 192 and counts[(b.block_id, True)] == 6
    assert events(sqlite_url, "run.finished", rid)[0].data["failed_assertions"] == 0


def test_namespace_leak_makes_a_cold_request_hit(sqlite_url: str) -> None:
    shape = {**SMALL, "workloads": ["micro"], "sizes": [2000, 4000]}
    result = _run(sqlite_url, *param_args(shape), "--param", "fault=namespace-leak")
    assert result.exit_code == 1, result.output
    (rid,) = run_ids(sqlite_url)
    cold = {
        e.data["request_id"]: e.data
        for e in events(sqlite_url, "request.sent", rid)
        if e.data["step"] == "cold" and not e.data["warmup"]
    }
    hits = [e.data for e in events(sqlite_url, "hits.observed", rid) if e.data["request_id"] in cold]
    leaked = [h for h in hits if (h["local_hit_tokens"] or 0) > 0]
    assert leaked and all(cold[h["request_id"]]["nominal_tokens"] == 4000 for h in leaked)
    failed = [
        e.data
        for e in events(sqlite_url, "assertion.evaluated", rid)
        if e.data["check"] == "zero_hits" and not e.data["passed"]
    ]
    assert failed
    namespaces = {d["namespace"] for d in cold.values()}
    assert not any("2000" in ns or "4000" in ns for ns in namespaces)


def test_example_experiment_runs(sqlite_url: str) -> None:
    result = ledger_cli(
        "run", str(REPO / "experiments/examples/hello.py"), "--db", sqlite_url, "--no-progress"
    )
    assert result.exit_code == 0, result.output
    (rid,) = run_ids(sqlite_url)
    started = events(sqlite_url, "run.started", rid)[0].data
    assert started["experiment"] == "hello" and started["seed"] == 7
    assert started["params"]["target"] == "sim" and started["source"].startswith('"""A minimal')


def test_server_faults_are_recorded_not_raised(sqlite_url: str) -> None:
    shape = {**SMALL, "workloads": ["micro"], "sizes": [1000]}
    result = _run(sqlite_url, *param_args(shape), "--param", "sim_fault=http-errors:every=4")
    assert result.exit_code == 1, result.output
    (rid,) = run_ids(sqlite_url)
    errors = [e.data for e in events(sqlite_url, "response.received", rid) if e.data["error"]]
    assert errors and all(d["status"] == 500 for d in errors)
    assert [b.data["status"] for b in events(sqlite_url, "block.finished", rid)] == ["completed"] * 4


def test_a_dying_replica_fails_its_block_and_the_run_goes_on(sqlite_url: str) -> None:
    shape = {**SMALL, "workloads": ["micro"], "sizes": [1000]}
    fault = "truncated-stream:after=1:die=1@replica=1"
    result = _run(sqlite_url, *param_args(shape), "--param", f"sim_fault={fault}")
    assert result.exit_code == 1, result.output
    (rid,) = run_ids(sqlite_url)
    finished = events(sqlite_url, "block.finished", rid)
    assert [b.data["status"] for b in finished] == ["failed"] * 4  # every block ran
    assert "unhealthy" in finished[0].data["error"]
    run = events(sqlite_url, "run.finished", rid)[0].data
    assert run["status"] == "failed" and run["failed_blocks"] == [0, 1, 2, 3]


def test_params_recorded_for_replay(sqlite_url: str, tmp_path: Path) -> None:
    result = _run(sqlite_url, *param_args({**SMALL, "workloads": ["generation"]}))
    assert result.exit_code == 0, result.output
    (rid,) = run_ids(sqlite_url)
    params = events(sqlite_url, "run.started", rid)[0].data["params"]
    assert params["namespace_tag"].startswith("kvl") and params["generation_outputs"] == [16, 32]
    outs = [
        e.data for e in events(sqlite_url, "assertion.evaluated", rid) if e.data["check"] == "output_length"
    ]
    assert outs and all(d["passed"] for d in outs)


def test_a_crashing_experiment_is_recorded_failed(sqlite_url: str, tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(
        "PARAMS = {'namespace_tag': None}\n"
        "async def run(ctx):\n"
        "    async def block(b):\n"
        "        await b.warmups(2, 300)\n"
        "        raise RuntimeError('boom')\n"
        "    await ctx.run_blocks(ctx.block_plan(1), block)\n"
    )
    result = ledger_cli("run", str(script), "--db", sqlite_url, "--no-progress")
    assert result.exit_code == 1, result.output
    (rid,) = run_ids(sqlite_url)
    run = events(sqlite_url, "run.finished", rid)[0].data
    assert run["status"] == "failed" and "boom" in run["error"] and run["warmups"] == 2
    assert [b.data["status"] for b in events(sqlite_url, "block.finished", rid)] == ["failed"]


def test_progress_bars_render(sqlite_url: str) -> None:
    import asyncio

    from experiments.runner import run_experiment
    from ledger import open_ledger

    exp = load(str(REPO / "experiments/examples/hello.py"))
    led = open_ledger(sqlite_url)
    try:
        result = asyncio.run(run_experiment(led, exp, prepare_params(exp, "sim", {}), progress=True))
    finally:
        led.close()
    assert result.exit_code == 0 and result.counters.measured == 4 * 3  # two block pairs, 3 each
