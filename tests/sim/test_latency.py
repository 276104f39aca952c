"""The latency model's shape at 128k, measured by the collectors client and read back from the ledger.

Cold prefill dwarfs a cross-replica reuse, which is slower than a local reuse
(the seed's Section 5.1); and the server's own work (parsing, tokenizing,
hashing a 128k-token prompt) is spent inside the modelled time, not added
to it. Orderings and bounds only, no exact times.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from hypothesis import given
from hypothesis import strategies as st

from collectors import send_request
from experiments.targets.sim import LatencyModel, SimDeployment, count_tokens, encode
from experiments.targets.sim._answers import ASSIGNMENT, find_assignments
from experiments.targets.sim._tokenizer import encode_cached, segments
from ledger import open_ledger
from tests.collectors.helpers import LedgerSink, spec

SCALE = 0.1
TOKENS = 128_000


def _prompt(tokens: int) -> str:
    head = "# file\nalpha = 938639\n"
    tail = "\nReturn the values of alpha as JSON."
    filler = " lorem" * (tokens - count_tokens(head) - count_tokens(tail))
    text = head + filler + tail
    assert count_tokens(text) == tokens
    return text


def test_cold_dwarfs_cross_which_exceeds_local_at_128k(tmp_path: Path) -> None:
    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    sink = LedgerSink(led)
    prompt = _prompt(TOKENS)
    steps = (("cold", 0), ("local1", 0), ("local2", 0), ("cross", 1), ("receiver_local", 1))
    with SimDeployment(2, shared=True, time_scale=SCALE) as d:

        async def go() -> None:
            async with httpx.AsyncClient() as c:
                for chain in (0, 1):  # two chains (salts): each step's best of two, against load spikes
                    for step, replica in steps:
                        s = spec(
                            d.replica_urls[replica],
                            prompt,
                            f"ns-shape-{chain}",
                            replica=replica,
                            step=step,
                            max_tokens=16,
                        )
                        o = await send_request(c, s, sink, timeout_s=60)
                        assert o.ok, o.error

        asyncio.run(go())
        log = httpx.get(d.replica_urls[0] + "/sim/requests").json()
    sent = {e.data["request_id"]: e.data["step"] for e in sink.events("request.sent")}
    got = [(sent[e.data["request_id"]], e.data) for e in sink.events("response.received")]
    led.close()
    ttft = {step: min(r["ttft_s"] for s, r in got if s == step) for step, _ in steps}
    for step, r in got:
        hit = r["cached_tokens"]
        assert hit == 0 if step == "cold" else hit >= TOKENS - (256 if step == "cross" else 16), (step, hit)

    assert ttft["cold"] > 5 * ttft["cross"], ttft
    assert ttft["cross"] > min(ttft["local1"], ttft["local2"], ttft["receiver_local"]), ttft
    # Orderings only: a wall-clock bound would measure the machine's load, not the model (the
    # model's own figures are checked below, without a clock).

    # The server's work on the first cold 128k prompt (tokenizing it afresh: 0.1-0.5 s) happened
    # inside the modelled time, not after it.
    first_cold = next(rid for rid, step in sent.items() if step == "cold")
    cold = next(e for e in log if e["request_id"] == first_cold)
    took = cold["t_first_emit_monotonic"] - cold["t_arrival_monotonic"]
    modelled = LatencyModel().prefill_s(TOKENS, 0, 0) * SCALE
    assert modelled <= took < modelled + 0.1, (took, modelled)


def test_the_models_128k_figures_are_the_ones_its_docstring_gives() -> None:
    """Cold prefill about 20 s, cross-replica reuse 0.5-0.7 s, first local reuse about 20 ms (model
    seconds, before any time scale), computed from the model rather than timed."""
    m = LatencyModel()
    cold = m.prefill_s(TOKENS, local_hits=0, external_hits=0)
    cross = m.prefill_s(TOKENS, local_hits=0, external_hits=TOKENS - 256)  # whole chunks shared
    local = m.prefill_s(TOKENS, local_hits=TOKENS - 16, external_hits=0)  # vLLM's own blocks
    assert 15.0 < cold < 25.0, cold
    assert 0.5 < cross < 0.7, cross
    assert 0.015 <= local < 0.03, local


def test_modelled_time_runs_from_the_requests_arrival_at_the_socket() -> None:
    """A request that reaches a replica while the sim's process is busy is dated by the kernel's
    receive time of its bytes, so that wait is spent inside the modelled time; the next request
    on the same keep-alive connection is dated by its own bytes, never earlier."""
    body = json.dumps({"model": "sim-27b", "prompt": "alpha = 938639", "max_tokens": 1, "seed": 1})
    sent: list[float] = []
    in_socket = threading.Event()

    async def scenario() -> tuple[float, list[dict[str, Any]], bool]:
        async with SimDeployment(2, shared=False, time_scale=1.0) as d:
            url = urlsplit(d.replica_urls[0])
            conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)

            def send() -> None:
                sent.append(time.monotonic())
                conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                in_socket.set()
                conn.getresponse().read()

            first = threading.Thread(target=send)
            first.start()
            # This loop serves the sim: block it, so the request waits in the socket meanwhile.
            assert in_socket.wait(30)
            time.sleep(0.3)
            unblocked = time.monotonic()
            await asyncio.to_thread(first.join)
            sock = conn.sock
            await asyncio.sleep(0.2)
            await asyncio.to_thread(send)
            reused = conn.sock is sock
            conn.close()
            async with httpx.AsyncClient() as c:
                log = (await c.get(d.replica_urls[0] + "/sim/requests")).json()
        return unblocked, log, reused

    unblocked, log, reused = asyncio.run(scenario())
    assert reused and len(log) == 2
    modelled = LatencyModel().prefill_s(count_tokens("alpha = 938639"), 0, 0)
    for entry, t_sent in zip(log, sent, strict=True):
        arrival = entry["t_arrival_monotonic"]
        assert t_sent - 0.005 <= arrival < t_sent + 0.1, (entry, t_sent)
        assert entry["t_first_emit_monotonic"] >= arrival + modelled, entry
    assert log[0]["t_arrival_monotonic"] < unblocked - 0.2, (log[0], unblocked)


_PARTS = [
    "a",
    "Z",
    " ",
    "\n",
    "\t",
    "7",
    "42",
    "=",
    "<|im_end|>",
    "é",
    "alpha = 938639\n",
    "\nbeta=-4\n",
    "x" * 300,
]
_TEXT = st.lists(st.sampled_from(_PARTS), max_size=120).map("".join)


@given(_TEXT, st.integers(min_value=1, max_value=40))
def test_segmented_tokenization_equals_whole(text: str, size: int) -> None:
    pieces = segments(text, size)
    assert "".join(pieces) == text
    assert [i for p in pieces for i in encode(p)] == encode(text)
    assert list(encode_cached(text)) == encode(text)


@given(_TEXT)
def test_segmented_needle_search_equals_whole(text: str) -> None:
    text = text * 40  # long enough to be cut into several segments
    whole = {m.group(1): (int(m.group(2)), m.start(1)) for m in ASSIGNMENT.finditer(text)}
    assert {k: (n.value, n.char_offset) for k, n in find_assignments(text).items()} == whole
    assert list(find_assignments(text)) == list(dict.fromkeys(m.group(1) for m in ASSIGNMENT.finditer(text)))
