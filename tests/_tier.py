"""The shared tier's scrapes against the windows they should surround, read from a run's events."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from ledger import Event


def tier_scrapes(
    scrapes: Iterable[Event], endpoints: Mapping[Any, str]
) -> dict[Any, tuple[dict[tuple[str, str, str], int], dict[tuple[str, str, str], int]]]:
    """Per block, the tier scrapes each window should have (one before and one after every window
    the replicas were scraped for) and those taken, keyed (request id, window, phase). Every tier
    scrape is asserted to come from its block's ``endpoints`` entry and not to have failed."""
    windows: dict[Any, set[tuple[str, str]]] = {}
    taken: dict[Any, Counter[tuple[str, str, str]]] = {}
    for e in scrapes:
        d = e.data
        scope = (d["request_id"] or "", d["window"] or "")
        if d["replica"] == "tier":
            assert d["endpoint"] == endpoints[e.block_id] and d["error"] is None, d
            taken.setdefault(e.block_id, Counter())[(*scope, d["phase"])] += 1
        else:
            windows.setdefault(e.block_id, set()).add(scope)
    return {
        block: (
            {(*w, phase): 1 for w in windows.get(block, set()) for phase in ("before", "after")},
            dict(taken.get(block, {})),
        )
        for block in windows.keys() | taken.keys()
    }
