"""Assertions, and every injected sim fault caught by one (or by a counter check), recorded not raised."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from collectors import (
    Outcome,
    Scraper,
    check_counters_match,
    check_exact_values,
    check_full_prefix_hit,
    check_matches_cold_reference,
    check_no_external_hits_off,
    check_output_length,
    check_stream_complete,
    check_zero_hits,
    extract_json_object,
    send_request,
    shareable_prefix,
)
from experiments.targets.sim import SimDeployment
from ledger import Ledger, verify
from tests.collectors.helpers import CONFIG, TIME_SCALE, VALUES, LedgerSink, needle_prompt, spec

CHUNK = 256


@pytest.mark.parametrize(
    "text",
    [
        '{"alpha": 1}',
        'Sure! ```json\n{"alpha": 1}\n``` done',
        'The answer: {"alpha": 1}. {"x": 2}',
        'noise { not json } then {"alpha": 1}',
    ],
)
def test_extract_json_object(text: str) -> None:
    assert extract_json_object(text) == {"alpha": 1}


def test_extract_json_object_none() -> None:
    assert extract_json_object("no json here {") is None


def test_shareable_prefix_rule() -> None:
    assert shareable_prefix(256, 256) == 0  # the last token is always computed
    assert shareable_prefix(257, 256) == 256
    assert shareable_prefix(1000, 256) == 768
    assert shareable_prefix(0, 256) == 0


@pytest.fixture
def faulty(request: pytest.FixtureRequest) -> Iterator[SimDeployment]:
    with SimDeployment(2, shared=True, time_scale=TIME_SCALE, fault=request.param) as d:
        yield d


def _outcome(text: str, ok: bool = True, **kw: Any) -> Outcome:
    fields: dict[str, Any] = dict(
        request_id="r",
        status=200 if ok else 500,
        text=text,
        ttft_s=0.1,
        t_first=0.1,
        t_last=0.2,
        e2e_s=0.3,
        prompt_tokens=10,
        output_tokens=4,
        cached_tokens=0,
        finish_reason="stop",
        error=None if ok else "http 500",
        ok=ok,
    )
    fields.update(kw)
    return Outcome(**fields)


def test_exact_values_accepts_quoted_integers_only(sink: LedgerSink) -> None:
    assert check_exact_values(
        sink, _outcome('{"alpha": "938639"}'), {"alpha": 938639}, independent=True, config_sha256=CONFIG
    )
    assert not check_exact_values(
        sink, _outcome('{"alpha": 938639.5}'), {"alpha": 938639}, independent=True, config_sha256=CONFIG
    )
    assert not check_exact_values(
        sink,
        _outcome('{"alpha": 938639}', ok=False),
        {"alpha": 938639},
        independent=False,
        config_sha256=CONFIG,
    )
    events = sink.events("assertion.evaluated")
    assert [e.data["passed"] for e in events] == [True, False, False]
    assert events[2].data["independent"] is False and events[0].data["config_sha256"] == CONFIG


def test_output_length(sink: LedgerSink) -> None:
    assert check_output_length(sink, _outcome("x", output_tokens=512), 512, config_sha256=CONFIG)
    assert not check_output_length(sink, _outcome("x", output_tokens=511), 512, config_sha256=CONFIG)


class Flow:
    """Runs the seed's micro chain through the collectors and evaluates every check."""

    def __init__(self, dep: SimDeployment, sink: LedgerSink) -> None:
        self.dep, self.sink = dep, sink

    def run(
        self,
        steps: list[tuple[int, str, str]],
        prompt: str | None = None,
        timeout_s: float = 30.0,
        **body: Any,
    ) -> list[tuple[Outcome, Any]]:
        prompt = prompt or needle_prompt()

        async def go() -> list[tuple[Outcome, Any]]:
            out = []
            async with httpx.AsyncClient() as c:
                scraper = Scraper(c, self.sink)
                for replica, salt, step in steps:
                    s = spec(self.dep.replica_urls[replica], prompt, salt, replica=replica, step=step, **body)
                    out.append(await scraper.single(s, replica, timeout_s=timeout_s))
            return out

        return asyncio.run(go())

    def cold_reference(self, prompt: str | None = None) -> Outcome:
        async def go() -> Outcome:
            async with httpx.AsyncClient() as c:
                s = spec(self.dep.replica_urls[0], prompt or needle_prompt(), "fresh-salt-ref")
                return await send_request(c, s, self.sink)

        return asyncio.run(go())

    def checks(self, outcome: Outcome, delta: Any, step: str) -> dict[str, bool]:
        kw: dict[str, Any] = {"config_sha256": CONFIG}
        res = {
            "stream_complete": check_stream_complete(self.sink, outcome, **kw),
            "exact_values": check_exact_values(self.sink, outcome, VALUES, independent=True, **kw),
            "counters_match": check_counters_match(
                self.sink, outcome.request_id, delta, outcome.prompt_tokens, outcome.cached_tokens, **kw
            ),
        }
        if step == "cold":
            res["zero_hits"] = check_zero_hits(
                self.sink, outcome.request_id, delta, cached_tokens=outcome.cached_tokens, **kw
            )
        if step == "cross":
            res["full_prefix_hit"] = check_full_prefix_hit(
                self.sink, outcome.request_id, delta, outcome.prompt_tokens, CHUNK, **kw
            )
        return res


MICRO = [(0, "ns", "cold"), (0, "ns", "local1"), (1, "ns", "cross")]


