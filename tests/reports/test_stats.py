"""Exact rank tests and intervals, checked against hand-enumerated distributions."""

from __future__ import annotations

import pytest

from reports._stats import (
    hodges_lehmann,
    paired_summary,
    sign_interval,
    sign_test_p,
    signed_rank_null,
    walsh_averages,
    wilcoxon_interval,
    wilcoxon_p,
)


def test_all_positive_six_gives_the_minimum() -> None:
    assert wilcoxon_p([1, 2, 3, 4, 5, 6]) == pytest.approx(2 / 64)
    assert sign_test_p([1, 2, 3, 4, 5, 6]) == pytest.approx(2 / 64)


def test_one_negative_smallest_rank() -> None:
    # W- = 1: subsets of {1..6} with sum <= 1 are {} and {1}: 2 of 64 per tail.
    assert wilcoxon_p([-1, 2, 3, 4, 5, 6]) == pytest.approx(4 / 64)
    # Sign test: P(K <= 1) = 7/64 per tail.
    assert sign_test_p([-1, 2, 3, 4, 5, 6]) == pytest.approx(14 / 64)


def test_ties_and_zeros() -> None:
    # Zeros are dropped; tied magnitudes share ranks (1.5, 1.5, 3): W+ = 4.5 of 6.
    p = wilcoxon_p([0.0, 1.0, -1.0, 2.0])
    # Null W+ over doubled ranks {3,3,6}: sums 0,3,3,6,6,9,9,12 → |W - 6| >= 3 in 6 of 8.
    assert p == pytest.approx(6 / 8)


def test_descriptive_below_six_pairs() -> None:
    out = paired_summary({0: [-10.0], 1: [-12.0]})
    assert out["mode"] == "descriptive" and "wilcoxon_signed_rank_p" not in out
    assert out["n_block_pairs"] == 2


# --- Hodges–Lehmann and exact intervals ------------------------------------------------------------


def test_the_signed_rank_null_distribution_by_hand() -> None:
    # n = 3, ranks {1, 2, 3}: subset sums 0, 1, 2, 3 (twice: {3} and {1,2}), 4, 5, 6.
    assert signed_rank_null(3) == [1, 1, 1, 2, 1, 1, 1]
    assert sum(signed_rank_null(10)) == 2**10


def test_six_pairs_give_the_widest_interval_at_96_9_percent() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    # 21 Walsh averages, symmetric about 3.5; P(W+ <= 0) = 1/64 <= 2.5 %, P(W+ <= 1) = 2/64 > 2.5 %:
    # depth 1, the extreme Walsh averages, attained level 1 - 2/64.
    assert len(walsh_averages(values)) == 21 and hodges_lehmann(values) == 3.5
    assert wilcoxon_interval(values) == {"low": 1.0, "high": 6.0, "level": 1 - 2 / 64, "depth": 1}
    assert sign_interval(values) == {"low": 1.0, "high": 6.0, "level": 1 - 2 / 64, "depth": 1}


def test_eight_pairs_by_hand() -> None:
    values = [float(v) for v in range(1, 9)]
    # W+ null for n = 8: counts 1, 1, 1, 2, 2 for W = 0..4; P(W+ <= 3) = 5/256 <= 2.5 % < 7/256:
    # depth 4. Walsh averages of 1..8 ascending 1, 1.5, 2, 2, ... and descending 8, 7.5, 7, 7, ...
    assert signed_rank_null(8)[:5] == [1, 1, 1, 2, 2]
    assert wilcoxon_interval(values) == {"low": 2.0, "high": 7.0, "level": 1 - 10 / 256, "depth": 4}
    # Sign test: P(B <= 0) = 1/256, P(B <= 1) = 9/256 > 2.5 %: depth 1, the extremes.
    assert sign_interval(values) == {"low": 1.0, "high": 8.0, "level": 1 - 2 / 256, "depth": 1}


def test_five_pairs_have_no_exact_95_percent_interval() -> None:
    # The narrowest-possible tail is 1/32 > 2.5 %: exactly why fewer than 6 pairs stay descriptive.
    assert wilcoxon_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert sign_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None


def _w_plus(values: list[float], shift: float) -> float:
    """W+ of values − shift, by ranking the magnitudes directly (an independent computation)."""
    diffs = [v - shift for v in values]
    order = sorted(range(len(diffs)), key=lambda i: abs(diffs[i]))
    return float(sum(rank + 1 for rank, i in enumerate(order) if diffs[i] > 0))


@pytest.mark.parametrize(
    "values",
    [
        [-3.1, 0.4, 2.2, 5.0, -0.7, 1.9, 3.3],
        [12.0, -4.5, 7.25, 0.5, 9.0, 3.0, -1.0, 6.5, 2.0, 11.0],
        [-20.0, -18.5, -22.0, -19.0, -17.0, -21.5],
    ],
)
def test_the_wilcoxon_interval_inverts_the_signed_rank_test(values: list[float]) -> None:
    """Shifts inside the interval keep W+ within [k, M − k]; just outside, they leave it (scipy is not
    installed here, so the check is this inversion, computed by ranking directly)."""
    ci = wilcoxon_interval(values)
    assert ci is not None
    k, m = ci["depth"], len(values) * (len(values) + 1) // 2
    eps = 1e-9
    for shift in (ci["low"] + eps, ci["high"] - eps, (ci["low"] + ci["high"]) / 2):
        assert k <= _w_plus(values, shift) <= m - k
    assert _w_plus(values, ci["low"] - eps) > m - k
    assert _w_plus(values, ci["high"] + eps) < k
    assert ci["low"] <= hodges_lehmann(values) <= ci["high"]


def test_summary_with_six_pairs_reports_the_estimate_and_intervals() -> None:
    out = paired_summary({p: [-10.0 - p, -12.0 - p] for p in range(6)})
    pair_values = [-11.0, -12.0, -13.0, -14.0, -15.0, -16.0]  # each pair's mean change
    assert out["per_pair_change_pct"] == pair_values
    assert out["hodges_lehmann_change_pct"] == -13.5 and out["median_change_pct"] == -13.5
    assert out["wilcoxon_ci"] == {"low": -16.0, "high": -11.0, "level": 0.96875, "depth": 1}
    assert out["sign_ci"] == out["wilcoxon_ci"]
