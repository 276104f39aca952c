"""End to end on real engines: a scaled screening OFF–ON–ON–OFF against the ``vllm`` target.

Two real vLLM replicas (and, in ON blocks, a real LMCache service) are launched
by kvledger for every block, on this CPU machine with the target's default
model: the committed needle model, whose answers mean something up to the
size its card serves, so every answer is also checked value by value.
Everything below is asserted from the ledger the run wrote (events and the
per-kind SQL views), never from the run's own return values.

One module-scoped run is shared by every test (it takes a few minutes: four
deployments of two replicas each).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from experiments import needle

from .._cli import ledger_cli, param_args
from ._runs import RecordedRun, recorded

pytestmark = pytest.mark.engines

CHUNK = 256  # the LMCache service's chunk (the target's default chunk_size)
# The smallest shape in which each assertion below still means something: two block pairs (the
# balanced design), and two micro sizes, one small and one near the top of the engine tests' 1k-3k.
SHAPE: dict[str, Any] = {
    "block_pairs": 2,
    "sizes": [1000, 3000],
    "chains": 1,
    "session_sizes": [1500],
    "sessions": 1,
    "session_turns": 2,
    "turn_growth": 300,
    "generation_sizes": [1000],
    "generation_outputs": [32],
    "window_sessions": [2],
    "window_turns": 2,
    "window_size": 1000,
    "warmups": 2,
    "warmup_tokens": 300,
    "max_tokens": 48,
}
# Planted secrets, passed to the engines through pass_env (never through params).
HF = "hf_" + "PlantedSecretToken0123456789"
SK = "sk-" + "plantedSecret0123456789abcdef"
MIRROR = f"https://mirror-user:{SK}@mirror.invalid/simple"


@dataclass
class Run(RecordedRun):
    wall_s: float = 0.0
    logs: Path = Path()


def _params(logs: Path) -> list[str]:
    return param_args({**SHAPE, "pass_env": ["HF_TOKEN", "KVL_MIRROR_URL"], "logs_dir": str(logs)})


@pytest.fixture(scope="module")
def run(engines: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("vllm-screening")
    url, logs = f"sqlite:///{tmp / 'ledger.db'}", tmp / "engine-logs"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_TOKEN", HF)
        mp.setenv("KVL_MIRROR_URL", MIRROR)
        t0 = time.monotonic()
        result = ledger_cli(
            "run", "screening", "--target", "vllm", "--db", url, "--no-progress", *_params(logs)
        )
        wall = time.monotonic() - t0
    base = recorded(url, result)
    print(f"\nscreening on vllm: {wall:.0f} s wall, exit {result.exit_code}\n{result.output}")
    yield Run(**vars(base), wall_s=wall, logs=logs)


def _failed(run: Run) -> list[dict[str, Any]]:
    return [e.data for e in run.of("assertion.evaluated") if not e.data["passed"]]


def _first_divergence(a: str, b: str) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"first divergent character at {i}: {a[i : i + 20]!r} vs {b[i : i + 20]!r}"


def test_run_completes_and_every_check_passes(run: Run) -> None:
    texts = {
        e.data["request_id"]: e.data.get("output_text_prefix") or "" for e in run.of("response.received")
    }
    problems = []
    for f in _failed(run):
        if f["check"] == "matches_cold_reference":
            # Report where greedy output from reused KV leaves the cold answer; never weaken the check.
            problems.append(
                f"{f['request_id']}: "
                + _first_divergence(texts[f["request_id"]], texts[f["reference_request_id"]])
            )
        else:
            problems.append(json.dumps(f, sort_keys=True)[:400])
    assert not problems, "\n".join(problems)
    assert run.exit_code == 0, run.output
    (finished,) = run.of("run.finished")
    assert finished.data["status"] == "completed" and finished.data["failed_blocks"] == []
    blocks = run.of("block.finished")
    assert [b.data["arm"] for b in blocks] == ["OFF", "ON", "ON", "OFF"]
    assert all(b.data["status"] == "completed" for b in blocks)
    assert all(b.data["restarted"] for b in run.of("block.started"))


def test_launches_stops_and_checkpoint_are_recorded(run: Run) -> None:
    started = {e.block_id: e.data for e in run.of("block.started")}
    launched = run.of("deployment.launched")
    assert Counter(e.block_id for e in launched) == dict.fromkeys(started, 2)
    for e in launched:
        d, arm = e.data, started[e.block_id]["arm"]
        assert d["config_sha256"] == started[e.block_id]["config_sha256"]
        assert d["engine"] == "vllm" and d["engine_version"] == "0.32.0" and d["target"] == "vllm"
        assert d["transfer_path"] == "cpu" and d["restarted"] and not d["attached"]
        # /server_info is asked for and its answer recorded: vLLM serves it in development mode only.
        assert d["server_info_status"] == 404 and d["server_info"] is None
        assert d["model"]["path"] == str(needle.CHECKPOINT) and d["model"]["served_name"] == "needle"
        assert d["cache_config"] and d["cache_config"]["enable_prefix_caching"] == "True"
        assert (d["kv_connector"] is not None) == (arm == "ON")
        assert ("--kv-transfer-config" in d["command"]) == (arm == "ON")
    services = run.of("service.launched")
    assert sorted(started[e.block_id]["arm"] for e in services) == ["ON", "ON"]
    assert all(e.data["chunk_size"] == CHUNK and e.data["version"] == "0.5.6" for e in services)
    # LMCache's copy path as observed in the service's Python as each ON block started: the CPU
    # build resolves its CPU device ops, with no compiled extension; the replicas' launches agree.
    for e in services:
        assert e.data["ops"] is False and e.data["ops_observed"].endswith(": CpuDeviceOps on cpu")
    on_launches = [e.data["lmcache"] for e in launched if started[e.block_id]["arm"] == "ON"]
    assert len(on_launches) == 4 and all(lm["ops"] is False for lm in on_launches)
    on, off = (
        {d["config_sha256"] for d in started.values() if d["arm"] == "ON"},
        {d["config_sha256"] for d in started.values() if d["arm"] == "OFF"},
    )
    assert len(on) == len(off) == 1 and on != off  # the same config each time, distinct per arm
    stopped = run.of("deployment.stopped") + run.of("service.stopped")
    assert len(stopped) == 8 + 2
    # The service was alive until it was stopped: its metrics answered just before.
    assert [e.data["health_at_stop"] for e in run.of("service.stopped")] == [200, 200]
    for e in stopped:
        assert e.data["health_at_stop"] in (200, None) and not e.data["exited_before_stop"]
        for log in e.data["logs"]:  # the record pins the log files kept beside the ledger
            data = Path(log["path"]).read_bytes()
            assert log["bytes"] == len(data) and log["sha256"] == hashlib.sha256(data).hexdigest()
    assert {e.data["exit_code"] for e in run.of("deployment.stopped")} == {0}
    (audit,) = run.of("checkpoint.audited")
    assert audit.block_id is None and audit.data["matched"] is True and audit.data["stable"] is True
    assert audit.data["revision"].startswith("needle-") and len(audit.data["files"]) >= 6
    assert audit.data["reference"] == f"manifest:{needle.MANIFEST}"


def test_warmups_reach_every_replica_before_measuring(run: Run) -> None:
    for block in {e.block_id for e in run.of("block.started")}:
        first: dict[int, bool] = {}
        for e in run.of("request.sent"):
            if e.block_id == block:
                first.setdefault(e.data["replica"], e.data["warmup"])
        assert first == {0: True, 1: True}, block


def test_off_blocks_have_zero_external_hits(run: Run) -> None:
    rows = run.sql("""
        SELECT b.arm, h.request_id, h."window", h.external_hit_tokens
        FROM hits_observed h JOIN block_started b USING (block_id)""")
    off = [r for r in rows if r["arm"] == "OFF"]
    assert off and all(r["external_hit_tokens"] == 0 for r in off)
    assert any(r["window"] for r in off)  # concurrent windows too
    # And the ON blocks did load through the connector, or the OFF zero would prove nothing.
    assert sum(r["external_hit_tokens"] or 0 for r in rows if r["arm"] == "ON") > 0


def _requests(run: Run) -> list[dict[str, Any]]:
    return run.sql("""
        SELECT b.arm, b."index" AS block, q.request_id, q.workload, q.step, q.replica, q.warmup,
               q.nominal_tokens, r.prompt_tokens, r.cached_tokens, r.ttft_s, r.error,
               h.local_hit_tokens, h.external_hit_tokens, h.prefix_queries
        FROM request_sent q JOIN block_started b USING (block_id)
        JOIN response_received r USING (request_id) JOIN hits_observed h USING (request_id)
        ORDER BY q.seq""")


def test_on_cross_steps_load_the_whole_shareable_prefix(run: Run) -> None:
    cross = [
        r for r in _requests(run) if r["arm"] == "ON" and r["workload"] == "micro" and r["step"] == "cross"
    ]
    assert len(cross) == 2 * len(SHAPE["sizes"])
    for r in cross:
        shareable = (r["prompt_tokens"] - 1) // CHUNK * CHUNK  # the rule of collectors/_assertions.py
        assert r["local_hit_tokens"] == 0, r
        assert r["external_hit_tokens"] == shareable == r["cached_tokens"], r
        print(
            f"ON cross {r['nominal_tokens']}: prompt {r['prompt_tokens']}, "
            f"external {r['external_hit_tokens']}, TTFT {r['ttft_s'] * 1000:.0f} ms"
        )
    checks = [a.data for a in run.of("assertion.evaluated") if a.data["check"] == "full_prefix_hit"]
    assert len(checks) == len(cross) and all(c["passed"] for c in checks)


def test_on_blocks_record_the_lmcache_services_own_lookup_counters(run: Run) -> None:
    """The service's Prometheus counters are scraped around every ON window, beside the replicas':
    LMCache's own account of each lookup, by cache_salt, next to vLLM's."""
    started = {e.block_id: e.data["arm"] for e in run.of("block.started")}
    endpoints = {e.block_id: e.data["metrics_endpoint"] for e in run.of("service.launched")}
    assert all(url and url.startswith("http://127.0.0.1:") for url in endpoints.values())
    tier = [e for e in run.of("metrics.scraped") if e.data["replica"] == "tier"]
    assert {e.block_id for e in tier} == {b for b, arm in started.items() if arm == "ON"}
    assert all(e.data["endpoint"] == endpoints[e.block_id] and e.data["error"] is None for e in tier)
    rows = {r["request_id"]: r for r in run.sql("SELECT * FROM hits_observed WHERE request_id IS NOT NULL")}
    on = [r for r in _requests(run) if r["arm"] == "ON" and not r["warmup"]]
    off = [r for r in _requests(run) if r["arm"] == "OFF"]
    assert off and all(rows[r["request_id"]]["lmcache_hit_tokens"] is None for r in off)
    cross = [r for r in on if r["workload"] == "micro" and r["step"] == "cross"]
    cold = [r for r in on if r["step"] == "cold"]
    assert cross and cold
    # What vLLM loaded through the connector, LMCache's lookups found: the two accounts agree.
    for r in cross:
        assert rows[r["request_id"]]["lmcache_hit_tokens"] >= r["external_hit_tokens"] > 0, r
    assert all(rows[r["request_id"]]["lmcache_hit_tokens"] == 0 for r in cold)


def test_each_on_block_starts_on_an_empty_shared_tier_read_from_its_own_metrics(run: Run) -> None:
    """cache.inspected reads the service's resident bytes from its metrics endpoint before the
    block's first request: a service started for the block holds nothing; OFF blocks have none."""
    started = {e.block_id: e.data["arm"] for e in run.of("block.started")}
    states = {e.block_id: e.data for e in run.of("cache.inspected")}
    assert set(states) == set(started)
    for block, arm in started.items():
        state = states[block]
        if arm == "ON":
            assert state["lmcache_stored_bytes"] == 0, state
            assert state["lmcache_bytes_metric"] == "lmcache_mp_l1_memory_usage_bytes", state
        else:
            assert state["lmcache_stored_bytes"] is None and state["lmcache_bytes_metric"] is None, state
    report = ledger_cli("report", "--db", run.url, "--run", run.run_id, "--markdown")
    assert report.exit_code == 0, report.output
    blocks = report.output.split("## Blocks: starting cache state", 1)[1]
    assert blocks.count("| 0 bytes resident |") == sum(1 for a in started.values() if a == "ON")


