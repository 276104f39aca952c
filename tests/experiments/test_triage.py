"""The triage's two rules on their own: where answers part, and how a divergence is classed."""

from __future__ import annotations

import pytest

from experiments._triage import TIE_MARGIN, classify, first_divergence

TOKENS = [("{", 9.0), ('"alpha"', 9.0), (": ", 9.0), ("938", 9.0), ("639", 0.01), ("}", 9.0)]


@pytest.mark.parametrize(
    ("text", "index"),
    [
        ('{"alpha": 938639}', None),  # the same answer: no divergence
        ('{"alpha": 938630}', 4),  # the tied token
        ('{"alpha": 483184}', 3),  # garbled from the value's first token
        ('{"alpha": 938639} and more', 6),  # the other answer goes on past these tokens
        ('{"alpha": 938', 4),  # ... or stops inside them
    ],
)
def test_first_divergence_is_the_first_token_that_leaves_the_other_text(text: str, index: int | None) -> None:
    assert first_divergence(TOKENS, text) == index


def test_a_token_without_its_text_gives_no_index() -> None:
    assert first_divergence([("{", 9.0), (None, 9.0)], "{x") is None


def test_the_classes() -> None:
    near = TIE_MARGIN / 10
    common = {"resends_ok": True, "matches_divergent": False}
    assert classify(**common, resends_agree=True, cold_disagree=False, margin=9.0) == "state-corruption"
    # The re-sends agreeing decides, whatever the margin (the conservative reading).
    assert classify(**common, resends_agree=True, cold_disagree=False, margin=near) == "state-corruption"
    assert classify(**common, resends_agree=False, cold_disagree=True, margin=near) == "numeric-tie"
    assert classify(**common, resends_agree=False, cold_disagree=True, margin=9.0) == "inconclusive"
    assert classify(**common, resends_agree=False, cold_disagree=True, margin=None) == "inconclusive"
    # Re-sends that reproduce the divergent answer: the reference is what differs.
    agreed = {"resends_ok": True, "resends_agree": True, "matches_divergent": True}
    assert classify(**agreed, cold_disagree=True, margin=near) == "numeric-tie"
    assert classify(**agreed, cold_disagree=False, margin=9.0) == "inconclusive"
    failed = {"resends_agree": False, "matches_divergent": False, "cold_disagree": True, "margin": near}
    assert classify(resends_ok=False, **failed) == "inconclusive"
