"""Helpers for the sim tests: scraping, prompts in the answer convention."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

TIME_SCALE = 0.0001

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: httpx.Client, url: str) -> Samples:
    """Every sample of /metrics, keyed by (name, labels)."""
    text = client.get(url + "/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metric(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def needle_prompt(
    filler_words: int = 400, values: tuple[int, int, int] = (938639, 412907, 775123), tag: str = ""
) -> str:
    """A fixture in the sim's answer convention: three needles and the question."""
    para = f"{tag} lorem ipsum dolor sit amet consectetur. " * (filler_words // 12 + 1)
    a, b, c = values
    return (
        f"# file {tag}\nalpha = {a}\n{para}\nbeta = {b}\n{para}\ngamma = {c}\n"
        "Return the values of alpha, beta and gamma as JSON."
    )


def complete(client: httpx.Client, url: str, prompt: str, **fields: Any) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 64, "temperature": 0, "seed": 314159, **fields}
    return client.post(url + "/v1/completions", json=body)


def cached(resp: httpx.Response) -> int:
    return int(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
