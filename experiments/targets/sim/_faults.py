"""Injectable faults from the seed, and the spec syntax that selects them.

Spec syntax (``--fault``)::

    SPEC  := FAULT ("," FAULT)*          e.g. "corrupt-transfer,http-errors:every=3"
    FAULT := KIND (":" KEY "=" VALUE)* ["@" SCOPE]
    SCOPE := "replica=" INDEX | "tier"   (INDEX is 0-based, as in replica_urls)

Without a scope a fault applies everywhere it can. ``""`` or ``"none"`` means
no fault. Kinds, their keys (defaults) and where they act:

- ``corrupt-transfer``: state loaded from the shared tier is wrong; answers
  come back garbled, still HTTP 200 with hits counted. Scope: the replica
  that loads, or ``tier`` (every load).
- ``unordered-copy`` (``delta=15``, ``chunk``): state loaded from the tier is
  slightly wrong; one value whose needle lies in the loaded range is off by
  ``delta`` (938639 → 938624). With ``chunk=J`` only the prompt's chunk J
  (0-based, ``chunk_size`` tokens) comes in wrong, as one misplaced chunk of a
  long load: an answer shows it only if it reads a value in that chunk (a
  spot question mostly does not; an every-line one does where the chunk holds
  a value line). Scope as ``corrupt-transfer``.
- ``namespace-leak``: ``cache_salt`` is ignored when hashing: in the replica's
  local prefix cache (``@replica=N``), the tier's keys (``@tier``), or both.
- ``stale-counters`` (``after=0``): after that many finished requests the
  Prometheus counters stop advancing (replica counters, tier counters or both).
- ``http-errors`` (``every=3``, or ``rate=F``; ``status=500``): the n-th
  completion request (1-based, per replica) fails with ``status`` when
  ``n % every == 0``, or, with ``rate``, when a stable hash of n falls below
  ``rate``. Deterministic. Replicas only.
- ``truncated-stream`` (``after=2``, ``die=0``): a stream ends cleanly after
  ``after`` content chunks, with no finish, usage chunk or ``[DONE]``; a
  non-streaming response is cut mid-body. With ``die=1`` the replica then
  answers 503 to ``/health`` and to completions, as the seed's SIGILL death.
  Replicas only.
- ``slow-start`` (``requests=1``, ``delay=5.0``): the first ``requests``
  completions after (re)start wait ``delay`` extra simulated seconds before
  prefill (scaled by ``time_scale`` like every delay). Replicas only.
- ``near-tie`` (``margin=0.01``): the last digit of an answer's first value
  is a near tie between two tokens (top-1 minus top-2 logprob ``margin``), so
  batch numerics decide it: every other completion of the replica (even
  ordinals) picks the runner-up, cold or reused alike. No state is wrong.
  Replicas only.
- ``cache-off``: nothing is ever reused, as a deployment launched with
  prefix caching disabled: the replica's local prefix cache (``@replica=N``),
  the tier (``@tier``), or both never hit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from ._answers import Taint

__all__ = ["FAULT_KINDS", "Fault", "FaultSet", "parse_faults"]

# Kind -> allowed keys with their defaults (as strings, parsed on use).
_DEFAULTS: Final[dict[str, dict[str, str]]] = {
    "corrupt-transfer": {},
    "unordered-copy": {"delta": "15", "chunk": ""},
    "namespace-leak": {},
    "stale-counters": {"after": "0"},
    "http-errors": {"every": "3", "rate": "", "status": "500"},
    "truncated-stream": {"after": "2", "die": "0"},
    "slow-start": {"requests": "1", "delay": "5.0"},
    "near-tie": {"margin": "0.01"},
    "cache-off": {},
}
FAULT_KINDS: Final = tuple(_DEFAULTS)
_REPLICA_ONLY: Final = frozenset({"http-errors", "truncated-stream", "slow-start", "near-tie"})
_LOAD_FAULTS: Final = ("corrupt-transfer", "unordered-copy")


@dataclass(frozen=True)
class Fault:
    """One fault: its kind, parameters and scope."""

    kind: str
    params: Mapping[str, str] = field(default_factory=dict)
    replica: int | None = None  # None: not limited to one replica
    tier_only: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _DEFAULTS:
            raise ValueError(f"unknown fault {self.kind!r}; known: {', '.join(FAULT_KINDS)}")
        unknown = set(self.params) - set(_DEFAULTS[self.kind])
        if unknown:
            raise ValueError(f"fault {self.kind!r} has no parameter(s) {sorted(unknown)}")
        if self.tier_only and self.kind in _REPLICA_ONLY:
            raise ValueError(f"fault {self.kind!r} acts on replicas, not on the tier")
        # Fail at parse time, not mid-request, on a malformed number.
        for key in self.params:
            if self.params[key]:
                float(self.params[key])
        chunk = self.params.get("chunk", "")
        if chunk and not chunk.isdigit():
            raise ValueError(f"fault {self.kind!r}: chunk must be a chunk index (0, 1, ...), got {chunk!r}")

    def _raw(self, key: str) -> str:
        return self.params.get(key) or _DEFAULTS[self.kind][key]

    def int_param(self, key: str) -> int:
        return int(float(self._raw(key)))

    def float_param(self, key: str) -> float:
        raw = self._raw(key)
        return float(raw) if raw else 0.0

    def has_param(self, key: str) -> bool:
        return bool(self._raw(key))

    def on_replica(self, index: int) -> bool:
        return not self.tier_only and (self.replica is None or self.replica == index)

    def on_tier(self) -> bool:
        return self.replica is None

    def spec(self) -> str:
        """The canonical spec text of this fault."""
        text = self.kind + "".join(f":{k}={v}" for k, v in sorted(self.params.items()))
        if self.tier_only:
            return text + "@tier"
        return text if self.replica is None else f"{text}@replica={self.replica}"


def _parse_one(text: str) -> Fault:
    body, _, scope = text.partition("@")
    kind, *pairs = body.strip().split(":")
    params: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"fault parameter {pair!r} is not KEY=VALUE (in {text!r})")
        params[key.strip()] = value.strip()
    scope = scope.strip()
    if not scope:
        return Fault(kind, params)
    if scope == "tier":
        return Fault(kind, params, tier_only=True)
    name, sep, index = scope.partition("=")
    if name != "replica" or not sep or not index.isdigit():
        raise ValueError(f"fault scope {scope!r} is not 'replica=N' or 'tier'")
    return Fault(kind, params, replica=int(index))


def parse_faults(spec: str | Fault | Iterable[Fault | str] | None) -> tuple[Fault, ...]:
    """Parse a spec string (see module doc), a Fault, or a list of either."""
    if spec is None:
        return ()
    if isinstance(spec, Fault):
        return (spec,)
    if isinstance(spec, str):
        if spec.strip().lower() in ("", "none", "off"):
            return ()
        return tuple(_parse_one(part) for part in spec.split(",") if part.strip())
    return tuple(f for item in spec for f in parse_faults(item))


class FaultSet:
    """The active faults, queried by replicas and the tier."""

    def __init__(self, spec: str | Fault | Iterable[Fault | str] | None = None) -> None:
        self.faults = parse_faults(spec)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def spec(self) -> str:
        return ",".join(f.spec() for f in self.faults) or "none"

    def replica(self, index: int, kind: str) -> Fault | None:
        return next((f for f in self.faults if f.kind == kind and f.on_replica(index)), None)

    def tier(self, kind: str) -> Fault | None:
        return next((f for f in self.faults if f.kind == kind and f.on_tier()), None)

    def load_taint(self, index: int) -> Taint | None:
        """Taint given to state that replica ``index`` loads from the tier."""
        for kind in _LOAD_FAULTS:
            fault = self.replica(index, kind) or self.tier(kind)
            if fault is not None:
                if kind != "unordered-copy":
                    return Taint(kind, 0)
                chunk = fault.int_param("chunk") if fault.has_param("chunk") else None
                return Taint(kind, fault.int_param("delta"), chunk)
        return None

    def near_tie(self, index: int, ordinal: int) -> tuple[float, bool] | None:
        """The near tie's margin on replica ``index``, and whether the ``ordinal``-th (1-based)
        completion picks the runner-up; None without the fault."""
        fault = self.replica(index, "near-tie")
        if fault is None:
            return None
        return fault.float_param("margin"), ordinal % 2 == 0

    def http_error(self, index: int, ordinal: int) -> int | None:
        """Status to fail the ``ordinal``-th (1-based) completion with, if any."""
        fault = self.replica(index, "http-errors")
        if fault is None:
            return None
        if fault.has_param("rate"):
            digest = hashlib.sha256(f"http-errors:{index}:{ordinal}".encode()).digest()
            failing = int.from_bytes(digest[:8], "big") / 2**64 < fault.float_param("rate")
        else:
            failing = ordinal % max(1, fault.int_param("every")) == 0
        return fault.int_param("status") if failing else None
