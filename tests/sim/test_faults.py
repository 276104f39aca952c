"""Each injected fault changes what a client or a scraper observes."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from experiments.targets.sim import Fault, SimDeployment, garble_value, parse_faults
from tests.sim.helpers import TIME_SCALE, cached, complete, metric, needle_prompt, scrape

RIGHT = {"alpha": 938639, "beta": 412907, "gamma": 775123}


def _answer(resp: httpx.Response) -> dict[str, int]:
    assert resp.status_code == 200
    return dict(json.loads(resp.json()["choices"][0]["text"]))


def _deployment(fault: str, replicas: int = 2) -> SimDeployment:
    return SimDeployment(replicas, shared=True, fault=fault, time_scale=TIME_SCALE)


def test_corrupt_transfer_garbles_external_hits_only(http: httpx.Client) -> None:
    prompt = needle_prompt(filler_words=700)
    with _deployment("corrupt-transfer") as d:
        a, b = d.replica_urls
        assert _answer(complete(http, a, prompt, cache_salt="c")) == RIGHT
        assert _answer(complete(http, a, prompt, cache_salt="c")) == RIGHT  # local reuse is fine
        cross = complete(http, b, prompt, cache_salt="c")
        assert cached(cross) > 0  # HTTP 200 and hits counted ...
        assert _answer(cross) == {k: garble_value(v) for k, v in RIGHT.items()}  # ... but wrong
        ext = metric(scrape(http, b), "vllm:external_prefix_cache_hits_total")
        assert ext == cached(cross)
        # B's local reuse keeps the bad state; a fresh salt (cold) restores the answer.
        assert _answer(complete(http, b, prompt, cache_salt="c")) != RIGHT
        assert _answer(complete(http, b, prompt, cache_salt="fresh")) == RIGHT


def test_unordered_copy_is_off_by_fifteen(http: httpx.Client) -> None:
    prompt = needle_prompt(filler_words=700)
    with _deployment("unordered-copy") as d:
        a, b = d.replica_urls
        assert _answer(complete(http, a, prompt, cache_salt="u")) == RIGHT
        wrong = _answer(complete(http, b, prompt, cache_salt="u"))
        assert wrong == {**RIGHT, "alpha": 938624}
        assert _answer(complete(http, b, prompt, cache_salt="u")) == wrong  # retained locally
        assert _answer(complete(http, b, prompt, cache_salt="cold")) == RIGHT


def test_load_fault_scoped_to_one_replica(http: httpx.Client) -> None:
    prompt = needle_prompt(filler_words=700)
    with _deployment("unordered-copy:delta=1@replica=0") as d:
        a, b = d.replica_urls
        complete(http, a, prompt)
        assert _answer(complete(http, b, prompt)) == RIGHT  # replica 1 loads correctly
        complete(http, b, prompt, cache_salt="x")
        assert _answer(complete(http, a, prompt, cache_salt="x"))["alpha"] == 938638


def test_namespace_leak_ignores_salt(http: httpx.Client) -> None:
    prompt = needle_prompt()
    with _deployment("namespace-leak") as d:
        a, b = d.replica_urls
        complete(http, a, prompt, cache_salt="size-8k")
        assert cached(complete(http, a, prompt, cache_salt="size-128k")) > 0  # local leak
        assert cached(complete(http, b, prompt, cache_salt="other")) > 0  # shared leak


def test_stale_counters_stop_advancing(http: httpx.Client) -> None:
    prompt = needle_prompt()
    with _deployment("stale-counters:after=1") as d:
        a = d.replica_urls[0]
        complete(http, a, prompt)
        first = scrape(http, a)
        again = complete(http, a, prompt)
        second = scrape(http, a)
        assert cached(again) > 0
        q, h = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
        assert metric(first, q) > 0
        assert metric(second, q) == metric(first, q)
        assert metric(second, h) == 0


def test_http_errors_every_third(http: httpx.Client) -> None:
    with _deployment("http-errors:every=3@replica=1") as d:
        a, b = d.replica_urls
        codes = [complete(http, b, f"hello {i}").status_code for i in range(6)]
        assert codes == [200, 200, 500, 200, 200, 500]
        assert all(complete(http, a, "hi").status_code == 200 for _ in range(3))


def test_http_errors_rate_is_deterministic(http: httpx.Client) -> None:
    runs = []
    for _ in range(2):
        with _deployment("http-errors:rate=0.5", replicas=1) as d:
            runs.append([complete(http, d.replica_urls[0], "x").status_code for _ in range(12)])
    assert runs[0] == runs[1]
    assert 200 in runs[0] and 500 in runs[0]


def test_truncated_stream_has_no_usage_nor_done(http: httpx.Client) -> None:
    with _deployment("truncated-stream:after=3:die=1") as d:
        a = d.replica_urls[0]
        body = {"prompt": needle_prompt(), "stream": True, "stream_options": {"include_usage": True}}
        with http.stream("POST", a + "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = [ln for ln in resp.iter_lines() if ln]
        assert len(lines) == 3
        assert "data: [DONE]" not in lines and '"usage"' not in "".join(lines)
        assert http.get(a + "/health").status_code == 503  # the replica died
        assert http.get(d.replica_urls[1] + "/health").status_code == 200
        samples = scrape(http, a)
        assert metric(samples, "vllm:request_success_total") == 0


def test_truncated_non_streaming_body_is_malformed(http: httpx.Client) -> None:
    with _deployment("truncated-stream") as d:
        resp = complete(http, d.replica_urls[0], needle_prompt())
        assert resp.status_code == 200
        with pytest.raises(json.JSONDecodeError):
            resp.json()


def test_slow_start_delays_first_request(http: httpx.Client) -> None:
    # 2000 simulated seconds at TIME_SCALE: 0.2 s of real extra delay.
    with _deployment("slow-start:requests=1:delay=2000") as d:
        a = d.replica_urls[0]
        t0 = time.monotonic()
        complete(http, a, "first")
        slow = time.monotonic() - t0
        t0 = time.monotonic()
        complete(http, a, "second")
        fast = time.monotonic() - t0
    assert slow >= 0.2 > fast


def test_fault_spec_syntax() -> None:
    faults = parse_faults("corrupt-transfer, http-errors:every=2@replica=1,stale-counters@tier")
    assert [f.kind for f in faults] == ["corrupt-transfer", "http-errors", "stale-counters"]
    assert faults[1] == Fault("http-errors", {"every": "2"}, replica=1)
    assert faults[2].tier_only and not faults[2].on_replica(0)
    assert parse_faults("none") == () and parse_faults(None) == ()
    assert faults[1].spec() == "http-errors:every=2@replica=1"
    for bad in (
        "no-such-fault",
        "http-errors:every",
        "http-errors@tier",
        "corrupt-transfer:x=1",
        "slow-start@replica=one",
        "http-errors:every=x",
    ):
        with pytest.raises(ValueError):
            parse_faults(bad)


def test_set_fault_at_runtime_and_over_http(dep: SimDeployment, http: httpx.Client) -> None:
    a = dep.replica_urls[0]
    dep.set_fault("http-errors:every=1")
    assert complete(http, a, "x").status_code == 500
    resp = http.post(dep.shared_url + "/sim/fault", json={"spec": "none"})
    assert resp.json()["faults"] == "none"
    assert complete(http, a, "x").status_code == 200
    assert http.post(dep.shared_url + "/sim/fault", json={"spec": "bogus"}).status_code == 400


def _stream_tokens(http: httpx.Client, url: str, prompt: str, salt: str) -> list[tuple[str, float]]:
    """A streamed completion with top-2 logprobs: each token and its top-1 minus top-2 margin."""
    body = {"prompt": prompt, "max_tokens": 64, "temperature": 0, "stream": True, "logprobs": 2}
    resp = http.post(url + "/v1/completions", json={**body, "cache_salt": salt})
    out = []
    for line in resp.text.splitlines():
        if line.startswith("data: {"):
            logprobs = json.loads(line[6:])["choices"][0]["logprobs"]
            for token, top in zip(logprobs["tokens"], logprobs["top_logprobs"], strict=True):
                best, second = sorted(top.values(), reverse=True)[:2]
                out.append((token, best - second))
    return out


def test_near_tie_flips_every_other_completion_at_its_margin(http: httpx.Client) -> None:
    prompt = needle_prompt(filler_words=700)
    runner_up = {**RIGHT, "alpha": 938630}
    with _deployment("near-tie:margin=0.05@replica=0") as d:
        a, b = d.replica_urls
        # Cold or reused alike, the first value's last digit follows the replica's batch numerics.
        answers = [_answer(complete(http, a, prompt, cache_salt=salt)) for salt in ("x", "x", "y", "y")]
        assert answers == [RIGHT, runner_up, RIGHT, runner_up]
        assert all(_answer(complete(http, b, prompt, cache_salt="z")) == RIGHT for _ in range(2))
        tokens = _stream_tokens(http, a, prompt, "fresh")
        text = "".join(t for t, _ in tokens)
        ties = [i for i, (_, margin) in enumerate(tokens) if margin < 1]
        assert len(ties) == 1 and tokens[ties[0]][1] == pytest.approx(0.05)
        assert json.loads(text) in (RIGHT, runner_up) and text.startswith(
            "".join(t for t, _ in tokens[: ties[0]])
        )
        assert "".join(t for t, _ in tokens[: ties[0]]).endswith(" 938")  # the last digits tie
        assert all(margin == pytest.approx(9.0) for i, (_, margin) in enumerate(tokens) if i not in ties)


def test_cache_off_never_hits(http: httpx.Client) -> None:
    prompt = needle_prompt(filler_words=700)
    with _deployment("cache-off") as d:
        a, b = d.replica_urls
        for url in (a, a, b):
            assert cached(complete(http, url, prompt, cache_salt="c")) == 0
    with _deployment("cache-off@replica=0") as d:
        a, b = d.replica_urls
        complete(http, a, prompt, cache_salt="c")
        again = complete(http, a, prompt, cache_salt="c")  # only the tier serves replica 0
        assert metric(scrape(http, a), "vllm:prefix_cache_hits_total") == 0
        assert cached(again) == metric(scrape(http, a), "vllm:external_prefix_cache_hits_total") > 0
        assert cached(complete(http, b, prompt, cache_salt="c")) > 0
