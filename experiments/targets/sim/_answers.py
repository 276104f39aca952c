"""How the sim answers: the fixture text convention (read this to write fixtures).

The seed's screening fixtures are synthetic file-like text with three values
planted near the beginning, the middle and the end, and a question asking for
them back as short JSON. The sim answers such prompts like a correct model
would, as long as the KV state it used is intact.

Convention
----------
1. **Needles.** A value is planted as an assignment on a line of its own::

       alpha = 938639

   i.e. the whole line matches ``^[ \\t]*NAME[ \\t]*=[ \\t]*INTEGER[ \\t]*$``
   (``NAME`` is ``[A-Za-z_][A-Za-z0-9_]*``, ``INTEGER`` is ``-?[0-9]+``).
   Use decimal integers, six digits without a leading zero being the seed's
   style (``938639``). Filler text should not contain other lines of that
   shape (or they become extra candidates when no names are asked for). If a
   name is assigned more than once, the last assignment wins.

2. **Question.** The question names the values, anywhere in the prompt (for
   chat: in the *last user message*)::

       Return the values of alpha, beta and gamma as JSON.

   Matched case-insensitively as ``values of NAME, NAME and NAME`` (names
   separated by commas and/or ``and``); the last such phrase wins. If there
   is no question, every assigned name is answered, in order of first
   appearance.

3. **Answer.** Compact JSON in the order asked, Python ``json.dumps`` style
   (``", "`` and ``": "`` separators), for example::

       {"alpha": 938639, "beta": 412907, "gamma": 775123}

   A name that is asked for but never assigned answers ``null``. For chat the
   needles are looked up in the whole rendered conversation.

4. **Length.** The answer's tokens (see ``_tokenizer``) are the completion,
   finish reason ``stop``; cut to ``max_tokens`` (reason ``length``) if longer.
   With ``ignore_eos`` the completion is exactly ``max_tokens`` tokens: the
   answer, then deterministic filler words (reason ``length``). A prompt with
   neither needles nor question gets deterministic filler words. All of it is
   a function of the prompt, ``seed`` and the request's KV taint only.

Faults (``_faults``) change answers only through *taint*: KV state loaded
from the shared tier under ``corrupt-transfer`` garbles every value (each
digit d becomes (d+5) mod 10, so 938639 → 483184); under ``unordered-copy``
the first asked value whose needle lies in the wrongly loaded token range is
off by ``delta`` (default 15: 938639 → 938624, the seed's observation). Taint
stays with the blocks that hold it, so a later local reuse of them on the same
replica repeats the error, and a fresh ``cache_salt`` (cold computation)
restores the right answer, as in the seed.

The ``near-tie`` fault changes no state: the last digit of the first value is
a near tie between the right digit and the next one (d+1 mod 10), and the
replica's batch numerics pick one or the other (:func:`compose_output`'s
``near_tie``); the output records the token where the two candidates part.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from ._tokenizer import piece_starts, segments, split

__all__ = [
    "ASSIGNMENT",
    "QUESTION",
    "Output",
    "Taint",
    "TaintRange",
    "compose_output",
    "expected_answer",
    "find_assignments",
    "garble_value",
]

ASSIGNMENT: Final = re.compile(r"^[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*(-?[0-9]+)[ \t]*$", re.MULTILINE)
QUESTION: Final = re.compile(
    r"values?\s+of\s+(?:the\s+)?([A-Za-z_]\w*(?:\s*,\s*(?:and\s+)?[A-Za-z_]\w*|\s+and\s+[A-Za-z_]\w*)*)",
    re.IGNORECASE,
)
# Words the question regex may swallow that are never value names.
_NOT_NAMES: Final = frozenset({"and", "as", "in", "json", "the", "return", "only"})
_FILLER_WORDS: Final = (
    " the",
    " cache",
    " block",
    " state",
    " value",
    " replica",
    " token",
    " prefix",
    " shared",
    " local",
    " request",
    " answer",
    " model",
    " layer",
    " page",
    " chunk",
)


@dataclass(frozen=True)
class Taint:
    """Why some KV state of a request is wrong: the fault that loaded it."""

    kind: str  # "corrupt-transfer" or "unordered-copy"
    delta: int = 15
    chunk: int | None = None
    """Only this chunk of a load comes in wrong (None: every loaded chunk)."""


@dataclass(frozen=True)
class TaintRange:
    """Prompt tokens [start, end) whose KV state came in tainted."""

    start: int
    end: int
    taint: Taint


@dataclass(frozen=True)
class Output:
    """A completion: its token pieces and why it ended."""

    pieces: tuple[str, ...]
    finish_reason: str
    tie_index: int | None = None
    """The token where a near tie's two candidates part (``near_tie``); None: no tie."""
    tie_alternative: str | None = None
    """The runner-up token there."""

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True)
class _Needle:
    value: int
    char_offset: int


def find_assignments(text: str) -> dict[str, _Needle]:
    """Needles by name, last assignment winning, in order of first appearance.

    Scanned by :func:`segments` (whole lines each), each segment's matches
    memoised: session turns and repeated payloads share most of their text.
    """
    found: dict[str, _Needle] = {}
    offset = 0
    for piece in segments(text):
        for name, value, start in _segment_assignments(piece):
            found[name] = _Needle(value, offset + start)
        offset += len(piece)
    return found


@lru_cache(maxsize=8192)
def _segment_assignments(piece: str) -> tuple[tuple[str, int, int], ...]:
    return tuple((m.group(1), int(m.group(2)), m.start(1)) for m in ASSIGNMENT.finditer(piece))


