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
    "fixtures_by_size": None,  # {"SIZE": count}: other counts for the sizes named (more where 99 % is judged)
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
    fixture_counts(params)
    if not isinstance(params["top_logprobs"], int) or params["top_logprobs"] < 2:
        raise ValueError("top_logprobs must be at least 2 (the margin is top-1 minus top-2)")


def fixture_counts(params: dict[str, Any]) -> dict[int, int]:
    """Fixtures per size: ``fixtures`` for each size, unless ``fixtures_by_size`` (a JSON object,
    keys as strings) names another count for it. Bad input is named (ValueError → exit 2)."""
    sizes, fixtures, by_size = params["sizes"], params["fixtures"], params["fixtures_by_size"] or {}
    if not isinstance(by_size, dict):
        raise ValueError(f"fixtures_by_size must be an object of size: count, got {by_size!r}")
    try:
        given = {int(k): v for k, v in by_size.items()}
    except ValueError:
        raise ValueError(f"fixtures_by_size: keys must be sizes, got {sorted(by_size)!r}") from None
    extra = sorted(set(given) - set(sizes))
    if extra:
        raise ValueError(f"fixtures_by_size names sizes not in sizes: {extra}")
    counts = {s: given.get(s, fixtures) for s in sizes}
    bad = {s: c for s, c in counts.items() if isinstance(c, bool) or not isinstance(c, int) or c < 1}
    if bad:
        raise ValueError(f"fixtures must be positive integers, got {bad}")
    return counts


def planned(params: dict[str, Any]) -> dict[str, int]:
    return {
        "blocks": 1,
        "warmups_per_block": params["warmups"],
        "requests_per_block": sum(fixture_counts(params).values()),
    }


def plan(params: dict[str, Any]) -> dict[str, Any]:
    """One cold request per size and fixture; the sizes asked."""
    return {
        "requests": {"needle_eval": {"cold": sum(fixture_counts(params).values())}},
        "sizes": {"needle_eval": sorted(set(params["sizes"]))},
    }


async def run(ctx: Any) -> None:
    p = ctx.params
    counts = fixture_counts(p)

    async def block(b: Any) -> None:
        await b.warmups(p["warmups"], p["warmup_tokens"])
        for size in p["sizes"]:
            for i in range(counts[size]):
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
