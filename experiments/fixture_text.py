"""The fixtures' text, standard library only: streams, planted values, tail and turns.

:mod:`experiments.fixtures` sizes and records fixtures; this module only
writes their text, so the needle model's training script (which runs where
kvledger itself is not installed) draws from the same generator. Training
passes a denser ``every`` than :data:`MARK_EVERY` and keys no experiment uses.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

__all__ = [
    "ASKED_LINES",
    "CARD_PARTS",
    "DENSE_EVERY",
    "FIRST_MARK",
    "MARK_EVERY",
    "PAD_WORD",
    "QUESTION",
    "WORDS",
    "asked_names",
    "content",
    "digest",
    "filler_line",
    "line",
    "mark_name",
    "marks",
    "marks_every",
    "served_key",
    "stream_lines",
    "tail",
    "turn_text",
    "value",
]

MARK_EVERY: Final = 40
DENSE_EVERY: Final = 10
"""Lines between value lines in a ``dense`` fixture: about 190 tokens with needle-exact's tokenizer,
closer than LMCache's 256-token chunk, so every chunk of the prompt holds some of a value line."""
FIRST_MARK: Final = 2
WORDS: Final = (
    "cache",
    "block",
    "state",
    "replica",
    "token",
    "prefix",
    "shared",
    "local",
    "request",
    "answer",
    "model",
    "layer",
    "page",
    "chunk",
    "copy",
    "stream",
    "buffer",
    "host",
    "device",
    "kernel",
    "queue",
    "record",
    "report",
    "config",
    "launch",
    "service",
    "service",
    "tier",
    "memory",
    "pinned",
    "order",
    "event",
    "ledger",
    "window",
    "session",
    "turn",
    "value",
    "checked",
    "stored",
    "loaded",
    "warm",
    "cold",
    "fresh",
    "stale",
    "restart",
    "pair",
    "arm",
    "the",
    "a",
    "of",
    "to",
    "and",
    "from",
    "with",
    "after",
    "before",
    "when",
    "then",
    "was",
)
PAD_WORD: Final = " note"
ASKED_LINES: Final = ("spot", "every", "dense")
"""What a fixture's question asks: ``spot``, the first value line, the one nearest the middle and
``end_value`` (a short answer: a wrong chunk of KV shows only where it holds one of them);
``every``, every value line and ``end_value`` (an answer about 1.5 % of the prompt's tokens, which
a wrong chunk holding any value line changes: about a third of the chunks); ``dense``, the same
over a stream with a value line every :data:`DENSE_EVERY` lines (an answer about 6 % of the
prompt's tokens, which a wrong chunk anywhere in the prompt changes). Names stop at
``value_999`` in the needle checkpoints' vocabulary: a ``dense`` stream holds them to about
190,000 tokens."""
CARD_PARTS: Final = {"every": "every_line", "dense": "dense_lines"}
"""The part of a model card that decides where each longer question is served."""


def served_key(asked: str) -> str:
    """The key of a card summary's largest prompt served for questions that ask ``asked`` (one of
    :data:`CARD_PARTS`; the seed's question has the card's own ``served_max_tokens``)."""
    return f"{CARD_PARTS[asked]}_served_max_tokens"


QUESTION: Final = "Return the values of {names} as JSON. Reply with the JSON object only."


def digest(key: str, *more: object) -> bytes:
    text = "|".join([key, *(str(m) for m in more)])
    return hashlib.blake2b(text.encode(), digest_size=32).digest()


def value(key: str, name: str) -> int:
    """A six-digit value without a leading zero, the seed's style (938639)."""
    return 100_000 + int.from_bytes(digest(key, "value", name)[:8], "big") % 900_000


def mark_name(index: int) -> str:
    return f"value_{index:03d}"


def filler_line(key: str, i: int) -> str:
    d = digest(key, "line", i)
    words = " ".join(WORDS[b % len(WORDS)] for b in d[: 8 + d[31] % 6])
    return f"L{i:05d} | {words}\n"


def line(key: str, i: int, every: int = MARK_EVERY) -> str:
    """Line ``i`` of stream ``key``: a value line every ``every`` lines, else filler."""
    if i % every == FIRST_MARK:
        name = mark_name(i // every)
        return f"{name} = {value(key, name)}\n"
    return filler_line(key, i)


def stream_lines(key: str, count: int, start: int = 0, every: int = MARK_EVERY) -> list[str]:
    """Lines ``start`` to ``count`` of the stream named ``key`` (deterministic)."""
    return [line(key, i, every) for i in range(start, count)]


def question(names: Sequence[str]) -> str:
    joined = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
    return QUESTION.format(names=joined)


def tail(key: str, nominal: int, pad_words: int, names: Sequence[str]) -> tuple[str, str, int]:
    """The text after the stream's lines: ``end_value``, padding and the question."""
    end = value(key, f"end_value@{nominal}")
    pad = (PAD_WORD * pad_words).lstrip()
    asked = question(names)
    return f"end_value = {end}\n" + (f"{pad}\n" if pad else "") + "\n" + asked, asked, end


def asked_names(k: int, asked: str = "spot") -> list[str]:
    """The names a fixture of ``k`` lines asks for (:data:`ASKED_LINES`). ``spot``: the first
    mark, the one nearest the middle (when there are two), and ``end_value``; ``every`` and
    ``dense``: every mark of its stream (:func:`marks`) and ``end_value``."""
    if asked in CARD_PARTS:
        return [*marks(k, marks_every(asked)), "end_value"]
    if asked != "spot":
        raise ValueError(f"asked lines must be one of {', '.join(ASKED_LINES)}, got {asked!r}")
    mid = max(1, round(k / 2 / MARK_EVERY)) if k > MARK_EVERY + FIRST_MARK else 0
    mid = min(mid, max(0, (k - 1 - FIRST_MARK) // MARK_EVERY))
    return [mark_name(0), mark_name(mid), "end_value"] if mid else [mark_name(0), "end_value"]


def marks_every(asked: str) -> int:
    """Lines between value lines in the stream of a fixture that asks ``asked``."""
    return DENSE_EVERY if asked == "dense" else MARK_EVERY


def marks(k: int, every: int = MARK_EVERY) -> list[str]:
    """The names of the value lines among a stream's first ``k`` lines (:func:`line`'s rule)."""
    return [mark_name(i // every) for i in range(k) if i % every == FIRST_MARK]


def content(
    key: str, nominal: int, k: int, pad: int, text: str, names: Sequence[str] | None = None
) -> tuple[str, str, dict[str, int]]:
    """A fixture's user message from the stream's first ``k`` lines (``text``): the message,
    its question and the expected values in the order asked. ``names``: what it asks, ending in
    ``end_value`` (default :func:`asked_names`, what the experiments ask)."""
    names = asked_names(k) if names is None else list(names)
    rest, asked, end = tail(key, nominal, pad, names)
    expected = {n: value(key, n) for n in names[:-1]}
    expected["end_value"] = end
    return text + "\n" + rest, asked, expected


def turn_text(key: str, t: int, words: int, asked: str) -> str:
    """Session turn ``t``'s user message: ``words`` filler words, then the question again."""
    d = digest(key, "turn", t)
    filler = " ".join(WORDS[(d[i % 32] + i) % len(WORDS)] for i in range(max(0, words)))
    return f"Turn {t} notes: {filler}\n\n{asked}"
