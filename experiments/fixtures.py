"""Deterministic, file-like fixtures with planted values, sized by the target's tokenizer.

A fixture is the seed's synthetic input: file-like text with three values
near its beginning, middle and end, then a question asking for them back as
short JSON. The sim answers it by the convention of
``experiments.targets.sim._answers`` (values as ``NAME = VALUE`` lines, the
question as ``values of A, B and C``); a real model reads the same text.

Text comes from a *stream*: lines that depend only on a key (seed, workload,
chain or session). A fixture of nominal size N is the stream's first k lines
plus a short tail (the end value, padding, the question), k chosen with the
target's ``/tokenize`` so the whole chat prompt is N tokens (to within a few).
So, like real files, a larger fixture of one stream starts with the smaller
one's text: that is what lets a namespace shared across sizes leak (the
seed's excluded trial), and why namespaces include the size.

Every ``MARK_EVERY`` lines the stream has a value line (``value_007 = 412907``);
a fixture asks for the first (beginning), the one nearest its middle, and its
tail's ``end_value`` (``asked_lines="spot"``, the seed's question), or for every
value line and ``end_value`` (``asked_lines="every"``): a longer answer, which a
wrong chunk of KV holding any value line changes, not only one holding an asked
one. ``asked_lines="dense"`` asks every value line of a stream with one every
``DENSE_EVERY`` lines, closer than a cache chunk, so that a wrong chunk anywhere
changes the answer. Such a fixture knows its answer's length in the target's
tokens, and its requests allow for it (:attr:`Fixture.answer_limit`).

Session turns append canonical history: the expected JSON as the previous
assistant answer, then a user message that grows the prompt by ``growth``
tokens (1,055 in the seed) and asks again; a turn cannot grow by less than the
answer it repeats, so ``every`` and ``dense`` sessions grow by that much at least.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from ledger import canonical_json, sha256_hex

from . import fixture_text as text
from .fixture_text import MARK_EVERY, stream_lines

__all__ = [
    "MARK_EVERY",
    "Fixture",
    "FixtureFactory",
    "Messages",
    "Tokenize",
    "make_namespace",
    "stream_lines",
]

Messages = list[dict[str, str]]
Tokenize = Callable[[Messages], Awaitable[int]]
"""Prompt tokens of a chat request with these messages, from the target's ``/tokenize``."""

_MAX_SALT: Final = 128
_SALT_FORBIDDEN: Final = ("@", "/", "\\", "\x00")


def make_namespace(*parts: object) -> str:
    """A ``cache_salt``: parts joined by ``-``; at most 128 chars, none of ``@ / \\``."""
    salt = "-".join(str(p) for p in parts if p is not None and str(p) != "")
    if not salt or len(salt) > _MAX_SALT or any(c in salt for c in _SALT_FORBIDDEN):
        raise ValueError(f"invalid cache_salt {salt!r}: 1-128 chars, none of '@', '/', '\\\\', NUL")
    return salt


class _Stream:
    """A stream's lines (a value line every ``every``), generated once and extended on demand."""

    def __init__(self, key: str, every: int = MARK_EVERY) -> None:
        self.key = key
        self.every = every
        self.lines: list[str] = []

    def text(self, k: int) -> str:
        if len(self.lines) < k:
            self.lines.extend(stream_lines(self.key, k, len(self.lines), self.every))
        return "".join(self.lines[:k])


