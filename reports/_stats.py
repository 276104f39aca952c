"""Statistics honest to the design: descriptive summaries and exact rank tests.

The independent unit is the block pair (a randomized complete block design:
requests of one block share its state). With fewer than
:data:`MIN_PAIRS_FOR_TEST` per-pair values the smallest attainable two-sided
p of an exact sign or signed-rank test is 2/2ⁿ ≥ 0.0625, so cells are
labelled descriptive and carry no p-values. With at least that many, a
cell's change is the Hodges–Lehmann estimate (the median of the per-pair
values' Walsh averages) with the exact Wilcoxon signed-rank confidence
interval around it, and the median with the exact sign-test interval beside
it: both from order statistics and the exact null distributions, never a
normal approximation and never over requests. Everything here is exact and
computed in a fixed order, so the same inputs give the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

MIN_PAIRS_FOR_TEST = 6
CONFIDENCE = Fraction(95, 100)
"""The nominal level of the intervals; each interval reports the level it attains exactly."""


def fmt(x: float | None, places: int = 6) -> float | None:
    """Round for output: stable text in JSON and Markdown across platforms."""
    if x is None or not math.isfinite(x):
        return None
    value = round(x, places)
    return 0.0 if value == 0 else value


def median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def mean(values: Sequence[float]) -> float | None:
    # fsum: exact, so the result does not depend on summation order.
    return math.fsum(values) / len(values) if values else None


def sign_test_p(values: Sequence[float]) -> float:
    """Exact two-sided sign test of median zero (zeros dropped)."""
    nonzero = [v for v in values if v != 0]
    n = len(nonzero)
    if n == 0:
        return 1.0
    k = min(sum(v > 0 for v in nonzero), sum(v < 0 for v in nonzero))
    tail = sum(Fraction(math.comb(n, i), 2**n) for i in range(k + 1))
    return float(min(Fraction(1), 2 * tail))


def _ranks(magnitudes: Sequence[float]) -> list[Fraction]:
    """Average ranks (1-based) with ties sharing their mean rank."""
    order = sorted(range(len(magnitudes)), key=lambda i: magnitudes[i])
    ranks: list[Fraction] = [Fraction(0)] * len(magnitudes)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and magnitudes[order[j + 1]] == magnitudes[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = Fraction(i + j + 2, 2)
        i = j + 1
    return ranks


def wilcoxon_p(values: Sequence[float]) -> float:
    """Exact two-sided Wilcoxon signed-rank p (zeros dropped, ties by average rank).

    The null distribution of W+ is enumerated exactly over doubled ranks
    (integers even with ties), so no normal approximation is involved.
    """
    nonzero = [v for v in values if v != 0]
    n = len(nonzero)
    if n == 0:
        return 1.0
    doubled = [int(2 * r) for r in _ranks([abs(v) for v in nonzero])]
    w_plus = sum(r for r, v in zip(doubled, nonzero, strict=True) if v > 0)
    counts: dict[int, int] = {0: 1}
    for r in doubled:
        nxt = dict(counts)
        for total, c in counts.items():
            nxt[total + r] = nxt.get(total + r, 0) + c
        counts = nxt
    expected = sum(doubled) / 2
    distance = abs(w_plus - expected)
    extreme = sum(c for total, c in counts.items() if abs(total - expected) >= distance)
    return min(1.0, extreme / 2**n)


def walsh_averages(values: Sequence[float]) -> list[float]:
    """Every (xᵢ + xⱼ)/2 with i ≤ j, sorted: n(n+1)/2 of them."""
    n = len(values)
    return sorted((values[i] + values[j]) / 2 for i in range(n) for j in range(i, n))


def hodges_lehmann(values: Sequence[float]) -> float | None:
    """The Hodges–Lehmann location estimate: the median of the Walsh averages."""
    return median(walsh_averages(values)) if values else None


def signed_rank_null(n: int) -> list[int]:
    """How many of the 2ⁿ sign assignments give each W⁺ = 0 … n(n+1)/2 (ranks 1 … n, no ties)."""
    counts = [1]
    for rank in range(1, n + 1):
        nxt = counts + [0] * rank
        for total, c in enumerate(counts):
            nxt[total + rank] += c
        counts = nxt
    return counts


def _depth(tail: Sequence[int], total: int, level: Fraction) -> tuple[int, Fraction] | None:
    """The largest k ≥ 1 with P(statistic ≤ k − 1) ≤ (1 − level)/2, and the level attained.

    ``tail[w]`` counts outcomes with statistic w out of ``total``; None when even k = 1 is too wide.
    """
    alpha_half = (1 - level) / 2
    k, below = 0, 0
    while k < len(tail) and Fraction(below + tail[k], total) <= alpha_half:
        below += tail[k]
        k += 1
    if k == 0:
        return None
    return k, 1 - 2 * Fraction(below, total)


def wilcoxon_interval(values: Sequence[float], level: Fraction = CONFIDENCE) -> dict[str, Any] | None:
    """Exact Wilcoxon signed-rank interval: Walsh averages k and M + 1 − k (1-based), M = n(n+1)/2,
    k the largest with P(W⁺ ≤ k − 1) ≤ (1 − level)/2 under the null; None for too few values."""
    n = len(values)
    if n == 0:
        return None
    found = _depth(signed_rank_null(n), 2**n, level)
    if found is None:
        return None
    k, attained = found
    walsh = walsh_averages(values)
    return {"low": walsh[k - 1], "high": walsh[len(walsh) - k], "level": float(attained), "depth": k}


def sign_interval(values: Sequence[float], level: Fraction = CONFIDENCE) -> dict[str, Any] | None:
    """Exact sign-test interval for the median: order statistics k and n + 1 − k, k the largest with
    P(B ≤ k − 1) ≤ (1 − level)/2 for B ~ Binomial(n, ½); None for too few values."""
    n = len(values)
    if n == 0:
        return None
    found = _depth([math.comb(n, i) for i in range(n + 1)], 2**n, level)
    if found is None:
        return None
    k, attained = found
    s = sorted(values)
    return {"low": s[k - 1], "high": s[n - k], "level": float(attained), "depth": k}


def paired_summary(per_pair: dict[int, list[float]]) -> dict[str, Any]:
    """Inference block for one cell from each block pair's mean change (%).

    ``per_pair`` maps block-pair index → that pair's unit changes.
    """
    pair_values = [mean(per_pair[p]) or 0.0 for p in sorted(per_pair)]
    n = len(pair_values)
    out: dict[str, Any] = {
        "unit": "block pair",
        "n_block_pairs": n,
        "pairs": sorted(per_pair),
        "per_pair_change_pct": [fmt(v) for v in pair_values],
    }
    if n < MIN_PAIRS_FOR_TEST:
        out["mode"] = "descriptive"
        out["note"] = (
            f"descriptive only: {n} block pair(s) < {MIN_PAIRS_FOR_TEST}; no confidence intervals or p-values"
        )
        return out
    out["mode"] = "exact rank tests over per-pair values"
    out["wilcoxon_signed_rank_p"] = fmt(wilcoxon_p(pair_values))
    out["sign_test_p"] = fmt(sign_test_p(pair_values))
    out["hodges_lehmann_change_pct"] = fmt(hodges_lehmann(pair_values))
    out["median_change_pct"] = fmt(median(pair_values))
    out["confidence"] = float(CONFIDENCE)
    for key, interval in (
        ("wilcoxon_ci", wilcoxon_interval(pair_values)),
        ("sign_ci", sign_interval(pair_values)),
    ):
        out[key] = (
            None if interval is None else {k: fmt(v) if k != "depth" else v for k, v in interval.items()}
        )
    return out
