"""One real vLLM replica (no KV connector): health, tokenize, streaming usage."""

from __future__ import annotations

import httpx
import pytest

from experiments.targets.vllm.engines import Engines

from ._stack import SERVED, Replica, metric_sum, stream_completion

pytestmark = pytest.mark.engines


def test_health_and_models(plain_replica: Replica) -> None:
    assert httpx.get(f"{plain_replica.url}/health", timeout=10).status_code == 200
    models = httpx.get(f"{plain_replica.url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [SERVED]
    assert plain_replica.proc.ready_seconds is not None


def test_tokenize_matches_local_tokenizer(plain_replica: Replica, engines: Engines) -> None:
    text = "Hello there, plain text 12345."
    r = httpx.post(f"{plain_replica.url}/tokenize", json={"model": SERVED, "prompt": text}, timeout=10)
    r.raise_for_status()
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0
    assert body["max_model_len"] == 4096
    chat = httpx.post(
        f"{plain_replica.url}/tokenize",
        json={"model": SERVED, "messages": [{"role": "user", "content": text}]},
        timeout=10,
    ).json()
    # ChatML wrapping adds the role markers around the same text.
    assert chat["count"] > body["count"]


def test_streaming_usage_and_local_prefix_cache(plain_replica: Replica) -> None:
    prompt = list(range(3, 3 + 700))  # token ids: exact length
    body = {"model": SERVED, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    hits0 = metric_sum(plain_replica.url, "vllm:prefix_cache_hits_total")
    first = stream_completion(plain_replica.url, {**body, "cache_salt": "replica-test"})
    assert first["done"] and first["usage"] is not None
    assert first["usage"]["prompt_tokens"] == 700
    assert first["usage"]["completion_tokens"] == 8
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    again = stream_completion(plain_replica.url, {**body, "cache_salt": "replica-test"})
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == 640  # whole 128-token CPU blocks, leaving at least one token to compute
    assert metric_sum(plain_replica.url, "vllm:prefix_cache_hits_total") - hits0 == cached
    assert again["text"] == first["text"]  # greedy: same output from cache as cold
    other_salt = stream_completion(plain_replica.url, {**body, "cache_salt": "another"})
    assert other_salt["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert metric_sum(plain_replica.url, "vllm:external_prefix_cache_hits_total") == 0