@dataclass(frozen=True)
class Fixture:
    """One sized fixture: its first user message, the values and the digests."""

    fixture_id: str
    key: str
    nominal_tokens: int
    prompt_tokens: int
    content: str
    question: str
    expected: dict[str, int]
    lines: int
    asked_lines: str = "spot"
    answer_tokens: int | None = None
    """The expected answer's tokens as the target counts them (measured for ``every`` and
    ``dense`` only)."""

    @property
    def answer_limit(self) -> int | None:
        """``max_tokens`` that leaves room for the whole answer (``every``, ``dense``), else None: the
        run's ``max_tokens`` then holds it. An eighth more than the answer, and 16 tokens, for a
        model that spaces its JSON differently from ``json.dumps``; no more, since the prompt and
        the limit must fit the engine's context (256,000 tokens and their answer fit 262,144)."""
        if self.answer_tokens is None:
            return None
        return self.answer_tokens + self.answer_tokens // 8 + 16

    @property
    def answer_chars(self) -> int | None:
        """Characters of a response to this fixture kept in the ledger (``every``, ``dense``: the whole
        answer with room to spare, so the audit reads it; else None, the collector's default)."""
        return None if self.answer_tokens is None else 2 * len(self.expected_json) + 256

    @property
    def messages(self) -> Messages:
        return [{"role": "user", "content": self.content}]

    @property
    def expected_json(self) -> str:
        return json.dumps(self.expected)

    @property
    def payload_sha256(self) -> str:
        return sha256_hex(canonical_json(self.messages))

    def event_data(self, namespace: str) -> dict[str, Any]:
        """``fixture.created`` data."""
        return {
            "fixture_id": self.fixture_id,
            "namespace": namespace,
            "nominal_tokens": self.nominal_tokens,
            "prompt_tokens": self.prompt_tokens,
            "payload_sha256": self.payload_sha256,
            "expected": self.expected,
            "text_sha256": sha256_hex(self.content.encode()),
            "lines": self.lines,
            "key": self.key,
            "asked_lines": self.asked_lines,
            **({} if self.answer_tokens is None else {"answer_tokens": self.answer_tokens}),
        }


@dataclass
class Turn:
    """One session turn's full message list and its token count."""

    index: int
    messages: Messages
    prompt_tokens: int


@dataclass
class SessionHistory:
    """Canonical history of a session: turn t repeats turns < t with expected answers."""

    fixture: Fixture
    turns: list[Turn] = field(default_factory=list)


