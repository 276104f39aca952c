"""The cyclic collector paused while a report is built (reports/_gc.py)."""

from __future__ import annotations

import gc

from reports._gc import no_cycle_collection


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_the_collector_resumes_without_a_young_generation_of_everything_made_while_paused() -> None:
    gc.collect()
    assert gc.isenabled()
    with no_cycle_collection():
        assert not gc.isenabled()
        made = [{"row": i} for i in range(50_000)]
        with no_cycle_collection():  # nested: the outer one resumes it
            assert not gc.isenabled()
        assert not gc.isenabled()
        assert gc.get_count()[0] > 50_000  # all of it young while paused
        _Node()
    assert gc.isenabled()
    # Resumed with the young generation empty (else its first collection walks all of `made`),
    # and nothing left frozen: the cycle made while paused is still the collector's to free.
    assert gc.get_count()[0] < gc.get_threshold()[0]
    assert gc.get_freeze_count() == 0
    assert gc.collect() >= 1
    assert len(made) == 50_000


def test_a_paused_collector_stays_paused() -> None:
    gc.disable()
    try:
        with no_cycle_collection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