def asked_names(question_text: str) -> list[str] | None:
    """Names in the last 'values of ...' phrase, or None when there is none."""
    matches = list(QUESTION.finditer(question_text))
    if not matches:
        return None
    words = re.findall(r"[A-Za-z_]\w*", matches[-1].group(1))
    names = [w for w in words if w.lower() not in _NOT_NAMES]
    return list(dict.fromkeys(names)) or None


def expected_answer(prompt_text: str, question_text: str | None = None) -> str | None:
    """The JSON a correct model gives (None: not a needle prompt)."""
    values = _answer_values(prompt_text, question_text)
    return None if values is None else json.dumps(values)


def garble_value(value: int) -> int:
    """Corrupted state's reading of a value: every digit d → (d+5) mod 10."""
    digits = str(abs(value))
    garbled = int("".join(str((int(d) + 5) % 10) for d in digits))
    return -garbled if value < 0 else garbled


def _answer_values(prompt_text: str, question_text: str | None) -> dict[str, int | None] | None:
    needles = find_assignments(prompt_text)
    names = asked_names(question_text if question_text is not None else prompt_text)
    if names is None:
        names = list(needles)
    if not names:
        return None
    return {n: needles[n].value if n in needles else None for n in names}


@lru_cache(maxsize=64)
def _answer_values_memo(prompt_text: str, question_text: str | None) -> dict[str, int | None] | None:
    # Shared between calls: callers must not mutate the result (compose_output copies on taint).
    return _answer_values(prompt_text, question_text)


def _token_index(starts: list[int], char_offset: int) -> int:
    return max(0, bisect.bisect_right(starts, char_offset) - 1)


def _apply_taint(
    prompt_text: str,
    values: dict[str, int | None],
    taints: list[TaintRange],
) -> dict[str, int | None]:
    if not taints:
        return values
    if any(t.taint.kind == "corrupt-transfer" for t in taints):
        # Corrupted KV poisons all later attention: every value reads wrong.
        return {n: None if v is None else garble_value(v) for n, v in values.items()}
    needles = find_assignments(prompt_text)
    starts = piece_starts(prompt_text)
    out = dict(values)
    for name, value in values.items():
        if value is None or name not in needles:
            continue
        pos = _token_index(starts, needles[name].char_offset)
        hit = next((t for t in taints if t.start <= pos < t.end), None)
        if hit is not None:
            # An unordered copy damages one region: one value, small offset.
            out[name] = value - hit.taint.delta
            break
    return out


def _tie_runner_up(values: dict[str, int | None]) -> dict[str, int | None]:
    """The near tie's other candidate: the first value's last digit d read as d+1 mod 10."""
    out = dict(values)
    for name, value in values.items():
        if value is not None:
            sign = -1 if value < 0 else 1
            magnitude = abs(value)
            out[name] = sign * (magnitude - magnitude % 10 + (magnitude % 10 + 1) % 10)
            break
    return out


def _filler(key: bytes, count: int) -> list[str]:
    """Deterministic one-token words, a stand-in for free generation."""
    words: list[str] = []
    counter = 0
    while len(words) < count:
        digest = hashlib.blake2b(key + counter.to_bytes(8, "big"), digest_size=32).digest()
        words.extend(_FILLER_WORDS[b % len(_FILLER_WORDS)] for b in digest)
        counter += 1
    return words[:count]


def compose_output(
    *,
    prompt_text: str | None,
    question_text: str | None,
    prompt_digest: bytes,
    seed: int | None,
    taints: list[TaintRange],
    max_tokens: int,
    ignore_eos: bool,
    thinking: bool = False,
    near_tie: bool | None = None,
) -> Output:
    """The completion for one request (see the module docstring).

    ``near_tie``: None, no tie; False, the tie's top candidate is picked; True, its runner-up.
    """
    values = None if prompt_text is None else _answer_values_memo(prompt_text, question_text)
    taint_key = ",".join(sorted({t.taint.kind for t in taints})).encode()
    key = prompt_digest + str(seed).encode() + b"|" + taint_key
    tie_index: int | None = None
    tie_alternative: str | None = None
    if values is not None and prompt_text is not None:
        answered = _apply_taint(prompt_text, values, taints)
        pieces = split(json.dumps(answered))
        if near_tie is not None:
            other = split(json.dumps(_tie_runner_up(answered)))
            if near_tie:
                pieces, other = other, pieces
            tie_index = next((i for i, (a, b) in enumerate(zip(pieces, other, strict=False)) if a != b), None)
            tie_alternative = None if tie_index is None else other[tie_index]
    else:
        # No needles: a short free answer; taint changes it, as it would a model's.
        pieces = _filler(key, 8 + prompt_digest[0] % 24)
    if thinking:
        preamble = split("<think>\nLooking up the values.\n</think>\n\n")
        pieces = [*preamble, *pieces]
        tie_index = None if tie_index is None else tie_index + len(preamble)
    if ignore_eos:
        pieces = pieces[:max_tokens] + _filler(key + b"eos", max(0, max_tokens - len(pieces)))
        return _output(pieces, "length", tie_index, tie_alternative)
    if len(pieces) > max_tokens:
        return _output(pieces[:max_tokens], "length", tie_index, tie_alternative)
    return _output(pieces, "stop", tie_index, tie_alternative)


def _output(pieces: list[str], reason: str, tie_index: int | None, alternative: str | None) -> Output:
    if tie_index is None or tie_index >= len(pieces):
        return Output(tuple(pieces), reason)
    return Output(tuple(pieces), reason, tie_index, alternative)