def test_cold_steps_have_zero_hits(run: Run) -> None:
    cold = [r for r in _requests(run) if r["step"] == "cold" and not r["warmup"]]
    assert len(cold) == 4 * (len(SHAPE["sizes"]) + len(SHAPE["generation_sizes"]))
    assert all(r["local_hit_tokens"] == 0 == r["external_hit_tokens"] == r["cached_tokens"] for r in cold)
    assert all(r["prefix_queries"] == r["prompt_tokens"] for r in cold)


def test_reuse_matches_the_cold_reference(run: Run) -> None:
    checks = [a.data for a in run.of("assertion.evaluated") if a.data["check"] == "matches_cold_reference"]
    # local1, local2, cross, receiver_local per size, in each of the four blocks
    assert len(checks) == 4 * 4 * len(SHAPE["sizes"])
    assert all(c["passed"] for c in checks), [c for c in checks if not c["passed"]]


def test_exact_values_are_checked_and_pass_cold_and_on_every_reuse(run: Run) -> None:
    checks = [a.data for a in run.of("assertion.evaluated") if a.data["check"] == "exact_values"]
    steps = {
        e.data["request_id"]: (e.data["workload"], e.data["step"])
        for e in run.of("request.sent")
        if not e.data["warmup"] and not e.data.get("probe")
    }
    checked = Counter(steps[c["request_id"]] for c in checks)
    # Every measured answer but the forced-length decodes (no question answered there).
    assert sum(checked.values()) == sum(1 for w, _ in steps.values() if w != "generation")
    for step in ("cold", "local1", "local2", "cross", "receiver_local"):
        assert checked["micro", step] == 4 * len(SHAPE["sizes"]), step
    assert checked["session", "turn"] > 0 and checked["concurrency", "turn"] > 0
    assert all(c["passed"] for c in checks), [c for c in checks if not c["passed"]][:3]
    started = {e.block_id: e.data["arm"] for e in run.of("block.started")}
    sent = {e.data["request_id"]: e.block_id for e in run.of("request.sent")}
    on_cross = [
        c
        for c in checks
        if steps[c["request_id"]] == ("micro", "cross") and started[sent[c["request_id"]]] == "ON"
    ]
    assert len(on_cross) == 2 * len(SHAPE["sizes"])  # answers from KV loaded from the other replica
    (note,) = run.of("note.added")  # sizes beyond the card's limit are declared not applicable
    assert note.data["answers_meaningful"] is True
    served = needle.load_card().served_max_tokens
    assert note.data["meaningful_up_to_tokens"] == served
    assert note.data["text"].startswith(f"exact_values checks not applicable to prompts over {served} tokens")
    (started_run,) = run.of("run.started")
    assert started_run.data["target"]["answers_meaningful"] is True