class FixtureFactory:
    """Builds fixtures and session histories, sized with the target's tokenizer.

    Results are cached by (key, nominal size): a run builds each once and
    reuses it in every block, so ON and OFF blocks send identical inputs.
    """

    def __init__(self, tokenize: Tokenize, *, tolerance: int = 8, asked_lines: str = "spot") -> None:
        if asked_lines not in text.ASKED_LINES:
            raise ValueError(f"asked_lines must be one of {', '.join(text.ASKED_LINES)}, got {asked_lines!r}")
        self.tokenize = tokenize
        self.tolerance = tolerance
        self.asked_lines = asked_lines
        self._streams: dict[str, _Stream] = {}
        self._fixtures: dict[tuple[str, int], Fixture] = {}
        self._sessions: dict[tuple[str, int, int, int], SessionHistory] = {}
        self.tokenize_calls = 0
        # Learned from the target's counts, so later fixtures need fewer /tokenize calls.
        self._per_line = 16.0
        self._base: int | None = None
        self._turn_overhead = 40

    async def _count(self, messages: Messages) -> int:
        self.tokenize_calls += 1
        return await self.tokenize(messages)

    def _stream(self, key: str) -> _Stream:
        if key not in self._streams:
            self._streams[key] = _Stream(key, text.marks_every(self.asked_lines))
        return self._streams[key]

    def _content(self, key: str, nominal: int, k: int, pad: int) -> tuple[str, str, dict[str, int]]:
        names = text.asked_names(k, self.asked_lines)
        return text.content(key, nominal, k, pad, self._stream(key).text(k), names)

    async def fixture(self, key: str, nominal: int) -> Fixture:
        """The fixture of stream ``key`` at ``nominal`` prompt tokens."""
        cached = self._fixtures.get((key, nominal))
        if cached is None:
            cached = await self._build(key, nominal)
            self._fixtures[(key, nominal)] = cached
        return cached

    async def _measure(self, key: str, nominal: int, k: int, pad: int) -> int:
        content, _, _ = self._content(key, nominal, k, pad)
        return await self._count([{"role": "user", "content": content}])

    async def _build(self, key: str, nominal: int) -> Fixture:
        first = text.FIRST_MARK + 1
        if self._base is None:  # template, tail and first lines: about the same for every stream
            self._base = await self._measure(key, nominal, first, 0)
        base, per_line = self._base, self._per_line
        k = first + max(0, math.floor((nominal - base) / per_line))
        count = await self._measure(key, nominal, k, 0)
        for _ in range(8):
            if 0 <= nominal - count < max(per_line * 1.5, self.tolerance) or k == first:
                break
            per_line = max(1.0, (count - base) / (k - first))
            k = max(first, k + math.floor((nominal - count) / per_line))
            count = await self._measure(key, nominal, k, 0)
        if k > first:
            self._per_line = max(1.0, (count - base) / (k - first))
        k, count = await self._largest_fitting(key, nominal, k, count)
        pad, count = await self._pad(key, nominal, k, count)
        content, question, expected = self._content(key, nominal, k, pad)
        # A spot fixture keeps the id it always had; an every-line or dense one of the same
        # stream and size is another fixture (another question and expectation; dense: text).
        longer = self.asked_lines != "spot"
        fid = "fx-" + sha256_hex(f"{key}|{nominal}{f'|{self.asked_lines}' if longer else ''}".encode())[:16]
        answer = await self._answer_tokens(content, count, expected) if longer else None
        return Fixture(fid, key, nominal, count, content, question, expected, k, self.asked_lines, answer)

    async def _answer_tokens(self, content: str, prompt_tokens: int, expected: dict[str, int]) -> int:
        """The answer's tokens: the prompt with it as the assistant's turn, less the prompt's
        ``prompt_tokens`` (the turn's own template tokens included: a little more than the answer
        itself). One more count, of a prompt as long as the fixture's and its answer."""
        user = {"role": "user", "content": content}
        with_answer = await self._count([user, {"role": "assistant", "content": json.dumps(expected)}])
        return max(1, with_answer - prompt_tokens)

    async def _pad(self, key: str, nominal: int, k: int, count: int) -> tuple[int, int]:
        """Pad words close the last gap without overshooting ``nominal``: a word is about a
        token for most tokenizers, several for a small vocabulary (the tiny test model's)."""
        pad, rate = 0, 1.0
        for _ in range(6):
            gap = nominal - count
            if gap <= self.tolerance:
                break
            step = max(1, math.floor(gap / rate))
            trial = await self._measure(key, nominal, k, pad + step)
            rate = max(rate, (trial - count) / step)
            if trial <= nominal:
                pad, count = pad + step, trial
            elif step == 1:
                break
        return pad, count

    async def _largest_fitting(self, key: str, nominal: int, k: int, count: int) -> tuple[int, int]:
        """The largest line count whose text fits ``nominal``: the fixture must not depend
        on where the search started (earlier fixtures tune the first guess)."""
        while count > nominal and k > text.FIRST_MARK + 1:  # the estimate overshot: walk down first
            k -= 1
            count = await self._measure(key, nominal, k, 0)
        while True:
            above = await self._measure(key, nominal, k + 1, 0)
            if above > nominal:
                return k, count
            k, count = k + 1, above

    async def session(self, fixture: Fixture, turns: int, growth: int) -> SessionHistory:
        """Canonical history: ``turns`` turns, each ``growth`` tokens longer than the last."""
        skey = (fixture.key, fixture.nominal_tokens, turns, growth)
        cached = self._sessions.get(skey)
        if cached is not None:
            return cached
        history = SessionHistory(fixture, [Turn(0, fixture.messages, fixture.prompt_tokens)])
        for t in range(1, turns):
            history.turns.append(await self._next_turn(fixture, history.turns[-1], t, growth))
        self._sessions[skey] = history
        return history

    def _turn_messages(self, fixture: Fixture, prev: Turn, t: int, words: int) -> Messages:
        user = text.turn_text(fixture.key, t, words, fixture.question)
        return [
            *prev.messages,
            {"role": "assistant", "content": fixture.expected_json},
            {"role": "user", "content": user},
        ]

    async def _next_turn(self, fixture: Fixture, prev: Turn, t: int, growth: int) -> Turn:
        target = prev.prompt_tokens + growth
        words = growth - self._turn_overhead
        messages = self._turn_messages(fixture, prev, t, words)
        count = await self._count(messages)
        for _ in range(4):
            if count == target:
                break
            words += target - count
            messages = self._turn_messages(fixture, prev, t, words)
            count = await self._count(messages)
        self._turn_overhead = growth - words
        return Turn(t, messages, count)
