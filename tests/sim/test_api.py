"""The OpenAI-compatible surface: streaming format, usage, answers, validation."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from experiments.targets.sim import SimDeployment, count_tokens, expected_answer
from tests.sim.helpers import TIME_SCALE, cached, complete, needle_prompt


def _stream(
    http: httpx.Client, url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[list[Any], bool]:
    """Decoded SSE events and whether [DONE] closed the stream."""
    events: list[Any] = []
    done = False
    with http.stream("POST", url + path, json={**body, "stream": True}, headers=headers or {}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                done = True
                continue
            assert not done, "nothing may follow [DONE]"
            events.append(json.loads(payload))
    return events, done


def test_streaming_completion_usage_chunk_last(dep: SimDeployment, http: httpx.Client) -> None:
    a = dep.replica_urls[0]
    prompt = needle_prompt()
    complete(http, a, prompt)
    body = {"prompt": prompt, "max_tokens": 64, "stream_options": {"include_usage": True}}
    events, done = _stream(http, a, "/v1/completions", body)
    assert done
    *content, last = events
    assert last["choices"] == []
    usage = last["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert usage["prompt_tokens"] == count_tokens(prompt)
    assert usage["completion_tokens"] == len(content)
    assert all(e["object"] == "text_completion" for e in events)
    assert content[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(e["choices"][0]["finish_reason"] is None for e in content[:-1])
    text = "".join(e["choices"][0]["text"] for e in content)
    assert json.loads(text) == {"alpha": 938639, "beta": 412907, "gamma": 775123}


def test_streaming_chat_format(dep: SimDeployment, http: httpx.Client) -> None:
    body = {
        "messages": [{"role": "user", "content": needle_prompt()}],
        "chat_template_kwargs": {"enable_thinking": False},
        "stream_options": {"include_usage": True},
    }
    events, done = _stream(http, dep.replica_urls[1], "/v1/chat/completions", body)
    assert done
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1]["choices"] == [] and "cached_tokens" in json.dumps(events[-1]["usage"])
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert json.loads(text)["gamma"] == 775123
    assert all(e["object"] == "chat.completion.chunk" for e in events)


def test_no_usage_chunk_without_include_usage(dep: SimDeployment, http: httpx.Client) -> None:
    events, done = _stream(
        http, dep.replica_urls[0], "/v1/completions", {"prompt": "hello there", "max_tokens": 5}
    )
    assert done and all(e["choices"] for e in events)


def test_non_streaming_chat_answers_needles(dep: SimDeployment, http: httpx.Client) -> None:
    history = [
        {"role": "system", "content": "You read files."},
        {"role": "user", "content": needle_prompt()},
        {"role": "assistant", "content": '{"alpha": 938639, "beta": 412907, "gamma": 775123}'},
        {"role": "user", "content": "delta = 5\nReturn the values of gamma and delta as JSON."},
    ]
    resp = http.post(
        dep.replica_urls[0] + "/v1/chat/completions",
        json={"messages": history, "max_tokens": 64, "seed": 314159},
    )
    data = resp.json()
    assert data["object"] == "chat.completion"
    assert data["choices"][0]["message"]["content"] == '{"gamma": 775123, "delta": 5}'
    assert data["choices"][0]["finish_reason"] == "stop"


def test_answers_are_deterministic_and_match_expected(dep: SimDeployment, http: httpx.Client) -> None:
    prompt = needle_prompt(values=(123456, 654321, 111111))
    texts = {
        complete(http, url, prompt, cache_salt=f"s{i}").json()["choices"][0]["text"]
        for i, url in enumerate(dep.replica_urls * 2)
    }
    assert texts == {expected_answer(prompt)}


@pytest.mark.parametrize("stream", [False, True])
def test_ignore_eos_gives_exactly_max_tokens(dep: SimDeployment, http: httpx.Client, stream: bool) -> None:
    body = {
        "prompt": needle_prompt(),
        "max_tokens": 300,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    url = dep.replica_urls[0]
    if stream:
        events, _ = _stream(http, url, "/v1/completions", body)
        usage, content = events[-1]["usage"], events[:-1]
        text = "".join(e["choices"][0]["text"] for e in content)
        assert len(content) == 300
        assert content[-1]["choices"][0]["finish_reason"] == "length"
    else:
        data = http.post(url + "/v1/completions", json=body).json()
        usage, text = data["usage"], data["choices"][0]["text"]
        assert data["choices"][0]["finish_reason"] == "length"
    assert usage["completion_tokens"] == 300
    assert count_tokens(text) == 300
    assert text.startswith(expected_answer(needle_prompt()) or "")


def test_max_tokens_cuts_answer(dep: SimDeployment, http: httpx.Client) -> None:
    data = complete(http, dep.replica_urls[0], needle_prompt(), max_tokens=3).json()
    assert data["usage"]["completion_tokens"] == 3
    assert data["choices"][0]["finish_reason"] == "length"


def test_tokenize_agrees_with_usage(dep: SimDeployment, http: httpx.Client) -> None:
    a = dep.replica_urls[0]
    prompt = needle_prompt()
    tok = http.post(a + "/tokenize", json={"prompt": prompt}).json()
    assert set(tok) >= {"count", "tokens", "max_model_len"}
    assert tok["count"] == len(tok["tokens"]) == complete(http, a, prompt).json()["usage"]["prompt_tokens"]
    messages = [{"role": "user", "content": prompt}]
    kwargs = {"enable_thinking": False}
    chat_tok = http.post(a + "/tokenize", json={"messages": messages, "chat_template_kwargs": kwargs}).json()
    chat = http.post(
        a + "/v1/chat/completions", json={"messages": messages, "chat_template_kwargs": kwargs}
    ).json()
    assert chat_tok["count"] == chat["usage"]["prompt_tokens"]


@pytest.mark.parametrize("salt", ["", "a" * 129, "a@b", "a/b", "a\\b", "a\x00b", 7])
def test_bad_cache_salt_is_400(dep: SimDeployment, http: httpx.Client, salt: object) -> None:
    resp = http.post(dep.replica_urls[0] + "/v1/completions", json={"prompt": "hi", "cache_salt": salt})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == 400


def test_good_salt_of_128_chars_and_other_validation(dep: SimDeployment, http: httpx.Client) -> None:
    a = dep.replica_urls[0]
    assert complete(http, a, "hi", cache_salt="x-y_z." * 21 + "ab").status_code == 200
    assert complete(http, a, "hi", max_tokens=0).status_code == 400
    assert complete(http, a, "hi", model="other").status_code == 404
    assert complete(http, a, "hi", max_tokens=10**7).status_code == 400
    assert http.post(a + "/v1/completions", content=b"{nope").status_code == 400


def test_small_endpoints(dep: SimDeployment, http: httpx.Client) -> None:
    a = dep.replica_urls[0]
    assert http.get(a + "/health").status_code == 200
    assert http.get(a + "/v1/models").json()["data"][0]["id"] == "sim-27b"
    assert http.get(a + "/version").json()["version"].startswith("0.33.0")
    assert http.get(dep.shared_url + "/healthcheck").status_code == 200
    assert http.get(dep.shared_url + "/status").json()["chunk_size"] == 256
    info = http.get(a + "/metrics").text
    assert 'vllm:cache_config_info{block_size="16"' in info
    assert 'enable_prefix_caching="True"' in info


def test_server_records_first_emission(dep: SimDeployment, http: httpx.Client) -> None:
    a = dep.replica_urls[0]
    t0 = time.monotonic()
    events, _ = _stream(
        http, a, "/v1/completions", {"prompt": needle_prompt()}, headers={"X-Request-Id": "req-42"}
    )
    t1 = time.monotonic()
    assert events[0]["id"] == "cmpl-req-42"
    entry = next(e for e in http.get(a + "/sim/requests").json() if e["request_id"] == "req-42")
    assert t0 < entry["t_first_emit_monotonic"] < t1
    assert abs(entry["t_first_emit_unix"] - time.time()) < 60
    assert entry["prompt_tokens"] == count_tokens(needle_prompt())
    assert entry["local_hit_tokens"] == 0 and entry["external_hit_tokens"] == 0
    assert http.delete(a + "/sim/requests").status_code == 204
    assert http.get(a + "/sim/requests").json() == []


def test_async_context_manager() -> None:
    async def main() -> int:
        async with SimDeployment(1, time_scale=TIME_SCALE) as d, httpx.AsyncClient() as client:
            resp = await client.post(
                d.replica_urls[0] + "/v1/completions", json={"prompt": needle_prompt(), "max_tokens": 64}
            )
            return cached(resp)

    assert asyncio.run(main()) == 0
