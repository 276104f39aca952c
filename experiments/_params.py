"""``--param k=v`` parsing and checking against an experiment's defaults.

A value is read as a JSON literal when it parses (``4``, ``0.5``, ``true``,
``null``, ``[8000,32000]``, ``{"a":1}``), else taken as a string
(``fault=namespace-leak``). Names must be known: the experiment's ``PARAMS``
or the target options in :data:`TARGET_PARAMS`; a value must have its
default's type (int where a float is expected is fine; a null default takes
anything).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from collectors import DEFAULT_TTFT_METHOD
from ledger import ParamError

__all__ = ["CLIENT_PARAMS", "TARGET_PARAMS", "ParamError", "check_params", "parse_param", "parse_params"]

TARGET_PARAMS: Final[dict[str, Any]] = {
    "replicas": 2,
    "time_scale": 0.005,
    "sim_fault": None,
    "hash_seed": 0,
    "sim_capacity_blocks": 65_536,
    "sim_device": "sim",
    "sim_exact_values_up_to_tokens": None,
}
"""Options of the sim target (not of the experiment), settable by ``--param`` for every experiment.

``time_scale`` 0.005: the seed screening's modelled time (about 3,300 simulated
seconds, most of it long prefills and forced-length decodes) takes about 16 s,
and a cold 128k prefill (about 0.1 s) still dwarfs a cross-replica reuse. A
reuse's few modelled milliseconds are then below the server's own work on a
128k prompt (transfer, parsing, hashing: 5-20 ms on a small, busy machine),
so cross and local reuse look alike; ``scripts/demo`` runs at 0.05, where
cross-replica reuse (23 ms modelled at 128k) is clearly slower than local.

``hash_seed`` is the ``PYTHONHASHSEED`` the sim's replicas record, as the vllm
target's do (the sim hashes chunks with SHA-256 and shares either way):
``--param hash_seed=null`` records replicas launched without one.

``sim_capacity_blocks``: each replica's prefix cache, blocks of 16 tokens (its
``vllm:cache_config_info`` ``num_gpu_blocks``); the default holds about a
million tokens, so the seed's workloads fit. A smaller one puts a workload
beyond the device cache (the report's regime), with LRU eviction.

``sim_device``: the device model the sim's replicas report (``gpu.name`` of
``deployment.launched`` and ``request.sent``), as a real replica reports its
GPU's. Not part of the config digest, as a GPU's model is not: a replay given
another one stands for the same run replayed on other hardware, which
``ledger report --pool-replays`` does not pool with its original.

``sim_exact_values_up_to_tokens``: the largest prompt whose answers the sim
stands for as served (a vllm target's model card limit; null: every size), so
that exact-value checks above it do not apply. Not part of the config digest,
as a card is not: a card's limit may grow with its evidence between a run and
its replay, which registers the limit its original registered.
"""


CLIENT_PARAMS: Final[dict[str, Any]] = {"ttft_method": DEFAULT_TTFT_METHOD, "asked_lines": "spot"}
"""Options of the request client, settable by ``--param`` for every target.

``ttft_method``: which transport and clock date each response's first and last
content chunk (``kernel-stamp``, ``socket-read`` or ``httpx-read``; see
collectors.TTFT_METHODS). The resolved value is in ``run.started.params``, and
every ``response.received`` records the method that actually dated it.

``asked_lines``: what each fixture's question asks (experiments.fixture_text.ASKED_LINES):
``spot`` (the seed's: the first value line, the middle one and ``end_value``), ``every``
(every value line and ``end_value``, answers about 1.5 % of the prompt's tokens long) or ``dense``
(a value line every 10 lines, closer than a cache chunk, every one asked: about 6 %); for
``every`` and ``dense`` a served model's card must show it answers them for the checks to apply,
see experiments/needle).
"""


def parse_param(text: str) -> tuple[str, Any]:
    """``k=v`` → (k, typed v)."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ParamError(f"--param {text!r} is not NAME=VALUE")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return name, value


def parse_params(items: Iterable[str]) -> dict[str, Any]:
    """Every ``k=v``; a name given twice keeps the last value."""
    return dict(parse_param(item) for item in items)


def _type_ok(default: Any, value: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, type(default))


def check_params(
    defaults: Mapping[str, Any], given: Mapping[str, Any], target_defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """Defaults overridden by ``given``; raises :class:`ParamError` naming the culprit."""
    known = {**target_defaults, **defaults}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ParamError(f"unknown param(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    for name, value in given.items():
        if not _type_ok(known[name], value):
            want = type(known[name]).__name__
            raise ParamError(f"param {name} must be {want}, got {json.dumps(value)}")
    return {**known, **given}
