"""Hits and counters move as vLLM's and LMCache's do, over real loopback HTTP."""

from __future__ import annotations

import httpx

from experiments.targets.sim import SimDeployment, count_tokens
from tests.sim.helpers import TIME_SCALE, cached, complete, metric, needle_prompt, scrape

BLOCK, CHUNK = 16, 256


def _tokens(http: httpx.Client, url: str, prompt: str) -> int:
    return int(http.post(url + "/tokenize", json={"prompt": prompt}).json()["count"])


def test_same_prompt_twice_hits_all_full_blocks_but_the_last_token(
    dep: SimDeployment, http: httpx.Client
) -> None:
    a = dep.replica_urls[0]
    prompt = needle_prompt()
    n = _tokens(http, a, prompt)
    before = scrape(http, a)
    first = complete(http, a, prompt)
    mid = scrape(http, a)
    second = complete(http, a, prompt)
    after = scrape(http, a)
    assert cached(first) == 0
    assert cached(second) == (n - 1) // BLOCK * BLOCK
    assert first.json()["usage"]["prompt_tokens"] == n
    q, h = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
    assert metric(mid, q) - metric(before, q) == n
    assert metric(after, q) - metric(mid, q) == n
    assert metric(mid, h) - metric(before, h) == 0
    assert metric(after, h) - metric(mid, h) == cached(second)
    src = "vllm:prompt_tokens_by_source_total"
    assert metric(after, src, source="local_cache_hit") == cached(second)
    assert metric(after, src, source="local_compute") == 2 * n - cached(second)


def test_whole_prompt_of_full_blocks_still_computes_last_block(http: httpx.Client) -> None:
    with SimDeployment(1, shared=False, time_scale=TIME_SCALE) as d:
        url = d.replica_urls[0]
        ids = list(range(100, 100 + 4 * BLOCK))  # exactly four blocks, as token ids
        complete(http, url, ids)  # type: ignore[arg-type]
        again = complete(http, url, ids)  # type: ignore[arg-type]
        assert cached(again) == 3 * BLOCK


def test_cache_salt_separates_caches(dep: SimDeployment, http: httpx.Client) -> None:
    a = dep.replica_urls[0]
    prompt = needle_prompt()
    assert cached(complete(http, a, prompt, cache_salt="ns-a")) == 0
    assert cached(complete(http, a, prompt, cache_salt="ns-a")) > 0
    assert cached(complete(http, a, prompt, cache_salt="ns-b")) == 0
    assert cached(complete(http, a, prompt)) == 0


def test_two_replicas_keep_separate_local_caches(http: httpx.Client) -> None:
    with SimDeployment(2, shared=False, time_scale=TIME_SCALE) as d:
        a, b = d.replica_urls
        prompt = needle_prompt()
        complete(http, a, prompt)
        assert cached(complete(http, b, prompt)) == 0
        assert metric(scrape(http, b), "vllm:prefix_cache_hits_total") == 0


def test_shared_on_cross_replica_hits_externally_at_chunk_alignment(
    dep: SimDeployment, http: httpx.Client
) -> None:
    a, b = dep.replica_urls
    prompt = needle_prompt(filler_words=700)
    n = _tokens(http, a, prompt)
    assert n % CHUNK != 0
    complete(http, a, prompt, cache_salt="s1")
    before = scrape(http, b)
    cross = complete(http, b, prompt, cache_salt="s1")
    after = scrape(http, b)
    expected = n // CHUNK * CHUNK
    assert cached(cross) == expected
    eh, eq = "vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total"
    assert metric(after, eh) - metric(before, eh) == expected
    assert metric(after, eq) - metric(before, eq) == n
    assert metric(after, "vllm:prefix_cache_hits_total") == 0
    assert metric(after, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == expected
    # Receiver-local reuse: now B has the blocks itself, so no external query hits.
    local = complete(http, b, prompt, cache_salt="s1")
    final = scrape(http, b)
    assert cached(local) == (n - 1) // BLOCK * BLOCK
    assert metric(final, eh) - metric(after, eh) == 0
    assert metric(final, eq) - metric(after, eq) == n - cached(local)
    tier = scrape(http, dep.shared_url)
    assert metric(tier, "lmcache_mp_lookup_hit_tokens_total", cache_salt="s1") >= expected
    assert metric(tier, "lmcache_mp_lookup_requested_tokens_total", cache_salt="s1") == 3 * n


def test_shared_off_has_zero_external(http: httpx.Client) -> None:
    with SimDeployment(2, shared=False, time_scale=TIME_SCALE) as d:
        a, b = d.replica_urls
        prompt = needle_prompt(filler_words=700)
        complete(http, a, prompt)
        assert cached(complete(http, b, prompt)) == 0
        for url in (a, b):
            samples = scrape(http, url)
            assert metric(samples, "vllm:external_prefix_cache_hits_total") == 0
            assert metric(samples, "vllm:external_prefix_cache_queries_total") == 0


def test_set_shared_and_restart(dep: SimDeployment, http: httpx.Client) -> None:
    a, b = dep.replica_urls
    prompt = needle_prompt(filler_words=700)
    dep.set_shared(False)
    complete(http, a, prompt)
    assert cached(complete(http, b, prompt)) == 0  # OFF: nothing was stored in the tier
    dep.set_shared(True)
    complete(http, a, prompt, cache_salt="on")
    assert cached(complete(http, b, prompt, cache_salt="on")) > 0
    dep.restart()
    assert dep.replica_urls == [a, b]
    assert metric(scrape(http, a), "vllm:prefix_cache_queries_total") == 0
    assert cached(complete(http, a, prompt, cache_salt="on")) == 0
    assert metric(scrape(http, dep.shared_url), "lmcache_mp_lookup_requested_tokens_total") > 0
    dep.restart(shared=False)
    assert dep.shared is False
    assert metric(scrape(http, dep.shared_url), "lmcache_mp_lookup_requested_tokens_total") == 0


def test_lru_eviction_frees_the_oldest_prompt(http: httpx.Client) -> None:
    prompt = needle_prompt(filler_words=100, tag="one")
    blocks = count_tokens(prompt) // BLOCK
    # Room for two prompts: after three more, the first has gone entirely.
    with SimDeployment(1, shared=False, capacity_blocks=2 * blocks + 1, time_scale=TIME_SCALE) as d:
        url = d.replica_urls[0]
        complete(http, url, prompt)
        assert cached(complete(http, url, prompt)) > 0
        for tag in ("two", "three", "four"):
            complete(http, url, needle_prompt(filler_words=100, tag=tag))
        assert cached(complete(http, url, prompt)) == 0
        usage = metric(scrape(http, url), "vllm:kv_cache_usage_perc")
        assert 0 < usage <= 1
