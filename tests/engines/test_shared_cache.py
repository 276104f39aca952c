"""Two real vLLM replicas sharing KV cache through a real LMCache service."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.targets.vllm._process import Process
from experiments.targets.vllm.engines import Engines

from ._stack import LMCACHE_CHUNK, SERVED, Replica, metric_sum, shared_stack, stream_completion

pytestmark = pytest.mark.engines

Stack = tuple[Process, str, Replica, Replica]


@pytest.fixture(scope="module")
def stack(engines: Engines, engine_logs: Path) -> Iterator[Stack]:
    with shared_stack(engines, engine_logs) as s:
        yield s
    svc, _, a, b = s
    for p in (svc, a.proc, b.proc):
        assert p.exit is not None and not p.group_alive()


def _ext_hits(url: str) -> float:
    return metric_sum(url, "vllm:external_prefix_cache_hits_total")


def test_cross_replica_external_hit(stack: Stack) -> None:
    _svc, svc_http, a, b = stack
    # Warm-ups reach every replica before measuring (ENGINES-CPU.md: a fresh replica
    # whose first request is an external hit can die).
    for r in (a, b):
        w = stream_completion(r.url, {"model": SERVED, "prompt": "warm up", "max_tokens": 2})
        assert w["done"]
    n = 1707
    rng = random.Random(1707)
    prompt = [rng.randrange(3, 2048) for _ in range(n)]
    body = {"model": SERVED, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    expected = (n - 1) // LMCACHE_CHUNK * LMCACHE_CHUNK  # 1536: whole chunks, one token left

    svc_hits0 = metric_sum(svc_http, "lmcache_mp_lookup_hit_tokens_total")
    on_a = stream_completion(a.url, body)
    assert on_a["done"] and on_a["usage"]["prompt_tokens"] == n
    assert on_a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    b_ext0 = _ext_hits(b.url)
    on_b = stream_completion(b.url, body)
    assert on_b["done"] and on_b["usage"] is not None
    assert on_b["usage"]["prompt_tokens_details"]["cached_tokens"] == expected
    assert _ext_hits(b.url) - b_ext0 == expected
    assert metric_sum(b.url, "vllm:prefix_cache_hits_total") == 0  # nothing local on B
    by_source = metric_sum(b.url, "vllm:prompt_tokens_by_source_total", 'source="external_kv_transfer"')
    assert by_source >= expected
    assert metric_sum(svc_http, "lmcache_mp_lookup_hit_tokens_total") - svc_hits0 >= expected
    assert on_b["text"] == on_a["text"]  # greedy output unchanged by the loaded KV
    for r in (a, b):
        assert r.proc.alive()


def test_cache_salt_isolates_the_shared_cache(stack: Stack) -> None:
    _svc, _, a, b = stack
    prompt = list(range(100, 100 + 600))
    body = {"model": SERVED, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    assert stream_completion(a.url, {**body, "cache_salt": "s1"})["done"]
    salted = stream_completion(b.url, {**body, "cache_salt": "s2"})
    assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    same = stream_completion(b.url, {**body, "cache_salt": "s1"})
    assert same["usage"]["prompt_tokens_details"]["cached_tokens"] == 512
