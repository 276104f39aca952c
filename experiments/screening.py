"""The seed's screening: ON/OFF blocks of micro chains, sessions, generation, concurrency.

Defaults reproduce the study (its Sections 4.1-4.4): four independently
restarted blocks OFF-ON-ON-OFF (two block pairs, GPU assignment swapped in
the second), and per block six warmups and 192 measured requests:

- micro chains: 4 sizes x 2 chains x (cold, local1, local2 on replica A;
  cross, receiver_local on replica B) = 40; each reuse's text is checked
  against the chain's cold answer (``matches_cold_reference``);
- sessions: 32k and 128k starts x fixed/alternating x 2 sessions x 6 turns = 48,
  1,055 tokens appended per turn, canonical history;
- forced-length generation: 8k/128k x cold/hot x 512/2048 tokens, ignore_eos = 8;
- concurrency windows: 4 and 8 sessions x 4 turns x fixed/alternating, 32k = 96.

Every shape is a param; counts follow it. ``fault=namespace-leak`` rebuilds the
seed's excluded trial: micro namespaces without the size, so a larger size's
cold request hits the prefix its smaller sibling left on the same replica.
"""

from __future__ import annotations

from typing import Any

NAME = "screening"
SEED = 314159
PARAMS: dict[str, Any] = {
    "block_pairs": 2,
    "order": None,  # e.g. ["OFF","ON","ON","OFF"]; None: balanced for block_pairs (which must be even)
    "gpu_swap": True,  # swap GPU assignment in the second (every odd) pair
    "workloads": ["micro", "session", "generation", "concurrency"],
    "sizes": [8000, 32000, 128000, 256000],
    "chains": 2,
    "session_sizes": [32000, 128000],
    "sessions": 2,
    "session_turns": 6,
    "turn_growth": 1055,
    "placements": ["fixed", "alternating"],
    "generation_sizes": [8000, 128000],
    "generation_outputs": [512, 2048],
    "window_sessions": [4, 8],
    "window_turns": 4,
    "window_size": 32000,
    "warmups": 6,
    "warmup_tokens": 1000,
    "max_tokens": 64,
    "temperature": 0,
    "thinking": False,
    "fault": None,  # "namespace-leak": the seed's excluded trial
    "namespace_tag": None,  # None: a fresh tag per run (recorded; replays reuse it)
    "stop_on_block_failure": False,
}
MICRO_STEPS = ("cold", "local1", "local2", "cross", "receiver_local")
_WORKLOADS = ("micro", "session", "generation", "concurrency")


def check(params: dict[str, Any]) -> None:
    """Refuse shapes the design cannot run (ValueError → exit status 2)."""
    unknown = set(params["workloads"]) - set(_WORKLOADS)
    if unknown:
        raise ValueError(f"workloads: unknown {sorted(unknown)}; known: {list(_WORKLOADS)}")
    if params["fault"] not in (None, "namespace-leak"):
        raise ValueError(
            f"fault must be null or namespace-leak, got {params['fault']!r}"
            " (sim faults: --param sim_fault=...)"
        )
    if set(params["placements"]) - {"fixed", "alternating"}:
        raise ValueError("placements: only fixed and alternating")
    sizes = [
        *params["sizes"],
        *params["session_sizes"],
        *params["generation_sizes"],
        params["window_size"],
        params["warmup_tokens"],
    ]
    if any(not isinstance(s, int) or s < 200 for s in sizes):
        raise ValueError("sizes are integers of at least 200 tokens")


def planned(params: dict[str, Any]) -> dict[str, int]:
    """Measured requests per block, and the rest of the shape, from the params alone."""
    w, places = set(params["workloads"]), len(params["placements"])
    counts = {
        "micro": len(params["sizes"]) * params["chains"] * len(MICRO_STEPS) if "micro" in w else 0,
        "session": (len(params["session_sizes"]) * places * params["sessions"] * params["session_turns"])
        if "session" in w
        else 0,
        "generation": (
            len(params["generation_sizes"]) * 2 * len(params["generation_outputs"])
            if "generation" in w
            else 0
        ),
        "concurrency": (
            sum(params["window_sessions"]) * params["window_turns"] * places if "concurrency" in w else 0
        ),
    }
    return {
        **counts,
        "blocks": 2 * params["block_pairs"],
        "warmups_per_block": params["warmups"],
        "requests_per_block": sum(counts.values()),
    }


def plan(params: dict[str, Any]) -> dict[str, Any]:
    """Measured requests per block by workload and step, and each workload's nominal sizes: what
    ``plan.registered`` fixes before the first request (the audit holds the run to it)."""
    w, places = set(params["workloads"]), len(params["placements"])
    requests: dict[str, dict[str, int]] = {}
    sizes: dict[str, list[int]] = {}
    if "micro" in w:
        requests["micro"] = {step: len(params["sizes"]) * params["chains"] for step in MICRO_STEPS}
        sizes["micro"] = params["sizes"]
    if "session" in w:
        turns = len(params["session_sizes"]) * places * params["sessions"] * params["session_turns"]
        requests["session"] = {"turn": turns}
        sizes["session"] = params["session_sizes"]
    if "generation" in w:
        each = len(params["generation_sizes"]) * len(params["generation_outputs"])
        requests["generation"] = {"cold": each, "hot": each}
        sizes["generation"] = params["generation_sizes"]
    if "concurrency" in w:
        requests["concurrency"] = {"turn": sum(params["window_sessions"]) * params["window_turns"] * places}
        sizes["concurrency"] = [params["window_size"]]
    return {"requests": requests, "sizes": {k: sorted(set(v)) for k, v in sizes.items()}}


