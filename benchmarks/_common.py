"""Shared helpers for the ledger benchmarks: payloads, fast fills, JSON output."""

from __future__ import annotations

import json
import random
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ledger import Ledger, NewEvent, new_id, utc_now

RUNS = 8  # events spread over a few runs and blocks, like a real study


def payload(rng: random.Random, index: int) -> dict[str, Any]:
    """A ``response.received`` data object of about 300 bytes of canonical JSON."""
    return {
        "request_id": new_id(),
        "status": 200,
        "ttft_s": round(rng.uniform(0.01, 2.0), 6),
        "t_first": round(rng.uniform(0.01, 2.0), 6),
        "t_last": round(rng.uniform(2.0, 9.0), 6),
        "e2e_s": round(rng.uniform(2.0, 9.0), 6),
        "prompt_tokens": rng.randrange(100, 32000),
        "output_tokens": rng.randrange(1, 512),
        "cached_tokens": rng.randrange(0, 32000),
        "decode_rate": round(rng.uniform(10, 90), 3),
        "text_sha256": f"{rng.getrandbits(256):064x}",
        "finish_reason": "length",
        "error": None,
        "ttft_method": "kernel-stamp",
        "index": index,
    }


def make_events(count: int, seed: int = 7) -> list[NewEvent]:
    """``count`` new events with producer-made ids and timestamps."""
    rng = random.Random(seed)
    runs = [new_id() for _ in range(RUNS)]
    return [
        NewEvent(
            "response.received",
            payload(rng, i),
            run_id=runs[i % RUNS],
            block_id=None,
            id=new_id(),
            ts=utc_now(),
        )
        for i in range(count)
    ]


def fill(ledger: Ledger, count: int, batch: int = 20_000, template: int = 50_000) -> float:
    """Append ``count`` events through the ledger's own append path; returns seconds.

    Events are sealed from a pool of ``template`` payloads with fresh ids, so
    filling millions stays fast without weakening what is stored.
    """
    rng = random.Random(11)
    datas = [payload(rng, i) for i in range(min(template, count))]
    runs = [new_id() for _ in range(RUNS)]
    start = time.perf_counter()
    for offset in range(0, count, batch):
        ts = utc_now()
        ledger.extend(
            [
                NewEvent(
                    "response.received", datas[i % len(datas)], run_id=runs[i % RUNS], id=new_id(), ts=ts
                )
                for i in range(offset, min(offset + batch, count))
            ]
        )
    return time.perf_counter() - start


def cpu_seconds(children: bool = False) -> float:
    """CPU seconds of this process (all its threads), and of its finished children if asked
    (verify's worker processes)."""
    usage = [resource.getrusage(resource.RUSAGE_SELF)]
    if children:
        usage.append(resource.getrusage(resource.RUSAGE_CHILDREN))
    return sum(u.ru_utime + u.ru_stime for u in usage)


@contextmanager
def timed() -> Iterator[list[float]]:
    """``with timed() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    box = [0.0]
    start = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - start


def emit(result: dict[str, Any]) -> None:
    """The benchmark's last line: its figures as JSON."""
    print(json.dumps(result, sort_keys=True))
