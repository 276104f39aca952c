"""Verification: recompute every digest and chain link, check seq and recorded heads.

Each link is checked against the *stored* chain of the row before it, so any
range of rows can be verified on its own; a mismatch names the first bad seq.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ._canonical import sha256_hex
from ._events import GENESIS, envelope_bytes, next_chain


@dataclass(frozen=True)
class Verification:
    """What ``verify`` found. ``first_bad_seq`` is None when ``ok``."""

    ok: bool
    count: int
    first_bad_seq: int | None
    problem: str | None
    head_seq: int | None
    head_chain: str | None


def _row_problem(row: tuple[Any, ...], expected_seq: int, previous_chain: str) -> str | None:
    seq, id_, ts, kind, run_id, block_id, data, digest, chain = row
    if seq != expected_seq:
        return f"seq {seq} found where {expected_seq} was expected (rows deleted or reordered)"
    data_bytes = data.encode() if isinstance(data, str) else bytes(data)
    if sha256_hex(envelope_bytes(id_, ts, kind, run_id, block_id, data_bytes)) != digest:
        return "digest does not match the recomputed canonical envelope (content edited)"
    if next_chain(previous_chain, digest) != chain:
        return "chain does not follow from the previous link (rows edited, inserted or reordered)"
    return None


def scan_rows(rows: Iterable[tuple[Any, ...]], start_seq: int, previous_chain: str
              ) -> tuple[int, str, int | None, str | None]:
    """Check rows from ``start_seq`` on; returns (last_seq, last_chain, bad_seq, problem)."""
    expected, chain = start_seq, previous_chain
    for row in rows:
        problem = _row_problem(row, expected, chain)
        if problem is not None:
            return expected - 1, chain, min(expected, int(row[0])), problem
        chain = row[8]
        expected += 1
    return expected - 1, chain, None, None


def check_heads(
    heads: Iterable[tuple[int, str]], chains_at: dict[int, str], last_seq: int
) -> tuple[int | None, str | None]:
    """Compare recorded heads to the events; a head past the end means a truncated tail."""
    for seq, chain in heads:
        if seq > last_seq:
            return last_seq + 1, f"a head was recorded at seq {seq} but the ledger ends at {last_seq} (tail truncated)"
        if chains_at.get(seq) != chain:
            return seq, f"recorded head at seq {seq} does not match the event's chain"
    return None, None


def verify_rows(
    rows: Iterable[tuple[Any, ...]],
    heads: list[tuple[int, str]],
    expected_head: str | None = None,
) -> Verification:
    """Verify a whole ledger given its rows in seq order and its recorded heads."""
    head_seqs = {seq for seq, _ in heads}
    chains_at: dict[int, str] = {}

    def remember(stream: Iterable[tuple[Any, ...]]) -> Iterable[tuple[Any, ...]]:
        for row in stream:
            if row[0] in head_seqs:
                chains_at[row[0]] = row[8]
            yield row

    last_seq, last_chain, bad, problem = scan_rows(remember(rows), 1, GENESIS)
    if bad is None:
        bad, problem = check_heads(heads, chains_at, last_seq)
    if bad is None and expected_head is not None and expected_head != last_chain:
        bad, problem = last_seq, f"the ledger's head {last_chain} is not the expected {expected_head}"
    return Verification(
        ok=bad is None,
        count=last_seq if bad is None else max(bad - 1, 0),
        first_bad_seq=bad,
        problem=problem,
        head_seq=last_seq or None,
        head_chain=last_chain if last_seq else None,
    )
