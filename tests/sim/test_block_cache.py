"""BlockCache finds a chain's cached prefix by bisection and moves blocks with C loops; it must
answer, order and evict exactly as the plain per-block walk does, under any mix of chains that
share prefixes, taints, lookups with and without touching, eviction and resets."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.targets.sim._answers import Taint
from experiments.targets.sim._cache import BlockCache, chain_hashes

_TAINT = Taint("corrupt-transfer")


class _Walk:
    """The reference: every block visited in Python, as the cache did before bisection."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[bytes, Taint | None] = OrderedDict()

    def lookup(self, hashes: Sequence[bytes], touch: bool) -> list[Taint | None]:
        hit = []
        for h in hashes:
            if h not in self.blocks:
                break
            hit.append(h)
        if touch:
            for h in reversed(hit):
                self.blocks.move_to_end(h)
        return [self.blocks[h] for h in hit]

    def insert(self, hashes: Sequence[bytes], taints: Sequence[Taint | None]) -> None:
        for h, taint in zip(reversed(hashes), reversed(taints), strict=True):
            if h in self.blocks:
                self.blocks.move_to_end(h)
            else:
                self.blocks[h] = taint
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


# Prompts over a tiny vocabulary share prefixes often; unit 2 makes chains of a few blocks.
_PROMPT = st.lists(st.integers(0, 2), min_size=0, max_size=14)
_OP = st.tuples(
    st.sampled_from(["insert", "lookup", "peek", "clear"]),
    _PROMPT,
    st.lists(st.booleans(), min_size=7, max_size=7),
)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 12), st.lists(_OP, max_size=40))
def test_bisection_agrees_with_the_per_block_walk(
    capacity: int, ops: list[tuple[str, list[int], list[bool]]]
) -> None:
    cache, walk = BlockCache(capacity), _Walk(capacity)
    for op, prompt, marks in ops:
        hashes = chain_hashes(prompt, 2, "salt")
        if op == "insert":
            taints = [_TAINT if marks[i % len(marks)] else None for i in range(len(hashes))]
            cache.insert(hashes, taints)
            walk.insert(hashes, taints)
        elif op == "clear":
            cache.clear()
            walk.blocks.clear()
        else:
            touch = op == "lookup"
            assert cache.lookup(hashes, touch=touch) == walk.lookup(hashes, touch)
        assert list(cache._blocks.items()) == list(walk.blocks.items())
        assert cache._tainted == sum(t is not None for t in walk.blocks.values())
