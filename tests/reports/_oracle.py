"""Expected report numbers computed straight from generated envelopes, in plain Python.

Independent of reports/ (no SQL, no shared helpers), so the tests compare two derivations.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

Env = dict[str, Any]
KEY_FIELDS = ("workload", "step", "nominal_tokens", "placement", "chain", "session", "window", "turn")


def of_kind(events: list[Env], kind: str) -> list[Env]:
    return [e for e in events if e["kind"] == kind]


def blocks(events: list[Env]) -> dict[str, dict[str, Any]]:
    return {e["block_id"]: e["data"] for e in of_kind(events, "block.started")}


def excluded_blocks(events: list[Env]) -> set[str]:
    hits = {
        e["data"]["request_id"]: e["data"]
        for e in of_kind(events, "hits.observed")
        if e["data"]["request_id"]
    }
    out = set()
    for e in of_kind(events, "request.sent"):
        d = e["data"]
        h = hits.get(d["request_id"], {})
        if (
            e["block_id"]
            and d["step"] == "cold"
            and not d["warmup"]
            and ((h.get("local_hit_tokens") or 0) > 0 or (h.get("external_hit_tokens") or 0) > 0)
        ):
            out.add(e["block_id"])
    for e in of_kind(events, "exclusion.declared"):
        if e["data"]["scope"] == "block":
            out.add(e["data"]["target"])
    for e in of_kind(events, "block.finished"):
        if e["data"]["status"] in ("failed", "aborted"):
            out.add(e["block_id"])
    return out


def measured(events: list[Env]) -> list[Env]:
    bl, ex = blocks(events), excluded_blocks(events)
    return [
        e
        for e in of_kind(events, "request.sent")
        if e["block_id"] in bl
        and e["block_id"] not in ex
        and not e["data"]["warmup"]
        and not e["data"].get("probe")
    ]


def pairs(events: list[Env]) -> list[tuple[Env, Env]]:
    bl = blocks(events)
    groups: dict[tuple[Any, ...], dict[str, list[Env]]] = defaultdict(lambda: {"ON": [], "OFF": []})
    for e in measured(events):
        b = bl[e["block_id"]]
        groups[(e["run_id"], b["pair"], *(e["data"].get(k) for k in KEY_FIELDS))][b["arm"]].append(e)
    return [(on, off) for g in groups.values() for on, off in zip(g["ON"], g["OFF"], strict=False)]


def accounting(events: list[Env]) -> dict[str, Any]:
    bl, ex = blocks(events), excluded_blocks(events)
    meas = measured(events)
    ids = {e["data"]["request_id"] for e in meas}
    checks = [e["data"] for e in of_kind(events, "assertion.evaluated") if e["data"]["request_id"] in ids]
    ps = pairs(events)
    return {
        "measured": len(meas),
        "warmups": sum(
            1
            for e in of_kind(events, "request.sent")
            if e["block_id"] in bl and e["block_id"] not in ex and e["data"]["warmup"]
        ),
        "pairs": len(ps),
        "matched_pairs": sum(
            1
            for on, off in ps
            if on["data"]["payload_sha256"] == off["data"]["payload_sha256"]
            and on["data"]["gpu"] == off["data"]["gpu"]
        ),
        "exact_value_checks": sum(1 for c in checks if c["check"] == "exact_values"),
        "exact_value_passed": sum(1 for c in checks if c["check"] == "exact_values" and c["passed"]),
        "forced_length_checks": sum(1 for c in checks if c["check"] == "output_length"),
        "not_independent": sum(1 for c in checks if c["check"] == "exact_values" and not c["independent"]),
        "excluded_blocks": sorted(ex),
    }


def ttft_cells(events: list[Env]) -> dict[tuple[int, str], dict[str, Any]]:
    """(size, locality) → per-arm medians and the mean paired change, from raw responses."""
    bl = blocks(events)
    ttft = {e["data"]["request_id"]: e["data"]["ttft_s"] for e in of_kind(events, "response.received")}
    cells: dict[tuple[int, str], dict[str, Any]] = defaultdict(lambda: {"ON": [], "OFF": [], "changes": []})
    for e in measured(events):
        d = e["data"]
        if d["workload"] == "micro" and d["step"] in ("cold", "local1", "cross"):
            cells[(d["nominal_tokens"], d["step"])][bl[e["block_id"]]["arm"]].append(ttft[d["request_id"]])
    for on, off in pairs(events):
        d = on["data"]
        if (
            d["workload"] == "micro"
            and d["step"] in ("cold", "local1", "cross")
            and d["payload_sha256"] == off["data"]["payload_sha256"]
            and d["gpu"] == off["data"]["gpu"]
        ):
            ratio = ttft[d["request_id"]] / ttft[off["data"]["request_id"]]
            cells[(d["nominal_tokens"], d["step"])]["changes"].append(100 * (ratio - 1))
    return {
        k: {
            "ON": statistics.median(v["ON"]),
            "OFF": statistics.median(v["OFF"]),
            "mean_change": statistics.fmean(v["changes"]),
            "units": len(v["changes"]),
        }
        for k, v in cells.items()
    }