def test_the_on_config_is_certified_isolated_before_it_is_measured(run: Run) -> None:
    # LMCache 0.5.6 keys chunks with vLLM's cache_salt: a repeat under salt A hits, salt B sees nothing.
    (cert,) = run.of("isolation.certified")
    d = cert.data
    assert d["passed"] is True, d["problems"]
    assert d["repeat_hit_tokens"] > 0 and d["other_salt_hit_tokens"] == 0
    assert [o["replica"] for o in d["other_salt"]] == [0, 1]
    assert all(o["local_hit_tokens"] == 0 == o["external_hit_tokens"] for o in d["other_salt"])
    # LMCache's own counters were read, not left unproven: the service's lookups under salt B
    # found nothing, overall and in the series labelled with salt B; the repeat's found its prefix.
    assert all(o["lmcache_hit_tokens"] == 0 == o["lmcache_salt_hit_tokens"] for o in d["other_salt"])
    assert None not in (d["repeat"]["lmcache_hit_tokens"], d["repeat"]["lmcache_salt_hit_tokens"])
    started = {e.block_id: e.data for e in run.of("block.started")}
    assert (
        started[cert.block_id]["arm"] == "ON"
        and started[cert.block_id]["config_sha256"] == d["config_sha256"]
    )
    assert not run.of("divergence.triaged")  # every answer matched: nothing to triage


