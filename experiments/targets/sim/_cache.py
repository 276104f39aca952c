"""Prefix caches keyed by salted hash chains, with LRU eviction.

vLLM hashes a prompt block by block: block i's hash covers its parent's hash
and its own token ids, and ``cache_salt`` is mixed into the *first* block's
hash only; since every later hash chains from it, the salt namespaces the whole
prefix. LMCache keys its 256-token chunks the same way (salt carried in the
cache identity). Only full blocks/chunks are hashed, so only they are cached.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence
from functools import lru_cache

from ._answers import Taint
from ._tokenizer import encode_cached

__all__ = ["BlockCache", "chain_hashes", "prompt_hashes"]


def chain_hashes(token_ids: Sequence[int], unit: int, salt: str | None, root: bytes = b"") -> list[bytes]:
    """Hashes of each full ``unit``-token block, chained, salt in the first."""
    ids = array("I", token_ids)
    step = unit * ids.itemsize
    raw = ids.tobytes()
    parent = hashlib.sha256(root).digest()
    hashes: list[bytes] = []
    for i in range(len(token_ids) // unit):
        h = hashlib.sha256(parent)
        h.update(raw[i * step : (i + 1) * step])
        if i == 0 and salt is not None:
            h.update(b"\x00salt\x00" + salt.encode("utf-8"))
        parent = h.digest()
        hashes.append(parent)
    return hashes


def prompt_hashes(
    token_ids: Sequence[int], unit: int, salt: str | None, root: bytes = b"", *, text: str | None = None
) -> Sequence[bytes]:
    """:func:`chain_hashes` of a prompt; memoised by its text when ``token_ids`` is ``encode(text)``."""
    if text is None:
        return chain_hashes(token_ids, unit, salt, root)
    return _text_hashes(text, unit, salt, root)


@lru_cache(maxsize=64)
def _text_hashes(text: str, unit: int, salt: str | None, root: bytes) -> tuple[bytes, ...]:
    return tuple(chain_hashes(encode_cached(text), unit, salt, root))


class BlockCache:
    """Cached blocks (hash -> taint) with a capacity and LRU eviction.

    A prompt's cached blocks always form a prefix of its chain: block j's hash covers every
    block before it, each insert or touch covers a whole prefix of a chain and refreshes its
    blocks tail first (so block i < j ends newer than j), and eviction takes the oldest. So
    the cached prefix is found by bisection, and the per-block work of a 128k prompt (8,000
    blocks) is done by C loops, not Python ones: it is most of a reuse's work, and a
    replica's work beyond the modelled time delays its first token.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._blocks: OrderedDict[bytes, Taint | None] = OrderedDict()
        self._tainted = 0  # blocks whose state is tainted; none: every lookup finds None states

    def __len__(self) -> int:
        return len(self._blocks)

    def usage(self) -> float:
        return len(self._blocks) / self.capacity if self.capacity else 0.0

    def cached_prefix(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of the chain ``hashes`` are cached (see the class doc)."""
        blocks, lo, hi = self._blocks, 0, len(hashes)
        while lo < hi:
            mid = (lo + hi) // 2
            if hashes[mid] in blocks:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def lookup(self, hashes: Sequence[bytes], *, touch: bool = True) -> list[Taint | None]:
        """Taints of the longest cached prefix of ``hashes``; touches them unless told the caller
        inserts the same prefix next (which touches every block anyway)."""
        hit = self.cached_prefix(hashes)
        found: list[Taint | None] = (
            list(map(self._blocks.__getitem__, hashes[:hit])) if self._tainted else [None] * hit
        )
        if touch:
            self._touch(hashes[:hit])
        return found

    def insert(self, hashes: Sequence[bytes], taints: Sequence[Taint | None]) -> None:
        """Cache blocks not yet present (present ones keep their state), newest last as
        _touch orders them: the new tail appended from its end, then the cached prefix moved up."""
        if len(hashes) != len(taints):
            raise ValueError(f"{len(hashes)} hashes but {len(taints)} taints")
        hit = self.cached_prefix(hashes)
        new = taints[hit:]
        self._blocks.update(zip(reversed(hashes[hit:]), reversed(new), strict=True))
        self._tainted += len(new) - new.count(None)
        self._touch(hashes[:hit])
        while len(self._blocks) > self.capacity:
            _, taint = self._blocks.popitem(last=False)
            self._tainted -= taint is not None

    def _touch(self, hashes: Sequence[bytes]) -> None:
        # Most recent last, and a chain's tail older than its head (as vLLM's
        # free queue does), so eviction eats prefixes from the end, not the
        # first block whose loss would orphan the whole chain.
        deque(map(self._blocks.move_to_end, reversed(hashes)), maxlen=0)

    def clear(self) -> None:
        self._blocks.clear()
        self._tainted = 0