async def run(ctx: Any) -> None:
    p = ctx.params
    specs = ctx.block_plan(p["block_pairs"], p["order"], p["gpu_swap"])

    async def block(b: Any) -> None:
        await b.warmups(p["warmups"], p["warmup_tokens"])
        if "micro" in p["workloads"]:
            await micro(ctx, b)
        if "session" in p["workloads"]:
            await sessions(ctx, b)
        if "generation" in p["workloads"]:
            await generation(ctx, b)
        if "concurrency" in p["workloads"]:
            await concurrency(ctx, b)

    await ctx.run_blocks(specs, block)


async def micro(ctx: Any, b: Any) -> None:
    """Per size and chain: cold, two local reuses on A, cross to B, B's local reuse."""
    leak = ctx.params["fault"] == "namespace-leak"
    for size in ctx.params["sizes"]:
        for chain in range(ctx.params["chains"]):
            # The seed's fix: the size is part of the namespace. The leak drops it.
            ns = ctx.namespace("micro", f"c{chain}") if leak else ctx.namespace("micro", size, f"c{chain}")
            fx = await ctx.fixture(ctx.fixture_key("micro", chain), size, ns)
            a, r = chain % 2, (chain + 1) % 2
            cold = None
            for step in MICRO_STEPS:
                replica = a if step in ("cold", "local1", "local2") else r
                result = await b.request(
                    fx.messages,
                    replica=replica,
                    namespace=ns,
                    workload="micro",
                    step=step,
                    key=f"micro/{size}/c{chain}/{step}",
                    chain=chain,
                    expected=fx.expected,
                    fixture=fx,
                    prompt_tokens=fx.prompt_tokens,
                )
                if step == "cold":
                    cold = result
                elif cold is not None:
                    # Greedy output from reused KV (local or cross-replica) must equal the chain's
                    # cold computation of the same payload: the check that needs no meaningful answer.
                    await b.check_cold_reference(result, cold)
            b.sink.flush()


def _replicas(placement: str, start: int, turns: int) -> tuple[int, ...]:
    """Replica of each turn: fixed stays on ``start``, alternating switches every turn."""
    return tuple(start if placement == "fixed" else (start + t) % 2 for t in range(turns))


async def sessions(ctx: Any, b: Any) -> None:
    """Sequential multi-turn sessions, fixed and alternating, canonical history."""
    p = ctx.params
    for size in p["session_sizes"]:
        for placement in p["placements"]:
            for s in range(p["sessions"]):
                sid = f"session/{size}/{placement}/s{s}"
                ns = ctx.namespace("session", size, placement, f"s{s}")
                fx = await ctx.fixture(ctx.fixture_key("session", size, placement, s), size, ns)
                history = await ctx.history(fx, p["session_turns"], p["turn_growth"])
                await b.session(
                    history,
                    session=sid,
                    namespace=ns,
                    placement=placement,
                    key=sid,
                    replicas=_replicas(placement, s % 2, p["session_turns"]),
                )


async def generation(ctx: Any, b: Any) -> None:
    """Forced-length decode: cold then hot (same payload), exactly max_tokens out."""
    p = ctx.params
    for size in p["generation_sizes"]:
        for out in p["generation_outputs"]:
            ns = ctx.namespace("generation", size, out)
            fx = await ctx.fixture(ctx.fixture_key("generation", size, out), size, ns)
            for step in ("cold", "hot"):
                await b.request(
                    fx.messages,
                    replica=0,
                    namespace=ns,
                    workload="generation",
                    step=step,
                    key=f"generation/{size}/{out}/{step}",
                    max_tokens=out,
                    ignore_eos=True,
                    fixture=fx,
                    prompt_tokens=fx.prompt_tokens,
                )


async def concurrency(ctx: Any, b: Any) -> None:
    """Windows of N concurrent sessions, fixed and alternating; counters per window."""
    from experiments._context import SessionPlan

    p = ctx.params
    size, turns = p["window_size"], p["window_turns"]
    for n in p["window_sessions"]:
        for placement in p["placements"]:
            window = f"window/{n}/{placement}"
            plans = []
            for s in range(n):
                ns = ctx.namespace("window", n, placement, f"s{s}")
                fx = await ctx.fixture(ctx.fixture_key("window", n, placement, s), size, ns)
                history = await ctx.history(fx, turns, p["turn_growth"])
                plans.append(
                    SessionPlan(
                        f"{window}/s{s}",
                        history,
                        ns,
                        _replicas(placement, s % 2, turns),
                        placement,
                        f"{window}/s{s}",
                    )
                )
            await b.window(plans, window=window, placement=placement)
