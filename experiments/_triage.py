"""Divergence triage: is an answer that left its reference a numeric near tie or wrong state?

When a measured answer fails its exact values, or differs from the same payload computed cold
(``matches_cold_reference``), the runner re-sends that payload twice to the replica that gave
it, under one fresh ``cache_salt``, asking for the top-2 logprobs of every token:

- ``triage-cold``: a forced cold computation (nothing is cached under the fresh salt);
- ``triage-repeat``: the same again, which may reuse what the forced cold just computed.

Both are probes (``request.sent.probe`` ``triage``): recorded, never measured. From the answers:

- ``first_divergent_token``: the first token (in the forced cold's tokens) at which the answers
  of this payload part: the divergent answer, its cold reference, and the two re-sends;
- ``margin``: the forced cold's top-1 minus top-2 logprob at that token (the repeat's where
  the cold has none): how near a tie the greedy choice was there;
- ``resends_agree``: whether the forced cold and the repeat gave the same text.

Classification (the audit derives it again from the recorded texts' digests and the margin):

- ``state-corruption``: the re-sends agree with each other but not with the divergent answer:
  freshly computed state gives another answer than the state the divergent answer used;
- ``numeric-tie``: the margin is below ``tie_margin`` and cold computations disagree too (the
  re-sends with each other, or with the cold reference): the greedy choice flips on numerics;
- ``inconclusive``: anything else (a re-send failed, no logprobs, a wide margin with cold
  answers that disagree, or re-sends that reproduce the divergent answer).

Batch-invariant mode (vLLM's ``VLLM_BATCH_INVARIANT=1``) is set when a replica is launched, so a
re-send cannot ask for it: ``batch_invariant`` records whether the replicas were launched with it
(then the re-sends ran in it) or why no re-send ran in it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from collectors import Outcome

from ._context import Block, Sent

__all__ = ["TIE_MARGIN", "batch_invariant", "classify", "first_divergence", "triage"]

TIE_MARGIN = 0.1
"""Top-1 minus top-2 logprob (nats) below which a greedy choice counts as a near tie."""
_ENV = "VLLM_BATCH_INVARIANT"


def first_divergence(tokens: Sequence[tuple[str | None, float | None]], text: str) -> int | None:
    """Index of the first of ``tokens`` whose text leaves ``text``; None when the tokens spell
    ``text`` exactly or are not known (a token without its text)."""
    pos = 0
    for i, (token, _) in enumerate(tokens):
        if token is None:
            return None
        if not text.startswith(token, pos):
            return i
        pos += len(token)
    return len(tokens) if pos < len(text) else None


def classify(
    *,
    resends_ok: bool,
    resends_agree: bool,
    matches_divergent: bool,
    cold_disagree: bool,
    margin: float | None,
) -> str:
    """The rule of the module docstring (the audit's SQL applies the same one)."""
    if not resends_ok:
        return "inconclusive"
    if resends_agree and not matches_divergent:
        return "state-corruption"
    if margin is not None and margin < TIE_MARGIN and cold_disagree:
        return "numeric-tie"
    return "inconclusive"


def batch_invariant(b: Block) -> dict[str, Any]:
    """Whether the block's replicas run batch-invariant, from what their launch recorded."""
    launches = [r.data for r in b.launch.records if r.kind == "deployment.launched"]
    engines = {str(d.get("engine")) for d in launches}
    if engines == {"sim"}:
        return {"available": False, "detail": "the sim has no batch-invariant mode"}
    envs = [d.get("env") or {} for d in launches]
    if envs and all(str(e.get(_ENV, "")) == "1" for e in envs):
        return {"available": True, "detail": f"replicas launched with {_ENV}=1: the re-sends ran in it"}
    return {
        "available": False,
        "detail": f"{_ENV}=1 is set when a replica is launched and these replicas were launched "
        "without it: the re-sends ran in the engine's default mode",
    }


def _margin_at(index: int | None, *outcomes: Outcome) -> float | None:
    if index is None:
        return None
    for o in outcomes:
        if index < len(o.token_margins) and o.token_margins[index][1] is not None:
            return o.token_margins[index][1]
    return None


async def triage(b: Block, sent: Sent, outcome: Outcome, reference: Outcome | None, trigger: str) -> str:
    """Re-send, measure the divergence, classify it; records ``divergence.triaged``."""
    ctx = b.ctx
    # Named by the request's key, not its id: a replay re-sends the same bytes.
    salt = ctx.namespace("triage", b.index, hashlib.sha256(sent.key.encode()).hexdigest()[:16])
    if sent.fixture is not None:
        await ctx.fixture(sent.fixture.key, sent.fixture.nominal_tokens, salt)
    common: dict[str, Any] = {
        "replica": sent.replica,
        "namespace": salt,
        "probe": "triage",
        "max_tokens": sent.max_tokens,
        "ignore_eos": sent.ignore_eos,
        "logprobs": True,
        "fixture": sent.fixture,
    }
    cold = (await b.probe(sent.messages, step="triage-cold", key=f"triage/{sent.key}/cold", **common)).result
    repeat = (
        await b.probe(sent.messages, step="triage-repeat", key=f"triage/{sent.key}/repeat", **common)
    ).result
    c, r = cold.outcome, repeat.outcome
    resends_ok = c.ok and r.ok
    agree = resends_ok and c.text == r.text
    matches_divergent = resends_ok and c.text == outcome.text
    reference_agrees = None if reference is None or not c.ok else reference.text == c.text
    cold_disagree = resends_ok and (not agree or reference_agrees is False)
    index = None
    if c.ok:
        others = [t.text for t in (outcome, reference, r) if t is not None and t.ok and t.text != c.text]
        found = [i for i in (first_divergence(c.token_margins, t) for t in others) if i is not None]
        index = min(found, default=None)
    margin = _margin_at(index, c, r)
    verdict = classify(
        resends_ok=resends_ok,
        resends_agree=agree,
        matches_divergent=matches_divergent,
        cold_disagree=cold_disagree,
        margin=margin,
    )
    d = repeat.delta
    b.sink.emit(
        "divergence.triaged",
        {
            "request_id": outcome.request_id,
            "trigger": trigger,
            "reference_request_id": None if reference is None else reference.request_id,
            "config_sha256": b.config_sha256,
            "replica": sent.replica,
            "namespace": salt,
            "cold_request_id": c.request_id,
            "repeat_request_id": r.request_id,
            "resends_ok": resends_ok,
            "resends_agree": agree,
            "resends_match_divergent": matches_divergent,
            "reference_matches_cold": reference_agrees,
            "first_divergent_token": index,
            "margin": margin,
            "tie_margin": TIE_MARGIN,
            "logprobs_served": bool(c.token_margins),
            "repeat_hit_tokens": None
            if d is None or d.local_hit_tokens is None
            else d.local_hit_tokens + (d.external_hit_tokens or 0),
            "batch_invariant": batch_invariant(b),
            "classification": verdict,
        },
    )
    b.sink.flush()
    return verdict
