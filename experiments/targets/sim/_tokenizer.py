"""A deterministic, lossless stand-in for a BPE tokenizer.

Text is split by one regular expression into pieces, GPT-2 style:

- the ChatML special tokens (``<|im_start|>``, ``<|im_end|>``, ``<think>``,
  ``</think>``, ``<|endoftext|>``) are one token each;
- a run of ASCII letters, with at most one leading space, is one token;
- digits come in groups of at most three, with at most one leading space
  (``" 938639"`` is ``" 938"`` + ``"639"``);
- any other non-space character, with at most one leading space, is a token;
- runs of white space are one token (a run followed by a word leaves its last
  space to that word).

Joining the pieces gives the text back exactly, so the completion text, its
token count and the streamed chunks always agree. A piece's id is the first
four bytes of its BLAKE2b digest modulo ``VOCAB_SIZE`` (special tokens get
fixed ids above it): stable across processes and Python versions, unlike
``hash()``.
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

__all__ = [
    "SPECIAL_TOKENS",
    "VOCAB_SIZE",
    "count_tokens",
    "encode",
    "encode_cached",
    "piece_starts",
    "render_chat",
    "segments",
    "split",
]

VOCAB_SIZE = 151_643
SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": VOCAB_SIZE,
    "<|im_start|>": VOCAB_SIZE + 1,
    "<|im_end|>": VOCAB_SIZE + 2,
    "<think>": VOCAB_SIZE + 3,
    "</think>": VOCAB_SIZE + 4,
}

_SPECIAL = "|".join(re.escape(s) for s in SPECIAL_TOKENS)
_PIECE = re.compile(rf"{_SPECIAL}| ?[A-Za-z]+| ?[0-9]{{1,3}}| ?[^A-Za-z0-9\s]|\s+(?!\S)|\s+")


def split(text: str) -> list[str]:
    """The token pieces of ``text``; ``"".join(split(t)) == t``."""
    return _PIECE.findall(text)


def piece_starts(text: str) -> list[int]:
    """Character offset at which each token begins (for locating needles)."""
    return [m.start() for m in _PIECE.finditer(text)]


@lru_cache(maxsize=1 << 16)
def _piece_id(piece: str) -> int:
    # Cached because fixture text repeats the same words many times over.
    special = SPECIAL_TOKENS.get(piece)
    if special is not None:
        return special
    digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big") % VOCAB_SIZE


def encode(text: str) -> list[int]:
    """Token ids of ``text``."""
    return [_piece_id(p) for p in split(text)]


_SEGMENT_CHARS = 4096


def segments(text: str, size: int = _SEGMENT_CHARS) -> list[str]:
    """``text`` cut into pieces of about ``size`` characters that tokenize independently.

    A cut falls just after a newline whose neighbours are both non-space: that
    newline is a token of its own, no token pattern reaches across it, and the
    next piece begins a new token, so ``encode(text)`` equals the concatenated
    ``encode`` of the pieces.
    """
    out: list[str] = []
    start, n = 0, len(text)
    while n - start > size:
        cut = text.find("\n", start + size)
        while cut != -1 and (cut + 1 >= n or text[cut - 1].isspace() or text[cut + 1].isspace()):
            cut = text.find("\n", cut + 1)
        if cut == -1:
            break
        out.append(text[start : cut + 1])
        start = cut + 1
    out.append(text[start:])
    return out


@lru_cache(maxsize=8192)
def _encode_segment(piece: str) -> array[int]:
    return array("I", encode(piece))


@lru_cache(maxsize=64)
def encode_cached(text: str) -> Sequence[int]:
    """:func:`encode`, memoised (as a compact ``array('I')``), by whole text and by :func:`segments`.

    The screening sends the same long prompts several times (cold, local and
    cross-replica steps; the same payloads in every block), and each session
    turn extends the previous one; tokenizing a 128k-token prompt from scratch
    each time would cost the server more than the latency model grants it.
    """
    ids: array[int] = array("I")
    for piece in segments(text):
        ids.extend(_encode_segment(piece))
    return ids


def count_tokens(text: str) -> int:
    """Number of tokens in ``text`` without building the id list."""
    return sum(1 for _ in _PIECE.finditer(text))


def _content_text(content: Any) -> str:
    # OpenAI content may be a string or a list of typed parts; only text counts.
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return str(content)


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool = False,
) -> str:
    """Render messages through a ChatML template shaped like Qwen3's.

    Each message becomes ``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n``. The
    generation prompt is ``<|im_start|>assistant\\n``, followed, when thinking
    is disabled (``chat_template_kwargs.enable_thinking = false``), by an empty
    ``<think>\\n\\n</think>\\n\\n`` block as Qwen3's template does. The sim's
    default is thinking disabled, the seed's setting.
    """
    parts = [
        f"<|im_start|>{m.get('role', 'user')}\n{_content_text(m.get('content'))}<|im_end|>\n"
        for m in messages
    ]
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
        if not enable_thinking:
            parts.append("<think>\n\n</think>\n\n")
    return "".join(parts)
