"""Exact rank tests, checked against hand-enumerated distributions."""

from __future__ import annotations

import pytest

from reports._stats import paired_summary, sign_test_p, wilcoxon_p


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