def test_report_and_audit_derive_from_the_events(run: Run) -> None:
    report = ledger_cli("report", "--db", run.url, "--run", run.run_id, "--json")
    assert report.exit_code == 0, report.output
    acc = json.loads(report.output)["accounting"]
    finished = run.of("run.finished")[0].data
    assert (
        acc["measured"]
        == finished["measured"]
        == len([e for e in run.of("request.sent") if not e.data["warmup"] and not e.data.get("probe")])
    )
    assert acc["warmups"] == finished["warmups"] == 4 * 2
    assert acc["exact_value_checks"] == acc["exact_value_passed"] > 0 and acc["excluded_blocks"] == []
    assert acc["pairs"] == acc["matched_pairs"] > 0
    audit = ledger_cli("audit", "--db", run.url, "--run", run.run_id, "--json")
    assert audit.exit_code == 0, audit.output  # without --publish the audit only reports
    findings = json.loads(audit.output)["findings"]
    blocking = {f["code"] for f in findings if f["severity"] == "blocking"}
    # No validation run has passed for this ON config in this ledger: that, and only that, blocks.
    assert blocking == {"validation-missing"}, findings
    publish = ledger_cli("audit", "--db", run.url, "--run", run.run_id, "--publish")
    assert publish.exit_code == 1


def test_planted_secrets_appear_nowhere_in_the_ledger(run: Run, tmp_path: Path) -> None:
    out = tmp_path / "ledger.jsonl"
    result = ledger_cli("export", "--db", run.url, "--jsonl", str(out))
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert len(data) > 100_000
    for secret in (HF, SK, HF[3:], SK[3:]):
        assert secret.encode() not in data
    # The variables did reach the launches, redacted.
    for e in run.of("deployment.launched"):
        assert e.data["env"]["HF_TOKEN"] == "[REDACTED]"
        assert e.data["env"]["KVL_MIRROR_URL"] == "https://mirror-user:[REDACTED]@mirror.invalid/simple"
    assert os.environ.get("HF_TOKEN") != HF  # the planted value did not leak into this process either
