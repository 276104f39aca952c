"""The isolation certificate: before an ON configuration is measured, its cache isolation is shown.

Once per ON config and run, before the first measured request of its first ON block (after the
block's warmups: a fresh real replica's first request must not be a reuse), the runner sends one
payload as probes (``request.sent.probe`` ``isolation``; never measured):

1. ``isolation-prime`` under salt A on replica 0;
2. ``isolation-repeat`` under salt A on replica 0: it must hit (local or external hit tokens, or
   cached tokens in the response). This is the positive control: a deployment with caching off
   cannot pass, so a zero in step 3 means something;
3. ``isolation-other-salt`` under a salt B of its own on every replica: each must see zero hits
   on every tier: the replica's prefix cache, the connector's external hits, the response's
   cached tokens, LMCache's lookup-hit counter, and LMCache's per-salt hit counters where its
   metrics carry the salt as a label. A counter that was not read (a failed scrape) leaves the
   tier unproven: the certificate does not pass on what was not seen.

The result is one ``isolation.certified`` event (``passed``, and ``problems`` naming each failed
condition) for the block's ``config_sha256``. The audit's ``isolation-missing`` blocks performance
results of an ON config without a passing one.
"""

from __future__ import annotations

from typing import Any

from ._context import Block, Probed

__all__ = ["certify", "salt_hit_tokens"]

_LMCACHE = "lmcache"


def salt_hit_tokens(before: dict[str, float] | None, after: dict[str, float] | None, salt: str) -> int | None:
    """Increase of LMCache's hit counters labelled with ``salt`` (None: no such series exposed).
    Counters only (``*_total``): a client library's ``*_created`` series beside each counter holds
    the time the series first appeared, and a salt's series appear with its first lookup."""
    if before is None or after is None:
        return None
    label = f'="{salt}"'
    keys = [
        k
        for k in after
        if k.startswith(_LMCACHE)
        and "hit" in (name := k.split("{", 1)[0])
        and name.endswith("_total")
        and label in k
    ]
    if not keys:
        return None
    return round(sum(after[k] - before.get(k, 0.0) for k in keys))


def _tiers(probed: Probed, salt: str) -> dict[str, int | None]:
    d, outcome = probed.result.delta, probed.result.outcome
    return {
        "local_hit_tokens": None if d is None else d.local_hit_tokens,
        "external_hit_tokens": None if d is None else d.external_hit_tokens,
        "cached_tokens": outcome.cached_tokens,
        "lmcache_hit_tokens": None if d is None else d.lmcache_hit_tokens,
        "lmcache_salt_hit_tokens": salt_hit_tokens(probed.before, probed.after, salt),
    }


async def certify(b: Block) -> bool:
    """Take the certificate for ``b``'s ON config; records ``isolation.certified``."""
    ctx = b.ctx
    tokens = max(int(ctx.params.get("warmup_tokens") or 1000), 2 * int(ctx.target.chunk_size))
    salt_a = ctx.namespace("isolation", b.index, "a")
    fx = await ctx.fixture(ctx.fixture_key("isolation"), tokens, salt_a)
    common: dict[str, Any] = {"probe": "isolation", "fixture": fx}
    prime = await b.probe(
        fx.messages, replica=0, namespace=salt_a, step="isolation-prime", key="isolation/a/prime", **common
    )
    repeat = await b.probe(
        fx.messages, replica=0, namespace=salt_a, step="isolation-repeat", key="isolation/a/repeat", **common
    )
    problems: list[str] = []
    for name, probed in (("prime", prime), ("repeat", repeat)):
        if not probed.result.outcome.ok:
            problems.append(f"the {name} under salt A failed: {probed.result.outcome.error}")
    again = _tiers(repeat, salt_a)
    reused = [v for k, v in again.items() if k != "lmcache_salt_hit_tokens" and v]
    repeat_hits = max(reused, default=0)
    if not reused:
        problems.append(
            "the repeat under salt A hit nothing on any tier (caching off, or counters not read): "
            "zero hits under another salt would prove nothing"
        )
    others: list[dict[str, Any]] = []
    other_hits = 0
    for replica in range(len(b.replicas)):
        salt_b = ctx.namespace("isolation", b.index, "b", replica)
        await ctx.fixture(fx.key, tokens, salt_b)  # recorded under this salt too
        probed = await b.probe(
            fx.messages,
            replica=replica,
            namespace=salt_b,
            step="isolation-other-salt",
            key=f"isolation/b/r{replica}",
            **common,
        )
        tiers = _tiers(probed, salt_b)
        outcome = probed.result.outcome
        if not outcome.ok:
            problems.append(f"replica {replica} under salt B failed: {outcome.error}")
        for tier, value in tiers.items():
            if value:
                problems.append(f"replica {replica} under salt B saw {value} {tier.replace('_', ' ')}")
        for tier in ("local_hit_tokens", "external_hit_tokens"):
            if tiers[tier] is None:
                problems.append(f"replica {replica} under salt B: {tier.replace('_', ' ')} not read")
        others.append({"replica": replica, "request_id": outcome.request_id, "namespace": salt_b, **tiers})
        other_hits += sum(v or 0 for v in tiers.values())
    passed = not problems
    b.sink.emit(
        "isolation.certified",
        {
            "config_sha256": b.config_sha256,
            "arm": b.arm,
            "passed": passed,
            "problems": problems,
            "nominal_tokens": fx.nominal_tokens,
            "fixture_id": fx.fixture_id,
            "salt_a": salt_a,
            "prime_request_id": prime.result.outcome.request_id,
            "repeat_request_id": repeat.result.outcome.request_id,
            "repeat_hit_tokens": repeat_hits,
            "repeat": again,
            "other_salt_hit_tokens": other_hits,
            "other_salt": others,
        },
    )
    b.sink.flush()
    return passed
