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
from collections import OrderedDict
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
    """Cached blocks (hash -> taint) with a capacity and LRU eviction."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._blocks: OrderedDict[bytes, Taint | None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def usage(self) -> float:
        return len(self._blocks) / self.capacity if self.capacity else 0.0

    def lookup(self, hashes: Sequence[bytes], *, touch: bool = True) -> list[Taint | None]:
        """Taints of the longest cached prefix of ``hashes``; touches them unless told the caller
        inserts the same prefix next (which touches every block anyway)."""
        blocks = self._blocks
        found: list[Taint | None] = []
        hit = 0
        for h in hashes:
            if h not in blocks:
                break
            found.append(blocks[h])
            hit += 1
        if touch:
            self._touch(hashes[:hit])
        return found

    def insert(self, hashes: Sequence[bytes], taints: Sequence[Taint | None]) -> None:
        """Cache blocks not yet present (present ones keep their state)."""
        # One pass, newest last as _touch orders them: a present block moves to the end, a new
        # one is appended there (a 128k prompt is 8,000 blocks; this is most of a reuse's work).
        blocks = self._blocks
        for h, taint in zip(reversed(hashes), reversed(taints), strict=True):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = taint
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def _touch(self, hashes: Sequence[bytes]) -> None:
        # Most recent last, and a chain's tail older than its head (as vLLM's
        # free queue does), so eviction eats prefixes from the end, not the
        # first block whose loss would orphan the whole chain.
        for h in reversed(hashes):
            self._blocks.move_to_end(h)

    def clear(self) -> None:
        self._blocks.clear()
