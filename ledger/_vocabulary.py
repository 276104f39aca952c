"""The event vocabulary: each kind's required ``data`` fields and their types.

Producers may add fields; required ones must be present with an allowed type.
``None`` in a type tuple means the field may be null.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._errors import EventError

Types = tuple[type | None, ...]

STR: Types = (str,)
INT: Types = (int,)
NUM: Types = (int, float)
BOOL: Types = (bool,)
OBJ: Types = (dict,)
LIST: Types = (list,)
ANY: Types = (str, int, float, bool, dict, list, None)


def _opt(types: Types) -> Types:
    return (*types, None)


_LAUNCH = {
    "replica": (int, str),
    "gpu": _opt((dict, int, str)),
    "endpoint": STR,
    "engine": STR,
    "engine_version": _opt(STR),
    "command": _opt((list, str)),
    "env": OBJ,
    "model": OBJ,
    "config_sha256": STR,
    "kv_connector": _opt((dict, str)),
}
_SERVICE = {
    "service": STR,
    "endpoint": STR,
    "command": _opt((list, str)),
    "env": OBJ,
    "version": _opt(STR),
    "pool_bytes": _opt(INT),
    "pinned": _opt(BOOL),
}
_BLOCK = {"index": INT, "arm": STR, "pair": INT, "status": _opt(STR)}

KINDS: dict[str, dict[str, Types]] = {
    "run.started": {
        "experiment": STR,
        "script_sha256": STR,
        "params": OBJ,
        "seed": _opt(INT),
        "code": OBJ,
        "packages": OBJ,
        "host": OBJ,
    },
    "run.finished": {"status": STR, "error": _opt(STR)},
    "block.started": _BLOCK,
    "block.finished": _BLOCK,
    "deployment.launched": _LAUNCH,
    "deployment.stopped": {"replica": (int, str), "endpoint": STR},
    "service.launched": _SERVICE,
    "service.stopped": {"service": STR, "endpoint": STR},
    "checkpoint.audited": {
        "path": STR,
        "revision": _opt(STR),
        "files": LIST,
        "matched": _opt(BOOL),
        "stable": BOOL,
    },
    "config.recorded": {"name": STR, "sha256": STR, "content": (str, dict, list)},
    "fixture.created": {
        "fixture_id": STR,
        "namespace": STR,
        "nominal_tokens": INT,
        "payload_sha256": STR,
        "expected": _opt((dict, list)),
    },
    "request.sent": {
        "request_id": STR,
        "replica": (int, str),
        "gpu": _opt((dict, int, str)),
        "workload": STR,
        "step": STR,
        "warmup": BOOL,
        "payload_sha256": STR,
        "namespace": STR,
        "nominal_tokens": _opt(INT),
        "params": OBJ,
    },
    "response.received": {
        "request_id": STR,
        "status": _opt(INT),
        "ttft_s": _opt(NUM),
        "t_first": _opt(NUM),
        "t_last": _opt(NUM),
        "e2e_s": _opt(NUM),
        "prompt_tokens": _opt(INT),
        "output_tokens": _opt(INT),
        "cached_tokens": _opt(INT),
        "decode_rate": _opt(NUM),
        "text_sha256": _opt(STR),
        "finish_reason": _opt(STR),
        "error": _opt(STR),
    },
    "metrics.scraped": {"replica": (int, str), "endpoint": STR, "samples": OBJ},
    "hits.observed": {
        "replica": (int, str),
        "prefix_queries": _opt(INT),
        "local_hit_tokens": _opt(INT),
        "external_hit_tokens": _opt(INT),
    },
    "session.finished": {"session": (int, str), "placement": STR, "turns": INT, "wall_s": NUM},
    "window.finished": {
        "window": (int, str),
        "placement": STR,
        "sessions": INT,
        "requests": INT,
        "output_tokens": INT,
        "wall_s": NUM,
    },
    "assertion.evaluated": {
        "request_id": _opt(STR),
        "check": STR,
        "expected": ANY,
        "observed": ANY,
        "passed": BOOL,
        "independent": BOOL,
    },
    "probe.copy": {
        "method": STR,
        "direction": STR,
        "bytes": INT,
        "delay_cycles": INT,
        "trial": INT,
        "mismatching_bytes": INT,
        "passed": BOOL,
        "gpu": _opt((dict, int, str)),
    },
    "probe.pinned_alloc": {
        "bytes_requested": INT,
        "is_pinned": BOOL,
        "seconds": NUM,
        "alloc_conf": _opt(STR),
    },
    # One check of an LMCache allocator and GPU copy helper (collectors/probes/lmcache_helpers.py).
    "probe.helper": {
        "allocator": STR,
        "helper": STR,
        "ops_requested": STR,
        "with_ops": _opt(BOOL),
        "direction": STR,
        "bytes": INT,
        "delay_cycles": INT,
        "trial": INT,
        "passed": BOOL,
        "mismatching_bytes": _opt(INT),
        "first_bad_offset": _opt(INT),
        "error": _opt(STR),
        "transfer_path": STR,
        "lmcache_version": _opt(STR),
        "lmcache_source_sha256": _opt(STR),
        "torch_version": _opt(STR),
        "cuda_runtime_version": _opt(STR),
        "gpu": _opt((dict, int, str)),
    },
    # LMCache's local CPU pool at one size and setting (collectors/probes/lmcache_pool.py).
    "probe.pinned": {
        "setting": OBJ,
        "bytes_requested": INT,
        "bytes_reserved": _opt(INT),
        "is_pinned": BOOL,
        "seconds": NUM,
        "alloc_conf": _opt(STR),
        "ops_requested": STR,
        "with_ops": _opt(BOOL),
        "error": _opt(STR),
        "transfer_path": STR,
        "lmcache_version": _opt(STR),
    },
    # The runner's isolation certificate of one ON config (experiments/_isolation.py).
    "isolation.certified": {
        "config_sha256": STR,
        "passed": BOOL,
        "problems": LIST,
        "repeat_hit_tokens": _opt(INT),
        "other_salt_hit_tokens": _opt(INT),
    },
    # The runner's triage of one divergent answer (experiments/_triage.py).
    "divergence.triaged": {
        "request_id": STR,
        "trigger": STR,
        "cold_request_id": STR,
        "repeat_request_id": STR,
        "resends_agree": BOOL,
        "first_divergent_token": _opt(INT),
        "margin": _opt(NUM),
        "tie_margin": NUM,
        "batch_invariant": OBJ,
        "classification": STR,
    },
    "exclusion.declared": {"scope": STR, "target": STR, "reason": STR},
    "note.added": {"text": STR},
    # Another tool's result file (ledger import --from TOOL), a run of its own: what the file
    # says and where it came from; its figures compare nothing (no arms) and check nothing.
    "import.recorded": {
        "tool": STR,
        "tool_version": _opt(STR),
        "file_name": STR,
        "file_sha256": STR,
        "file_bytes": INT,
        "requests": INT,
        "model": _opt(STR),
        "target": _opt(STR),
        "summary": OBJ,
    },
    "import.request": {
        "index": INT,
        "tool": STR,
        "ttft_s": _opt(NUM),
        "e2e_s": _opt(NUM),
        "prompt_tokens": _opt(INT),
        "output_tokens": _opt(INT),
        "itl_s": _opt(LIST),
        "cached_tokens": _opt(INT),
        "error": _opt(STR),
    },
    # A block's starting cache state, read before its first request (experiments/_context.py).
    "cache.inspected": {
        "replicas": LIST,
        "reset_ok": _opt(BOOL),
        "kv_cache_usage": _opt(NUM),
        "lmcache_stored_objects": _opt(INT),
    },
    # What a run will do, fixed before its first request (experiments/_context.py): the audit
    # compares what happened with it (plan-deviation).
    "plan.registered": {
        "experiment": STR,
        "seed": _opt(INT),
        "order": LIST,
        "order_rule": STR,
        "requests_per_block": OBJ,
        "warmups_per_block": INT,
        "sizes": OBJ,
        "thresholds": OBJ,
        "plan_sha256": STR,
    },
}

# Fields where one of several alternatives is required.
_ONE_OF: dict[str, tuple[str, ...]] = {"hits.observed": ("request_id", "window")}

ENUMS: dict[tuple[str, str], frozenset[str]] = {
    ("run.finished", "status"): frozenset({"completed", "failed", "aborted"}),
    ("block.started", "arm"): frozenset({"ON", "OFF"}),
    ("block.finished", "arm"): frozenset({"ON", "OFF"}),
    ("exclusion.declared", "scope"): frozenset({"block", "request", "run"}),
    ("plan.registered", "order_rule"): frozenset({"balanced", "given"}),
    ("probe.helper", "allocator"): frozenset({"lazy", "mixed"}),
    ("probe.helper", "direction"): frozenset({"d2h", "h2d"}),
    ("probe.helper", "ops_requested"): frozenset({"present", "masked"}),
    ("probe.pinned", "ops_requested"): frozenset({"present", "masked"}),
    ("import.recorded", "tool"): frozenset({"vllm-bench", "guidellm"}),
    ("import.request", "tool"): frozenset({"vllm-bench", "guidellm"}),
    ("divergence.triaged", "trigger"): frozenset({"exact_values", "matches_cold_reference"}),
    ("divergence.triaged", "classification"): frozenset({"numeric-tie", "state-corruption", "inconclusive"}),
}

# Fields checked only where present: ledgers recorded before they existed lack them.
OPTIONAL_ENUMS: dict[str, tuple[tuple[str, frozenset[str]], ...]] = {
    # What dated t_first/t_last: collectors.TTFT_METHODS (the kernel's receive stamp, or user space).
    "response.received": (("ttft_method", frozenset({"kernel-stamp", "socket-read", "httpx-read"})),),
}


def _type_name(types: Types) -> str:
    return " or ".join("null" if t is None else t.__name__ for t in types)


def _matches(value: Any, types: Types) -> bool:
    if value is None:
        return None in types
    if isinstance(value, bool):
        # bool is an int subclass; only accept it where bool is named.
        return bool in types
    return any(t is not None and isinstance(value, t) for t in types)


# A required field, precompiled: (name, types, exact, allowed). ``exact`` holds the
# types accepted by identity, one hash lookup per field; bool is not int there,
# just as _matches wants. Plain tuples: this runs once per field of every event.
_Field = tuple[str, Types, frozenset[type], frozenset[str] | None]
_MISSING = object()


def _compile(kind: str, fields: dict[str, Types]) -> tuple[_Field, ...]:
    return tuple(
        (name, types, frozenset(type(None) if t is None else t for t in types), ENUMS.get((kind, name)))
        for name, types in fields.items()
    )


_COMPILED: dict[str, tuple[_Field, ...]] = {kind: _compile(kind, f) for kind, f in KINDS.items()}


def check_data(kind: str, data: Mapping[str, Any]) -> tuple[str | None, str] | None:
    """Return ``(field, problem)`` for the first violation, or ``None``."""
    fields = _COMPILED.get(kind)
    if fields is None:
        return None, f"unknown kind {kind!r}"
    get = data.get
    for name, types, exact, allowed in fields:
        value = get(name, _MISSING)
        # Subclasses (an IntEnum, a str subclass) miss the exact set: take the slow check.
        if type(value) not in exact:
            if value is _MISSING:
                return name, f"required field of {kind} is missing"
            if not _matches(value, types):
                return name, f"must be {_type_name(types)}, got {type(value).__name__}"
        if allowed is not None and value not in allowed:
            return name, f"must be one of {sorted(allowed)}, got {value!r}"
    for name, allowed in OPTIONAL_ENUMS.get(kind, ()):
        value = get(name)
        if value is not None and value not in allowed:
            return name, f"must be one of {sorted(allowed)}, got {value!r}"
    alternatives = _ONE_OF.get(kind)
    if alternatives and not any(get(a) is not None for a in alternatives):
        return alternatives[0], f"{kind} needs one of {', '.join(alternatives)}"
    return None


# What the native sealer (ledger/_cseal.c) reads: per kind, its required fields as
# (name, types accepted by identity, allowed values or None), its optional enums and
# its one-of alternatives. It only ever accepts; anything else it hands to check_data.
NativeSpec = dict[str, tuple[tuple[tuple[str, frozenset[type], frozenset[str] | None], ...], Any, Any]]


def native_spec() -> NativeSpec:
    """The vocabulary in the form ledger/_cseal.c reads (see :data:`NativeSpec`)."""
    return {
        kind: (
            tuple((name, exact, allowed) for name, _, exact, allowed in fields),
            OPTIONAL_ENUMS.get(kind, ()),
            _ONE_OF.get(kind, ()),
        )
        for kind, fields in _COMPILED.items()
    }


def validate(kind: str, data: Mapping[str, Any]) -> None:
    """Raise :class:`EventError` naming the field if ``data`` violates ``kind``."""
    problem = check_data(kind, data)
    if problem is not None:
        field, message = problem
        raise EventError(message, f"data.{field}" if field else "kind")
