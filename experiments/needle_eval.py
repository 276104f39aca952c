"""The needle model's held-out evaluation: cold answers per prompt size, checked exactly.

One OFF block (no shared cache, every request cold under its own namespace):
``fixtures`` fresh fixtures at each of ``sizes``, alternating between the two
replicas, each answered greedily with the top two logprobs of every output
token. Every answer gets an ``exact_values`` check at every size, also those
the model's card does not serve (``answers_meaningful`` is true here: the
point is to measure where the card's limit lies), so a run with wrong
answers ends with failed assertions (exit 1). The figures are derived from
the events: exact accuracy per size from the ``exact_values`` assertions,
the smallest top-1 minus top-2 logprob margin per size from
``response.received.min_logprob_margin`` (``python -m benchmarks needle --db
URL --run RUN_ID`` prints them).

Fixture keys are ``SEED:needle_eval:SIZE:I``: experiment keys, which no
training stream uses (training streams are ``needle-train/...``).

    ledger run needle_eval --target vllm                       # CPU: 1k, 2k, 3k
    ledger run needle_eval --target vllm --param gpus=0,1 \\
        --param sizes='[1024,2048,3072,8192,16384,32768]' --param max_model_len=40000
"""

from __future__ import annotations

from typing import Any

NAME = "needle_eval"
SEED = 271828
PARAMS: dict[str, Any] = {
    "sizes": [1024, 2048, 3072],
    "fixtures": 16,  # per size
    "warmups": 0,  # real engines still warm every replica once
    "warmup_tokens": 300,
    "max_tokens": 48,  # the answer is 34 tokens with its end token
    "top_logprobs": 2,
    "temperature": 0,
    "thinking": False,
    "answers_meaningful": True,  # check every size: the evaluation is what sets the card's limit
    "namespace_tag": None,
}


def check(params: dict[str, Any]) -> None:
    sizes = params["sizes"]
    if not isinstance(sizes, list) or not sizes or any(not isinstance(s, int) or s < 200 for s in sizes):
        raise ValueError("sizes: a list of integers of at least 200 tokens")
    if not isinstance(params["fixtures"], int) or params["fixtures"] < 1:
        raise ValueError("fixtures must be a positive integer")
    if not isinstance(params["top_logprobs"], int) or params["top_logprobs"] < 2:
        raise ValueError("top_logprobs must be at least 2 (the margin is top-1 minus top-2)")


def planned(params: dict[str, Any]) -> dict[str, int]:
    return {
        "blocks": 1,
        "warmups_per_block": params["warmups"],
        "requests_per_block": len(params["sizes"]) * params["fixtures"],
    }


def plan(params: dict[str, Any]) -> dict[str, Any]:
    """One cold request per size and fixture; the sizes asked."""
    return {
        "requests": {"needle_eval": {"cold": len(params["sizes"]) * params["fixtures"]}},
        "sizes": {"needle_eval": sorted(set(params["sizes"]))},
    }


async def run(ctx: Any) -> None:
    p = ctx.params

    async def block(b: Any) -> None:
        await b.warmups(p["warmups"], p["warmup_tokens"])
        for size in p["sizes"]:
            for i in range(p["fixtures"]):
                ns = ctx.namespace("needle_eval", size, i)
                fx = await ctx.fixture(ctx.fixture_key("needle_eval", size, i), size, ns)
                await b.request(
                    fx.messages,
                    replica=i % 2,
                    namespace=ns,
                    workload="needle_eval",
                    step="cold",
                    key=f"needle_eval/{size}/{i}",
                    expected=fx.expected,
                    fixture=fx,
                    prompt_tokens=fx.prompt_tokens,
                )
            b.sink.flush()

    await ctx.run_blocks(ctx.block_plan(1, ["OFF"], gpu_swap=False), block)
