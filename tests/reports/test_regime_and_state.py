"""A real sim run whose replicas' device cache is small: each block's starting state is recorded,
the report labels each workload's regime from vllm:cache_config_info, and the order effect of
each arm stands beside the ON/OFF change."""

from __future__ import annotations

import json
from statistics import median
from typing import Any

import pytest

from ledger import Event, open_ledger
from reports import derive_report, open_source, to_markdown

from .._cli import ledger_cli

pytestmark = pytest.mark.slow

CAPACITY_BLOCKS = 100  # 1,600 tokens of 16-token blocks: a 2,000-token prompt does not fit
SHAPE = {
    "sizes": [1000, 2000],
    "workloads": ["micro"],
    "chains": 1,
    "warmups": 1,
    "sim_capacity_blocks": CAPACITY_BLOCKS,
    "time_scale": 0.001,
}


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Event], dict[str, Any]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('regime') / 'ledger.db'}"
    args = [a for k, v in SHAPE.items() for a in ("--param", f"{k}={json.dumps(v)}")]
    result = ledger_cli("run", "screening", "--db", url, "--target", "sim", "--no-progress", *args)
    assert result.exit_code in (0, 1), result.output
    led = open_ledger(url)
    try:
        events = list(led.events())
    finally:
        led.close()
    src = open_source(open_ledger(url))
    try:
        report = derive_report(src)
    finally:
        src.close()
        src.ledger.close()
    return url, events, report


def test_every_block_records_its_starting_state_before_its_first_request(ran: Any) -> None:
    _, events, report = ran
    blocks = [e for e in events if e.kind == "block.started"]
    for block in blocks:
        own = [e for e in events if e.block_id == block.block_id]
        (state,) = [e for e in own if e.kind == "cache.inspected"]
        first = next(e for e in own if e.kind == "request.sent")
        assert state.seq < first.seq
        assert state.data["reset_ok"] is True and state.data["kv_cache_usage"] == 0.0
        assert all(r["reset_status"] == 200 for r in state.data["replicas"])
        assert {r["device_cache_tokens"] for r in state.data["replicas"]} == {CAPACITY_BLOCKS * 16}
        # A fresh tier on ON blocks holds nothing yet; OFF blocks have no service to ask.
        assert state.data["lmcache_stored_objects"] == (0 if block.data["arm"] == "ON" else None)
    assert [b["position"] for b in report["block_states"]] == [b.data["index"] for b in blocks]


def test_each_size_is_labelled_against_the_device_cache(ran: Any) -> None:
    _, events, report = ran
    device = {
        int(e.data["cache_config"]["num_gpu_blocks"]) * int(e.data["cache_config"]["block_size"])
        for e in events
        if e.kind == "deployment.launched"
    }
    assert device == {CAPACITY_BLOCKS * 16}
    prompts: dict[int, int] = {}
    sent = {
        e.data["request_id"]: e.data
        for e in events
        if e.kind == "request.sent" and not e.data["warmup"] and e.data.get("probe") is None
    }
    for e in events:
        if e.kind == "response.received" and e.data["request_id"] in sent and e.data["prompt_tokens"]:
            size = sent[e.data["request_id"]]["nominal_tokens"]
            prompts[size] = max(prompts.get(size, 0), e.data["prompt_tokens"])
    rows = {r["nominal_tokens"]: r for r in report["regime"] if r["workload"] == "micro"}
    assert sorted(rows) == sorted(prompts) == [1000, 2000]
    for size, row in rows.items():
        assert (
            row["working_set_tokens"] == prompts[size] and row["device_cache_tokens"] == CAPACITY_BLOCKS * 16
        )
        fits = prompts[size] <= CAPACITY_BLOCKS * 16
        assert row["regime"] == ("fits-in-device-cache" if fits else "exceeds-device-cache")
    assert rows[1000]["regime"] == "fits-in-device-cache" and rows[2000]["regime"] == "exceeds-device-cache"
    markdown = to_markdown(report)
    assert "a shared tier cannot help local reuse here" in markdown
    assert "exceeds-device-cache: the working set exceeds a replica's device cache" in markdown


def test_the_order_effect_compares_each_arms_second_block_with_its_first(ran: Any) -> None:
    _, events, report = ran
    position = {e.block_id: e.data["index"] for e in events if e.kind == "block.started"}
    arm = {e.block_id: e.data["arm"] for e in events if e.kind == "block.started"}
    ttft = {e.data["request_id"]: e.data["ttft_s"] for e in events if e.kind == "response.received"}
    cell = next(
        r for r in report["tables"]["ttft"] if r["nominal_tokens"] == 1000 and r["locality"] == "cold"
    )
    for which in ("OFF", "ON"):
        firsts, seconds = [], []
        for e in events:
            d = e.data
            if e.kind != "request.sent" or d["warmup"] or arm[e.block_id] != which:
                continue
            if (d["workload"], d["step"], d["nominal_tokens"]) == ("micro", "cold", 1000):
                (firsts if position[e.block_id] % 2 == 0 else seconds).append(ttft[d["request_id"]])
        expected = 100 * (median(seconds) / median(firsts) - 1)
        assert cell["order_effect_pct"][which] == pytest.approx(expected, abs=1e-5)
    assert "order effect (2nd vs 1st in pair)" in to_markdown(report)


def test_the_plan_registers_the_shape_the_run_sent(ran: Any) -> None:
    _, events, _ = ran
    (plan,) = [e for e in events if e.kind == "plan.registered"]
    assert plan.data["order"] == ["OFF", "ON", "ON", "OFF"]
    assert plan.data["requests_per_block"] == {
        "micro": {s: 2 for s in ("cold", "cross", "local1", "local2", "receiver_local")}
    }
