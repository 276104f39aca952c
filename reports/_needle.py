"""The needle model's evaluation figures, derived from one ``needle_eval`` run's events."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ledger import Ledger


def needle_figures(led: Ledger, run_id: str) -> dict[str, Any]:
    """Accuracy, margin and rate per nominal size, from one run's events."""
    size_of: dict[str, int] = {}
    for e in led.events(run_id=run_id, kind="request.sent"):
        if not e.data.get("warmup") and e.data.get("nominal_tokens") is not None:
            size_of[e.data["request_id"]] = int(e.data["nominal_tokens"])
    passed: dict[int, list[bool]] = defaultdict(list)
    for e in led.events(run_id=run_id, kind="assertion.evaluated"):
        if e.data.get("check") == "exact_values" and e.data.get("request_id") in size_of:
            passed[size_of[e.data["request_id"]]].append(bool(e.data["passed"]))
    margins: dict[int, list[float]] = defaultdict(list)
    seconds, answered = 0.0, 0
    for e in led.events(run_id=run_id, kind="response.received"):
        size = size_of.get(e.data["request_id"])
        if size is None:
            continue
        if e.data.get("min_logprob_margin") is not None:
            margins[size].append(float(e.data["min_logprob_margin"]))
        if e.data.get("e2e_s") is not None:
            seconds += float(e.data["e2e_s"])
            answered += 1
    sizes = sorted(set(size_of.values()))
    return {
        "run_id": run_id,
        "n_by_size": {str(n): len(passed[n]) for n in sizes},
        "accuracy_by_size": {str(n): (sum(passed[n]) / len(passed[n]) if passed[n] else None) for n in sizes},
        "min_margin_by_size": {str(n): (round(min(margins[n]), 4) if margins[n] else None) for n in sizes},
        "requests_per_s": round(answered / seconds, 3) if seconds else None,
    }
