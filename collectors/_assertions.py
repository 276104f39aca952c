"""Response assertions, each recorded as one ``assertion.evaluated`` event.

Every ``check_*`` evaluates, emits, and returns whether it passed; none
raises for a bad response (a missing value simply fails the check).

The rules, exactly:

- ``exact_values``: the answer's JSON object (first one found: inside a
  code fence, else the first ``{...}`` that parses, else the whole text) has,
  for every expected name, a value equal to the expected one. Integers
  written as JSON strings (``"938639"``) count as that integer; nothing else
  is coerced.
- ``output_length``: usage ``completion_tokens`` == ``max_tokens``
  (forced-length generation with ``ignore_eos``).
- ``zero_hits`` (cold requests): the single-request window's local and
  external hit-token deltas are both 0, and, when the response reports
  ``cached_tokens``, that is 0 too (it is local + external in one number,
  and it does not depend on the Prometheus counters). A counter that could
  not be read fails the check.
- ``full_prefix_hit`` (ON, cross-replica): ``shareable = floor((P - 1) / C)
  * C`` with P the prompt tokens and C the tier's chunk size: vLLM always
  computes the last prompt token, and the connector stores whole chunks only.
  The receiver may already hold a prefix locally (``local_hit_tokens``, L);
  the connector is then asked only for what lies beyond it. The check
  passes when ``L + external_hit_tokens >= shareable`` and, unless
  ``L >= shareable``, ``external_hit_tokens > 0``. ``expected`` is
  ``shareable``, ``observed`` the external hit tokens, ``local_hit_tokens``
  is recorded beside them. With a cold receiver (L = 0) this is plain
  equality-or-more of external hits with the shareable prefix.
- ``matches_cold_reference``: the text's SHA-256 equals that of the same
  payload computed cold (fresh ``cache_salt``); both must be complete.
- ``no_external_hits_off``: an OFF-arm window saw 0 external hit tokens.
- ``stream_complete``: HTTP 200, ``[DONE]`` seen, usage seen when asked,
  no malformed chunk.
- ``counters_match`` (single-request windows): the replica's prefix-query
  increment equals the response's ``prompt_tokens`` (vLLM queries every
  prompt token once), and, when the response reports ``cached_tokens``, the
  local + external hit increments add up to it. Stale or reset counters,
  or traffic from outside the window, fail it (the audit's counter-mismatch).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ._client import EventSink, Outcome
from ._metrics import HitDelta

__all__ = [
    "assertion_event",
    "check_counters_match",
    "check_exact_values",
    "check_full_prefix_hit",
    "check_matches_cold_reference",
    "check_no_external_hits_off",
    "check_output_length",
    "check_stream_complete",
    "check_zero_hits",
    "extract_json_object",
    "shareable_prefix",
]

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
_DECODER = json.JSONDecoder()


def assertion_event(
    sink: EventSink,
    request_id: str | None,
    check: str,
    expected: Any,
    observed: Any,
    passed: bool,
    independent: bool,
    config_sha256: str | None,
    **extra: Any,
) -> bool:
    """Emit one ``assertion.evaluated``; returns ``passed``."""
    sink.emit(
        "assertion.evaluated",
        {
            "request_id": request_id,
            "check": check,
            "expected": expected,
            "observed": observed,
            "passed": bool(passed),
            "independent": bool(independent),
            "config_sha256": config_sha256,
            **extra,
        },
    )
    return bool(passed)


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The answer's JSON object, tolerating prose and code fences around it."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for candidate in candidates:
        start = candidate.find("{")
        while start != -1:
            try:
                obj, _ = _DECODER.raw_decode(candidate, start)
            except ValueError:
                start = candidate.find("{", start + 1)
                continue
            if isinstance(obj, dict):
                return obj
            start = candidate.find("{", start + 1)
    return None


def _same(expected: Any, observed: Any) -> bool:
    if isinstance(expected, int) and not isinstance(expected, bool) and isinstance(observed, str):
        s = observed.strip()
        return bool(re.fullmatch(r"-?[0-9]+", s)) and int(s) == expected
    if isinstance(expected, bool) or isinstance(observed, bool):
        return expected is observed
    return bool(expected == observed)


def check_exact_values(
    sink: EventSink,
    outcome: Outcome,
    expected: Mapping[str, Any],
    *,
    independent: bool,
    config_sha256: str | None,
) -> bool:
    """Every expected name answered with exactly its value."""
    answer = extract_json_object(outcome.text) if outcome.ok else None
    if answer is None:
        observed: Any = None
        passed = False
        mismatched = sorted(expected)
    else:
        observed = {k: answer.get(k) for k in expected}
        mismatched = [k for k, v in expected.items() if k not in answer or not _same(v, answer[k])]
        passed = not mismatched
    return assertion_event(
        sink,
        outcome.request_id,
        "exact_values",
        dict(expected),
        observed,
        passed,
        independent,
        config_sha256,
        mismatched=mismatched,
        parsed=answer is not None,
        response_error=outcome.error,
    )


def check_output_length(
    sink: EventSink,
    outcome: Outcome,
    max_tokens: int,
    *,
    independent: bool = True,
    config_sha256: str | None,
) -> bool:
    """Forced-length generation produced exactly ``max_tokens`` tokens."""
    passed = outcome.output_tokens == max_tokens
    return assertion_event(
        sink,
        outcome.request_id,
        "output_length",
        max_tokens,
        outcome.output_tokens,
        passed,
        independent,
        config_sha256,
        finish_reason=outcome.finish_reason,
    )


def check_zero_hits(
    sink: EventSink,
    request_id: str,
    delta: HitDelta,
    *,
    cached_tokens: int | None = None,
    independent: bool = True,
    config_sha256: str | None,
) -> bool:
    """A cold request hit nothing: local 0, external 0 (and cached_tokens 0 when reported)."""
    observed = {
        "local_hit_tokens": delta.local_hit_tokens,
        "external_hit_tokens": delta.external_hit_tokens,
        "cached_tokens": cached_tokens,
    }
    passed = (
        delta.local_hit_tokens == 0
        and delta.external_hit_tokens == 0
        and (cached_tokens is None or cached_tokens == 0)
    )
    expected = {"local_hit_tokens": 0, "external_hit_tokens": 0, "cached_tokens": 0}
    return assertion_event(
        sink, request_id, "zero_hits", expected, observed, passed, independent, config_sha256
    )


def shareable_prefix(prompt_tokens: int, chunk_size: int) -> int:
    """Tokens a connector can supply: whole chunks of all but the last prompt token."""
    if prompt_tokens < 1 or chunk_size < 1:
        return 0
    return (prompt_tokens - 1) // chunk_size * chunk_size


def check_full_prefix_hit(
    sink: EventSink,
    request_id: str,
    delta: HitDelta,
    prompt_tokens: int | None,
    chunk_size: int,
    *,
    independent: bool = True,
    config_sha256: str | None,
) -> bool:
    """ON cross-replica: external (+ already-local) hits cover the whole shareable prefix."""
    shareable = shareable_prefix(prompt_tokens, chunk_size) if prompt_tokens is not None else None
    ext, local = delta.external_hit_tokens, delta.local_hit_tokens
    if shareable is None or ext is None or local is None:
        passed = False
    else:
        passed = local + ext >= shareable and (ext > 0 or local >= shareable)
    return assertion_event(
        sink,
        request_id,
        "full_prefix_hit",
        shareable,
        ext,
        passed,
        independent,
        config_sha256,
        local_hit_tokens=local,
        prompt_tokens=prompt_tokens,
        chunk_size=chunk_size,
    )


def check_matches_cold_reference(
    sink: EventSink,
    outcome: Outcome,
    reference: Outcome,
    *,
    independent: bool = True,
    config_sha256: str | None,
) -> bool:
    """Same text as the same payload computed cold (a fresh ``cache_salt``)."""
    passed = (
        outcome.ok
        and reference.ok
        and outcome.text_sha256 is not None
        and outcome.text_sha256 == reference.text_sha256
    )
    return assertion_event(
        sink,
        outcome.request_id,
        "matches_cold_reference",
        reference.text_sha256,
        outcome.text_sha256,
        passed,
        independent,
        config_sha256,
        reference_request_id=reference.request_id,
    )


def check_no_external_hits_off(
    sink: EventSink,
    delta: HitDelta,
    *,
    request_id: str | None = None,
    window: str | None = None,
    replica: int | str | None = None,
    independent: bool = True,
    config_sha256: str | None,
) -> bool:
    """An OFF-arm request or window loaded nothing through the connector."""
    passed = delta.external_hit_tokens == 0
    return assertion_event(
        sink,
        request_id,
        "no_external_hits_off",
        0,
        delta.external_hit_tokens,
        passed,
        independent,
        config_sha256,
        window=window,
        replica=replica,
    )


def check_stream_complete(
    sink: EventSink,
    outcome: Outcome,
    *,
    independent: bool = True,
    config_sha256: str | None,
) -> bool:
    """HTTP 200 and a complete stream ([DONE], usage when asked, no bad chunk)."""
    return assertion_event(
        sink,
        outcome.request_id,
        "stream_complete",
        {"status": 200, "error": None},
        {"status": outcome.status, "error": outcome.error},
        outcome.ok,
        independent,
        config_sha256,
    )


def check_counters_match(
    sink: EventSink,
    request_id: str,
    delta: HitDelta,
    prompt_tokens: int | None,
    cached_tokens: int | None = None,
    *,
    independent: bool = True,
    config_sha256: str | None,
) -> bool:
    """The window's counter increments agree with what the response itself reports."""
    # Without a connector the external counters may be absent: they count as 0.
    local, ext = delta.local_hit_tokens, delta.external_hit_tokens
    hits = None if local is None else local + (ext or 0)
    expected = {"prefix_queries": prompt_tokens, "hit_tokens": cached_tokens}
    observed = {"prefix_queries": delta.prefix_queries, "hit_tokens": hits}
    passed = (
        prompt_tokens is not None
        and delta.prefix_queries == prompt_tokens
        and (cached_tokens is None or hits == cached_tokens)
        and not delta.counter_reset
    )
    return assertion_event(
        sink,
        request_id,
        "counters_match",
        expected,
        observed,
        passed,
        independent,
        config_sha256,
        counter_reset=delta.counter_reset,
    )
