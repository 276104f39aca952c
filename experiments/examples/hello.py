"""A minimal experiment: two ON/OFF block pairs (OFF–ON–ON–OFF), one fixture, cold → local → cross.

Run it with ``ledger run experiments/examples/hello.py --param size=4000``.
"""

from typing import Any

NAME = "hello"
SEED = 7
PARAMS: dict[str, Any] = {"size": 2000, "block_pairs": 2, "namespace_tag": None}


def planned(params: dict[str, Any]) -> dict[str, int]:
    return {"blocks": 2 * params["block_pairs"], "requests_per_block": 3, "warmups_per_block": 2}


async def run(ctx: Any) -> None:
    size = ctx.params["size"]

    async def block(b: Any) -> None:
        await b.warmups(2, 500)  # one per replica, recorded with warmup: true
        ns = ctx.namespace("hello", size)  # TAG-hello-SIZE: run tag, workload, size
        fx = await ctx.fixture(ctx.fixture_key("hello"), size, ns)
        for step, replica in (("cold", 0), ("local1", 0), ("cross", 1)):
            await b.request(
                fx.messages,
                replica=replica,
                namespace=ns,
                workload="micro",
                step=step,
                key=f"hello/{step}",
                expected=fx.expected,
                fixture=fx,
                prompt_tokens=fx.prompt_tokens,
            )

    await ctx.run_blocks(ctx.block_plan(ctx.params["block_pairs"]), block)
