"""The service regression: correctness before performance (the seed's Section 3.4, Table 2).

One ON deployment of the configuration under test (its ``config_sha256`` is
in ``run.started.params`` and in every assertion), and every answer checked:

- the original failing long-context fixture (``size``, 128k by default):
  cold on A, local reuse on A, cross-replica reuse on B (full prefix hit),
  B's local reuse;
- directional reuse the other way: B computes, A reuses (``reverse_size``);
- exact retrieval of the three inserted values, in every request;
- interleaved multi-turn sessions on alternating replicas;
- the salt control: each cross-replica answer is compared with the same
  input computed cold under a fresh ``cache_salt`` (``salt_control``: zero
  hits; ``matches_cold_reference``: the same text).

With an injected transfer fault (``--param sim_fault=corrupt-transfer`` or
``unordered-copy``) the cross-replica answers are wrong while HTTP says 200
and the hit counters rise: the run completes with failed assertions, exit 1.
"""

from __future__ import annotations

from typing import Any

from collectors import assertion_event

NAME = "validation"
SEED = 314159
PARAMS: dict[str, Any] = {
    "size": 128000,
    "reverse_size": 32000,
    "session_size": 32000,
    "sessions": 2,
    "session_turns": 4,
    "turn_growth": 1055,
    "warmups": 2,
    "warmup_tokens": 1000,
    "max_tokens": 64,
    "temperature": 0,
    "thinking": False,
    "namespace_tag": None,
}


def check(params: dict[str, Any]) -> None:
    sizes = (params["size"], params["reverse_size"], params["session_size"], params["warmup_tokens"])
    if any(not isinstance(s, int) or s < 200 for s in sizes):
        raise ValueError("sizes are integers of at least 200 tokens")
    if params["sessions"] < 1 or params["session_turns"] < 1:
        raise ValueError("sessions and session_turns must be at least 1")


def planned(params: dict[str, Any]) -> dict[str, int]:
    directional = 5 + 3  # long chain + its control; reverse pair + its control
    return {
        "blocks": 1,
        "warmups_per_block": params["warmups"],
        "requests_per_block": directional + params["sessions"] * params["session_turns"],
    }


def plan(params: dict[str, Any]) -> dict[str, Any]:
    """Requests per step (the two directional chains, their salt controls, the sessions) and sizes."""
    sizes = {params["size"], params["reverse_size"], params["session_size"]}
    return {
        "requests": {
            "validation": {
                "cold": 4,  # each chain's cold request and its salt control
                "local1": 1,
                "cross": 2,
                "receiver_local": 1,
                "turn": params["sessions"] * params["session_turns"],
            }
        },
        "sizes": {"validation": sorted(sizes)},
    }


async def run(ctx: Any) -> None:
    specs = ctx.block_plan(1, ["ON"], gpu_swap=False)[:1]

    async def block(b: Any) -> None:
        p = ctx.params
        await b.warmups(p["warmups"], p["warmup_tokens"])
        await reuse(
            ctx, b, "long", p["size"], computes=0, steps=("cold", "local1", "cross", "receiver_local")
        )
        await reuse(ctx, b, "reverse", p["reverse_size"], computes=1, steps=("cold", "cross"))
        await interleaved_sessions(ctx, b)

    await ctx.run_blocks(specs, block)


async def reuse(ctx: Any, b: Any, name: str, size: int, computes: int, steps: tuple[str, ...]) -> None:
    """Replica ``computes`` computes the fixture, the other reuses it; cross answer vs a cold one."""
    ns = ctx.namespace("validation", name, size)
    fx = await ctx.fixture(ctx.fixture_key("validation", name), size, ns)
    other = 1 - computes
    cross = None
    for step in steps:
        replica = computes if step in ("cold", "local1") else other
        result = await b.request(
            fx.messages,
            replica=replica,
            namespace=ns,
            workload="validation",
            step=step,
            key=f"validation/{name}/{step}",
            expected=fx.expected,
            fixture=fx,
            prompt_tokens=fx.prompt_tokens,
        )
        if step == "cross":
            cross = result
    if cross is not None:
        await salt_control(ctx, b, fx, name, size, other, cross)


async def salt_control(ctx: Any, b: Any, fx: Any, name: str, size: int, replica: int, cross: Any) -> None:
    """The same input under a fresh ``cache_salt``: zero hits, and the same answer as the reuse."""
    ns = ctx.namespace("validation", name, size, "control")
    await ctx.fixture(fx.key, size, ns)  # recorded under the control namespace too
    control = await b.request(
        fx.messages,
        replica=replica,
        namespace=ns,
        workload="validation",
        step="cold",
        key=f"validation/{name}/control",
        expected=fx.expected,
        fixture=fx,
        prompt_tokens=fx.prompt_tokens,
        control_of=cross.outcome.request_id,
    )
    d = control.delta
    hits = None
    if d is not None and d.local_hit_tokens is not None:
        hits = d.local_hit_tokens + (d.external_hit_tokens or 0)
    b.count_check(
        assertion_event(
            b.sink,
            control.outcome.request_id,
            "salt_control",
            0,
            hits,
            hits == 0 and control.outcome.ok,
            True,
            b.config_sha256,
            reused_request_id=cross.outcome.request_id,
        )
    )
    await b.check_cold_reference(cross, control)


async def interleaved_sessions(ctx: Any, b: Any) -> None:
    """Sessions advanced turn by turn in turn, each turn on the other replica than the last."""
    p = ctx.params
    size, n, turns = p["session_size"], p["sessions"], p["session_turns"]
    plans = []
    for s in range(n):
        ns = ctx.namespace("validation", "session", size, f"s{s}")
        fx = await ctx.fixture(ctx.fixture_key("validation", "session", s), size, ns)
        plans.append((f"validation/session/s{s}", ns, await ctx.history(fx, turns, p["turn_growth"])))
    done: dict[str, list[Any]] = {sid: [] for sid, _, _ in plans}
    for t in range(turns):
        for s, (sid, ns, history) in enumerate(plans):
            turn = history.turns[t]
            result = await b.request(
                turn.messages,
                replica=(s + t) % 2,
                namespace=ns,
                workload="validation",
                step="turn",
                key=f"{sid}/t{t}",
                expected=history.fixture.expected,
                independent=t == 0,
                fixture=history.fixture,
                prompt_tokens=turn.prompt_tokens,
                session=sid,
                turn=t,
                placement="alternating",
            )
            done[sid].append(result)
    for s, (sid, _, history) in enumerate(plans):
        results = done[sid]
        b.sink.emit(
            "session.finished",
            {
                "session": sid,
                "placement": "alternating",
                "turns": len(results),
                "wall_s": sum(r.seconds for r in results),
                "nominal_tokens": history.fixture.nominal_tokens,
                "replicas": [(s + t) % 2 for t in range(len(results))],
                "requests": [r.outcome.request_id for r in results],
                "workload": "validation",
            },
        )
    b.sink.flush()