def test_healthy_chain_passes_every_check(dep: SimDeployment, sink: LedgerSink, led: Ledger) -> None:
    flow = Flow(dep, sink)
    results = [flow.checks(o, d, step) for (o, d), (_, _, step) in zip(flow.run(MICRO), MICRO, strict=True)]
    assert all(all(r.values()) for r in results), results
    ref = flow.cold_reference()
    assert check_matches_cold_reference(sink, flow.run([(1, "ns", "hot")])[0][0], ref, config_sha256=CONFIG)
    assert verify(led).ok


@pytest.mark.parametrize("faulty", ["corrupt-transfer", "unordered-copy"], indirect=True)
def test_load_faults_pass_counters_but_fail_values(faulty: SimDeployment, sink: LedgerSink) -> None:
    flow = Flow(faulty, sink)
    (_, _), (_, _), (cross, delta) = flow.run(MICRO)
    res = flow.checks(cross, delta, "cross")
    # Healthy-looking: HTTP 200, complete stream, full prefix hit, counters consistent ...
    assert res["stream_complete"] and res["full_prefix_hit"] and res["counters_match"]
    # ... but the answer is wrong, and differs from the zero-hit computation.
    assert not res["exact_values"]
    assert not check_matches_cold_reference(sink, cross, flow.cold_reference(), config_sha256=CONFIG)
    failed = [e.data for e in sink.events("assertion.evaluated") if not e.data["passed"]]
    assert {f["check"] for f in failed} == {"exact_values", "matches_cold_reference"}
    if faulty.faults.spec() == "unordered-copy":
        assert failed[0]["observed"]["alpha"] == VALUES["alpha"] - 15  # 938639 -> 938624


@pytest.mark.parametrize("faulty", ["namespace-leak@replica=0", "namespace-leak@tier"], indirect=True)
def test_namespace_leak_caught_by_zero_hits(faulty: SimDeployment, sink: LedgerSink) -> None:
    flow = Flow(faulty, sink)
    second = 0 if "replica" in faulty.faults.spec() else 1
    (_, _), (cold, delta) = flow.run([(0, "block-1", "cold"), (second, "block-2", "cold")])
    assert not flow.checks(cold, delta, "cold")["zero_hits"]
    zero = [e.data for e in sink.events("assertion.evaluated") if e.data["check"] == "zero_hits"]
    assert zero[-1]["observed"]["local_hit_tokens"] + zero[-1]["observed"]["external_hit_tokens"] > 0


@pytest.mark.parametrize("faulty", ["stale-counters:after=1"], indirect=True)
def test_stale_counters_caught_by_counter_check(faulty: SimDeployment, sink: LedgerSink) -> None:
    flow = Flow(faulty, sink)
    (_, _), (warm, delta) = flow.run([(0, "ns", "cold"), (0, "ns", "local1")])
    assert delta.prefix_queries == 0 and warm.prompt_tokens and warm.cached_tokens
    assert not flow.checks(warm, delta, "local1")["counters_match"]
    hits = sink.events("hits.observed")[-1].data
    assert hits["prefix_queries"] != hits["prompt_tokens"]  # the audit's counter-mismatch, recorded


@pytest.mark.parametrize("faulty", ["http-errors:every=2"], indirect=True)
def test_http_errors_recorded(faulty: SimDeployment, sink: LedgerSink) -> None:
    flow = Flow(faulty, sink)
    (ok, _), (bad, delta) = flow.run([(0, "ns", "cold"), (0, "ns2", "cold")])
    assert ok.ok and not bad.ok and bad.status == 500 and bad.error and bad.error.startswith("http 500")
    assert not flow.checks(bad, delta, "cold")["stream_complete"]
    assert sink.events("response.received")[-1].data["error"].startswith("http 500")


@pytest.mark.parametrize("faulty", ["truncated-stream:after=2:die=1"], indirect=True)
def test_truncated_stream_recorded(faulty: SimDeployment, sink: LedgerSink) -> None:
    flow = Flow(faulty, sink)
    (cut, delta), (dead, _) = flow.run([(0, "ns", "cold"), (0, "ns", "local1")])
    assert cut.status == 200 and cut.error == "truncated stream: no [DONE]" and cut.content_chunks == 2
    res = flow.checks(cut, delta, "cold")
    assert not res["stream_complete"] and not res["exact_values"]
    assert dead.status == 503 and not dead.ok  # the replica died, as in the seed


@pytest.mark.parametrize("faulty", ["slow-start:requests=1:delay=5000"], indirect=True)
def test_slow_start_times_out_and_is_recorded(faulty: SimDeployment, sink: LedgerSink) -> None:
    flow = Flow(faulty, sink)  # 5000 simulated s x 1e-4 = 0.5 s extra before the first token
    [(slow, delta)] = flow.run([(0, "ns", "cold")], timeout_s=0.2)
    assert slow.error == "timeout" and not slow.ok and slow.ttft_s is None
    assert not flow.checks(slow, delta, "cold")["stream_complete"]
    [(fine, _)] = flow.run([(0, "ns2", "cold")])  # waits for the slow prefill, then is normal
    assert fine.ok


def test_no_external_hits_off(dep: SimDeployment, sink: LedgerSink) -> None:
    dep.set_shared(False)
    flow = Flow(dep, sink)
    for outcome, delta in flow.run([(0, "ns", "cold"), (1, "ns", "cross")]):
        assert check_no_external_hits_off(
            sink, delta, request_id=outcome.request_id, replica=0, config_sha256=CONFIG
        )
    dep.set_shared(True)
    _, (_, delta) = flow.run([(0, "on", "cold"), (1, "on", "cross")])
    assert not check_no_external_hits_off(sink, delta, config_sha256=CONFIG)  # ON would have loaded
