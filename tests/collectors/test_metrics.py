"""Scrapes and hit deltas as seen through the collectors: counters move as vLLM's do."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from collectors import (
    HitDelta,
    Scraper,
    counter_delta,
    hits_between,
    parse_exposition,
    scrape_metrics,
    send_request,
)
from collectors._assertions import shareable_prefix
from experiments._isolation import salt_hit_tokens
from experiments.targets.sim import SimDeployment
from ledger import Ledger, verify
from tests.collectors.helpers import LedgerSink, needle_prompt, spec

BLOCK, CHUNK = 16, 256

EXPOSITION = """\
# HELP vllm:prefix_cache_hits Prefix cache hits, tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m",engine="0"} 32.0
vllm:prefix_cache_hits_total{model_name="m",engine="1"} 16.0
# TYPE lmcache_mp_lookup_hit_tokens counter
lmcache_mp_lookup_hit_tokens_total{model_name="m",cache_salt="a\\"b"} 256.0
# TYPE up gauge
up 1
"""


def test_parse_keys_keep_total_and_sort_labels() -> None:
    s = parse_exposition(EXPOSITION)
    assert s['vllm:prefix_cache_hits_total{engine="0",model_name="m"}'] == 32.0
    assert s['lmcache_mp_lookup_hit_tokens_total{cache_salt="a\\"b",model_name="m"}'] == 256.0
    assert s["up"] == 1.0


def test_counter_delta_sums_label_sets_and_reports_resets() -> None:
    before = parse_exposition(EXPOSITION)
    after = dict(before)
    after['vllm:prefix_cache_hits_total{engine="0",model_name="m"}'] = 48.0
    after['vllm:prefix_cache_hits_total{engine="1",model_name="m"}'] = 20.0
    assert counter_delta(before, after, "vllm:prefix_cache_hits_total") == (20, False)
    after['vllm:prefix_cache_hits_total{engine="1",model_name="m"}'] = 4.0  # restarted
    assert counter_delta(before, after, "vllm:prefix_cache_hits_total") == (20, True)
    assert counter_delta(before, after, "vllm:absent_total") == (None, False)
    d = hits_between(before, after)
    assert d.local_hit_tokens == 20 and d.counter_reset and d.prefix_queries is None


def test_a_tier_reset_is_named_but_is_no_reset_of_the_replicas_counters() -> None:
    # counter_reset is what the replica's own window shows (what counters_match relies on, and
    # what the audit re-derives from the replica's scrapes); the tier's restart is only named.
    replica = parse_exposition(EXPOSITION)
    lookup = 'lmcache_mp_lookup_hit_tokens_total{cache_salt="s",model_name="m"}'
    d = hits_between(replica, replica, {lookup: 512.0}, {lookup: 256.0})
    assert d.lmcache_hit_tokens == 256 and not d.counter_reset
    assert d.resets == ("lmcache_mp_lookup_hit_tokens_total",)
    # Without a tier, LMCache's counters are the replica's own (an in-process connector's).
    went_down = {**replica, lookup: 0.0}
    assert hits_between({**replica, lookup: 512.0}, went_down).counter_reset


def _single(
    dep: SimDeployment, sink: LedgerSink, plan: list[tuple[int, str]], prompt: str
) -> list[tuple[int, HitDelta, int | None]]:
    async def go() -> list[tuple[int, HitDelta, int | None]]:
        out = []
        async with httpx.AsyncClient() as c:
            scraper = Scraper(c, sink, tier_url=dep.shared_url)
            for replica, salt in plan:
                o, d = await scraper.single(
                    spec(dep.replica_urls[replica], prompt, salt, replica=replica), replica
                )
                assert o.ok, o.error
                assert o.prompt_tokens is not None
                out.append((o.prompt_tokens, d, o.cached_tokens))
        return out

    return asyncio.run(go())


def test_same_prompt_twice_then_salt_then_other_replica(
    dep: SimDeployment, sink: LedgerSink, led: Ledger
) -> None:
    prompt = needle_prompt()
    rows = _single(dep, sink, [(0, "a"), (0, "a"), (0, "b"), (1, "a"), (1, "a")], prompt)
    n = rows[0][0]
    cold, local, salted, cross, local_again = (d for _, d, _ in rows)
    assert (cold.prefix_queries, cold.local_hit_tokens, cold.external_hit_tokens) == (n, 0, 0)
    assert cold.lmcache_requested_tokens == n and cold.lmcache_hit_tokens == 0
    # vLLM computes at least the last token: local hits are whole blocks of n - 1.
    assert local.local_hit_tokens == (n - 1) // BLOCK * BLOCK and local.external_hit_tokens == 0
    assert rows[1][2] == local.local_hit_tokens  # usage.cached_tokens agrees
    assert salted.local_hit_tokens == 0 and salted.external_hit_tokens == 0  # the salt namespaces
    assert cross.local_hit_tokens == 0 and cross.external_hit_tokens == shareable_prefix(n, CHUNK)
    assert cross.external_queries == n and cross.lmcache_hit_tokens == shareable_prefix(n, CHUNK)
    assert local_again.local_hit_tokens == (n - 1) // BLOCK * BLOCK
    assert local_again.external_hit_tokens == 0  # the connector only loads what is missing
    observed = sink.events("hits.observed")
    assert [e.data["request_id"] for e in observed] == [
        e.data["request_id"] for e in sink.events("request.sent")
    ]
    assert all(e.data["prompt_tokens"] == n for e in observed)
    scrapes = sink.events("metrics.scraped")
    assert len(scrapes) == 4 * len(rows)  # replica and tier, before and after
    assert {e.data["phase"] for e in scrapes} == {"before", "after"}
    assert any(k.startswith("vllm:prefix_cache_queries_total{") for k in scrapes[0].data["samples"])
    assert verify(led).ok


def test_the_salts_own_lmcache_counters_are_read_where_the_tier_keeps_them(
    dep: SimDeployment, sink: LedgerSink
) -> None:
    # The replicas expose no LMCache counters; the shared tier does, labelled by cache_salt. A
    # cross-replica repeat under one salt hits that salt's series, and the samples a caller reads
    # for it (the isolation certificate's per-salt tier) are the tier's.
    async def go() -> list[int | None]:
        async with httpx.AsyncClient() as c:
            scraper = Scraper(c, sink, tier_url=dep.shared_url)
            out = []
            for replica in (0, 1):
                o, _ = await scraper.single(
                    spec(dep.replica_urls[replica], prompt, "s1", replica=replica), replica
                )
                assert o.ok, o.error
                out.append(salt_hit_tokens(*scraper.last_samples, "s1"))
            return out

    prompt = needle_prompt(tag="salted")
    cold, cross = asyncio.run(go())
    assert cold == 0 and cross is not None and cross > 0
    replica_keys = next(e for e in sink.events("metrics.scraped") if e.data["replica"] == 0).data["samples"]
    assert not any(k.startswith("lmcache") for k in replica_keys)


def test_shared_tier_off_means_no_external_traffic(dep: SimDeployment, sink: LedgerSink) -> None:
    dep.set_shared(False)
    prompt = needle_prompt(tag="off")
    rows = _single(dep, sink, [(0, "x"), (1, "x")], prompt)
    for _, d, cached in rows:
        assert d.external_hit_tokens == 0 and d.external_queries == 0 and cached == 0
        assert not d.lmcache_requested_tokens  # no lookup: the tier's series never appear (None)


def test_concurrent_window_emits_one_hits_event_per_replica(dep: SimDeployment, sink: LedgerSink) -> None:
    async def go() -> dict[int | str, HitDelta]:
        async with httpx.AsyncClient() as c:
            scraper = Scraper(c, sink)
            urls: dict[int | str, str] = dict(enumerate(dep.replica_urls))
            async with scraper.window(urls, "w1") as w:
                await asyncio.gather(
                    *(
                        send_request(
                            c,
                            spec(dep.replica_urls[i % 2], needle_prompt(tag=str(i)), "w", replica=i % 2),
                            sink,
                        )
                        for i in range(6)
                    )
                )
            return w.deltas

    deltas = asyncio.run(go())
    assert set(deltas) == {0, 1}
    events = sink.events("hits.observed")
    assert len(events) == 2 and all(e.data["window"] == "w1" and e.data["request_id"] is None for e in events)
    assert all((d.prefix_queries or 0) > 0 for d in deltas.values())


def test_failed_scrape_is_recorded_not_raised(sink: LedgerSink) -> None:
    async def go() -> None:
        async with httpx.AsyncClient() as c:
            assert await Scraper(c, sink).scrape(0, "http://127.0.0.1:9", "before") is None
            with pytest.raises(Exception, match="scrape"):
                await scrape_metrics(c, "http://127.0.0.1:9")

    asyncio.run(go())
    ev = sink.events("metrics.scraped")[0].data
    assert ev["samples"] == {} and ev["error"]
