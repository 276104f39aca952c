"""Training and evaluation samples for the needle model, as token ids.

Text comes from :mod:`experiments.fixture_text`, the fixtures' own generator,
under keys that start with ``needle-train/`` (training) or ``needle-eval/``
(held-out evaluation). Experiments name their streams ``SEED:workload:...``
(``RunContext.fixture_key``), so no experiment ever reads a training stream.

A sample is one chat: the user message is a stream's first lines, the
fixture's tail and a question; the assistant answers with the JSON of the
values asked for. Half the samples are fixture-shaped (the first mark, the
middle one and ``end_value``, marks every 40 lines); the other half put marks
every 3 to 39 lines and ask for 1 to 8 names in any order, look-alike names
(``value_010`` / ``value_001``) included. Some continue as sessions: the
fixtures' turn messages, each answered again. Loss is taken only on the
answers and their end tokens.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from experiments import fixture_text as ft

TRAIN_PREFIX = "needle-train/"
EVAL_PREFIX = "needle-eval/"
MAX_NAMES = 1000  # value_000 .. value_999: one token each


def train_key(batch_seed: str, row: int) -> str:
    return f"{TRAIN_PREFIX}{batch_seed}/{row}"


def eval_key(size: int, index: int) -> str:
    return f"{EVAL_PREFIX}{size}/{index}"


@dataclass
class Sample:
    ids: list[int]
    answer: list[bool]  # True where the token is part of an answer (its end token included)
    expected: dict[str, int]


class Encoder:
    """The checkpoint's tokenizer, and the chat rendering of its template, as ids."""

    def __init__(self, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(tokenizer_json)
        self.im_start = self.tok.token_to_id("<|im_start|>")
        self.im_end = self.tok.token_to_id("<|im_end|>")
        self.pad = self.tok.token_to_id("<|endoftext|>")
        self.user = [self.im_start, *self.enc("user\n")]
        self.assistant = [self.im_end, *self.enc("\n"), self.im_start, *self.enc("assistant\n")]
        self.next_user = [*self.enc("\n"), self.im_start, *self.enc("user\n")]

    def enc(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def enc_lines(self, lines: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self.tok.encode_batch(lines, add_special_tokens=False)]

    def chat(self, turns: list[tuple[str, str]]) -> Sample:
        """``[(user, answer), ...]`` → ids of the rendered chat, answers marked."""
        ids: list[int] = []
        mark: list[bool] = []
        for t, (user, answer) in enumerate(turns):
            head = (self.user if t == 0 else self.next_user) + self.enc(user) + self.assistant
            ans = [*self.enc(answer), self.im_end]
            ids += head + ans
            mark += [False] * len(head) + [True] * len(ans)
        return Sample(ids, mark, json.loads(turns[0][1]))

    def prompt(self, messages: list[str]) -> list[int]:
        """Ids of a one-message chat prompt with the generation prompt (no answer)."""
        return self.user + self.enc(messages[0]) + self.assistant


def _lines_within(enc: Encoder, key: str, budget: int, every: int, per_line: float = 19.0) -> list[str]:
    """The longest prefix of stream ``key`` whose tokens fit ``budget``."""
    lines: list[str] = []
    used = 0
    while True:
        more = max(4, int((budget - used) / per_line) + 4)
        batch = ft.stream_lines(key, len(lines) + more, len(lines), every)
        for text, ids in zip(batch, enc.enc_lines(batch), strict=True):
            if used + len(ids) > budget:
                return lines
            lines.append(text)
            used += len(ids)


def _lookalikes(name: str, present: set[str]) -> list[str]:
    digits = name[-3:]
    alike = {"value_" + "".join(p) for p in (digits[1:] + digits[0], digits[2] + digits[:2], digits[::-1])}
    return [n for n in alike if n in present and n != name]


def train_sample(enc: Encoder, key: str, length: int, rng: random.Random, quiz: int = 0) -> Sample:
    """A training chat of at most ``length`` tokens from stream ``key``; ``quiz`` more turns
    each ask for other names of the same text (more answers to learn from per long text)."""
    fixture_like = rng.random() < 0.5
    every = ft.MARK_EVERY if fixture_like else rng.randint(3, 39)
    every = max(every, length // (17 * MAX_NAMES) + 1)  # names stay below value_1000
    pad = rng.choice([0, 0, rng.randint(1, 40)])
    asks = 3 if fixture_like else rng.randint(1, 8)
    session = rng.random() < 0.15
    turns_words = [rng.randint(20, min(1500, max(20, length // 4))) for _ in range(rng.randint(1, 3))]
    reserve = 40 + pad + 16 * (asks + 2) + quiz * (70 + 16 * 9)  # tail, questions and answers
    if session and reserve + sum(w + 40 + 16 * asks for w in turns_words) < length * 0.6:
        reserve += sum(w + 40 + 16 * asks for w in turns_words)
    else:
        session = False
    lines = _lines_within(enc, key, max(8, length - reserve), every)
    k = len(lines)
    present = ft.marks(k, every)
    if not present:
        names = ["end_value"]
    elif fixture_like:
        names = ft.asked_names(k) if every == ft.MARK_EVERY else [present[0], present[len(present) // 2]]
        names = [n for n in dict.fromkeys(names) if n in present or n == "end_value"]
        if "end_value" not in names:
            names.append("end_value")
    else:
        names = rng.sample(present, min(asks, len(present)))
        if rng.random() < 0.3:  # look-alikes next to each other
            names += [n for n in _lookalikes(names[0], set(present)) if n not in names][:2]
        if rng.random() < 0.5:
            names.insert(rng.randint(0, len(names)), "end_value")
    rest, asked, end = ft.tail(key, length, pad, names)
    values = {n: (end if n == "end_value" else ft.value(key, n)) for n in names}
    answer = json.dumps(values)
    turns = [("".join(lines) + "\n" + rest, answer)]
    if session:
        turns += [(ft.turn_text(key, t + 1, w, asked), answer) for t, w in enumerate(turns_words)]
    for _ in range(quiz if present else 0):
        more = rng.sample(present, rng.randint(1, min(8, len(present))))
        if rng.random() < 0.3:
            more.insert(rng.randint(0, len(more)), "end_value")
        values = {n: (end if n == "end_value" else ft.value(key, n)) for n in more}
        words = rng.randint(0, 30)
        turns.append((ft.turn_text(key, len(turns), words, ft.question(more)), json.dumps(values)))
    return enc.chat(turns)


def make_batch(
    enc: Encoder, length: int, rows: int, seed: str, quiz_share: float = 0.0, quiz_turns: int = 0
) -> tuple[Any, Any]:
    """``rows`` samples padded to ``length``: ids and answer masks as numpy arrays.

    Padding is on the right and no attention mask is needed: causal attention
    never looks at it, and positions stay 0..n-1 (no packed sequences)."""
    import numpy as np

    rng = random.Random(seed)
    ids = np.full((rows, length), enc.pad, dtype=np.int64)
    mask = np.zeros((rows, length), dtype=bool)
    for r in range(rows):
        target = rng.randint(max(64, int(length * 0.6)), length) if length > 64 else length
        quiz = rng.randint(1, quiz_turns) if quiz_turns and rng.random() < quiz_share else 0
        s = train_sample(enc, train_key(seed, r), target, rng, quiz)
        n = min(len(s.ids), length)
        ids[r, :n] = s.ids[:n]
        mask[r, :n] = s.answer[:n]
    return ids, mask


def eval_lines(enc: Encoder, size: int, index: int, every: int = ft.MARK_EVERY) -> tuple[str, list[str]]:
    """The stream key of held-out fixture ``index`` of about ``size`` tokens, and its lines (a value
    line every ``every`` lines)."""
    key = eval_key(size, index)
    overhead = len(enc.prompt([ft.content(key, size, 200, 0, "")[0]]))
    return key, _lines_within(enc, key, size - overhead, every)


def eval_fixture(enc: Encoder, size: int, index: int) -> tuple[list[int], list[int], dict[str, int]]:
    """A held-out fixture of about ``size`` prompt tokens, built like ``FixtureFactory``'s:
    prompt ids, answer ids (with the end token) and the expected values."""
    key, lines = eval_lines(enc, size, index)
    text = "".join(lines)
    user, _, expected = ft.content(key, size, len(lines), 0, text)
    pad = max(0, size - len(enc.prompt([user])))  # " note" is one token
    user, _, expected = ft.content(key, size, len(lines), pad, text)
    while pad > 0 and len(enc.prompt([user])) > size:
        pad -= 1
        user, _, expected = ft.content(key, size, len(lines), pad, text)
    return enc.prompt([user]), [*enc.enc(json.dumps(expected)), enc.im_end], expected
