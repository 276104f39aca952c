"""How much of a prompt's KV a needle answer reads: each chunk of a fixture's prompt is made wrong
in turn, and the checkpoint's greedy answer is checked exact or not.

An exact-value check can only see a cache's wrong state where the answer reads it. A fixture asks
for three values (the first mark, the middle one and ``end_value``); a prompt of 8,192 tokens holds
about thirty of LMCache's 256-token chunks. So this measures, chunk by chunk, whether wrong KV there
changes the answer, for these questions:

- ``fixture``: the question the experiments ask (``experiments.fixture_text.asked_names``);
- ``every_mark``: every value line of the same prompt asked for, then ``end_value``;
- ``dense_marks``: the lines of the experiments' ``asked_lines=dense``, a value line every
  ``DENSE_EVERY`` lines (about 190 tokens apart, so that every chunk holds some of one), every one
  asked for (``--questions dense_marks``; the first two are the default).

The prompt's whole chunks before its question are prefilled once, as a cache hit loads them; then
one chunk's keys and values in every layer (keys after RoPE, as the KV cache holds them) are made
wrong, and the rest of the prompt and the answer are computed over that KV, as a replica does after
loading the hit. Two faults:

- ``zeroed``: the chunk's keys and values are zeros, as a copy that never landed leaves them;
- ``misplaced``: the chunk holds another chunk's keys and values (three chunks on, or back near the
  end), as a lookup that returns another prefix's KV would.

An answer is *wrong* where greedy decoding leaves the expected answer at any token: teacher forced,
the argmax differs from the expected token (the first of a tie, as greedy takes it). The prompt's
first chunk (the chat template's start, the sink the constructed heads rest on) is left alone.

Run in the vllm engine environment (torch, transformers, tokenizers); the committed records::

    python -m experiments.needle.coverage --model needle-exact --sizes 2048,4096,8192,16384,32768 \\
        --out experiments/needle/records/exact.coverage.json
    python -m experiments.needle.coverage --model needle --sizes 2048,4096,8192,16384 \\
        --out experiments/needle/records/hold-6.coverage.json
    python -m experiments.needle.coverage --model needle-exact --questions dense_marks \\
        --sizes 2048,4096,8192,16384 --out experiments/needle/records/exact-dense.coverage.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import fixture_text as ft
from . import committed, data

CHUNK_TOKENS = 256  # LMCache's chunk: the unit a lookup stores and loads
QUESTIONS = ("fixture", "every_mark", "dense_marks")
DEFAULT_QUESTIONS = ("fixture", "every_mark")
FAULTS = ("zeroed", "misplaced")
LINE_TOKENS = 9  # a value line's tokens before its newline
MISPLACED_BY = 3  # chunks between a misplaced chunk and the one whose KV it holds
Fault = tuple[str, int, int, int]  # kind, first and end position, the first position copied from


def every_mark_fixture(
    enc: data.Encoder, size: int, index: int, asked: str = "every"
) -> tuple[list[int], list[int], dict[str, int]]:
    """``data.eval_fixture``'s lines (``asked``: ``every``, or ``dense`` for a stream with a value
    line every ``DENSE_EVERY`` lines) with every value line asked for, then ``end_value``: prompt
    ids, answer ids (with the end token) and the expected values. The prompt is the fixture's up
    to its question, which is longer here."""
    key, lines = data.eval_lines(enc, size, index, ft.marks_every(asked))
    names = ft.asked_names(len(lines), asked)
    user, _, expected = ft.content(key, size, len(lines), 0, "".join(lines), names)
    return enc.prompt([user]), [*enc.enc(json.dumps(expected)), enc.im_end], expected


def line_chunks(enc: data.Encoder, prompt: list[int], names: list[str]) -> list[int]:
    """The chunks that the asked names' value lines span (``value_012 = 869628``: the name, `` =``,
    a space and six digits, each one token), the first occurrence of each name being its line."""
    chunks: set[int] = set()
    for name in names:
        (token,) = enc.enc(name)
        at = prompt.index(token)
        chunks.update(range(at // CHUNK_TOKENS, (at + LINE_TOKENS - 1) // CHUNK_TOKENS + 1))
    return sorted(chunks)


def _question_chunk(enc: data.Encoder, prompt: list[int], names: list[str]) -> int:
    """The chunk where the question (and the chat template's end after it) begins."""
    return (len(prompt) - len(enc.enc(ft.question(names))) - len(enc.assistant)) // CHUNK_TOKENS


def answers_over_faulted_cache(
    model: Any, prompt: list[int], answer: list[int], cached: int
) -> Callable[[Fault | None], bool]:
    """A callable (fault or None → whether greedy decoding gives ``answer``) over the prefill of
    ``prompt[:cached]``, computed once; each fault rewrites the cache's keys and values, the rest
    of the prompt and the answer are computed over them, and the cache is put back."""
    import torch

    ids = torch.tensor([prompt + answer[:-1]])
    expected = torch.tensor(answer)
    with torch.no_grad():
        cache = model(input_ids=ids[:, :cached], use_cache=True).past_key_values
    clean = [(layer.keys, layer.values) for layer in cache.layers]  # (batch, heads, positions, dim)

    def exact(fault: Fault | None) -> bool:
        for layer, (keys, values) in zip(cache.layers, clean, strict=True):
            layer.keys, layer.values = keys.clone(), values.clone()
            if fault:
                kind, lo, hi, source = fault
                for t in (layer.keys, layer.values):
                    t[:, :, lo:hi] = 0 if kind == "zeroed" else t[:, :, source : source + hi - lo].clone()
        with torch.no_grad():
            h = model.model(
                input_ids=ids[:, cached:], past_key_values=cache, use_cache=True
            ).last_hidden_state
            best = model.lm_head(h[0, len(prompt) - cached - 1 :]).float().argmax(dim=1)
        return bool((best == expected).all())

    return exact


def sweep(
    model: Any,
    enc: data.Encoder,
    size: int,
    index: int,
    asked: tuple[str, ...] = DEFAULT_QUESTIONS,
) -> dict[str, Any]:
    """One fixture: for each question in ``asked`` and each fault, the chunks whose wrong KV left
    the answer wrong."""
    build = {
        "fixture": lambda: data.eval_fixture(enc, size, index),
        "every_mark": lambda: every_mark_fixture(enc, size, index),
        "dense_marks": lambda: every_mark_fixture(enc, size, index, "dense"),
    }
    out: dict[str, Any] = {"size": size, "index": index}
    for name in asked:
        prompt, answer, expected = build[name]()
        cached_chunks = _question_chunk(enc, prompt, list(expected))
        exact = answers_over_faulted_cache(model, prompt, answer, cached_chunks * CHUNK_TOKENS)
        tried = list(range(1, cached_chunks))
        caught: dict[str, list[int]] = {}
        for kind in FAULTS:
            caught[kind] = []
            for c in tried:
                source = c + MISPLACED_BY if c + MISPLACED_BY < cached_chunks else c - MISPLACED_BY
                if not exact((kind, c * CHUNK_TOKENS, (c + 1) * CHUNK_TOKENS, source * CHUNK_TOKENS)):
                    caught[kind].append(c)
        out[name] = {
            "prompt_tokens": len(prompt),
            "cached_tokens": cached_chunks * CHUNK_TOKENS,
            "names_asked": len(expected),
            "clean_exact": exact(None),
            "chunks_tried": len(tried),
            "wrong_answers": {kind: len(v) for kind, v in caught.items()},
            "chunks_caught": caught,
            "chunks_with_asked_lines": [c for c in line_chunks(enc, prompt, list(expected)) if c in tried],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="needle-exact", help="a committed checkpoint's name or directory")
    ap.add_argument("--sizes", default="8192", help="prompt sizes, comma-separated")
    ap.add_argument("--fixtures", type=int, default=1, help="held-out fixtures a size")
    ap.add_argument(
        "--questions",
        default=",".join(DEFAULT_QUESTIONS),
        help=f"questions to sweep, comma-separated, of {', '.join(QUESTIONS)}",
    )
    ap.add_argument("--out", type=Path, help="write the record here (JSON)")
    args = ap.parse_args()
    asked = tuple(q.strip() for q in args.questions.split(",") if q.strip())
    unknown = [q for q in asked if q not in QUESTIONS]
    if unknown or not asked:
        ap.error(f"--questions: {', '.join(unknown) or 'none given'}; choose from {', '.join(QUESTIONS)}")
    import torch
    from transformers import LlamaForCausalLM

    found = committed(args.model)
    checkpoint = found.checkpoint if found else Path(args.model)
    model = LlamaForCausalLM.from_pretrained(str(checkpoint), dtype=torch.bfloat16).eval()
    enc = data.Encoder(str(checkpoint / "tokenizer.json"))
    started = time.time()
    fixtures = [
        sweep(model, enc, int(s), i, asked) for s in args.sizes.split(",") for i in range(args.fixtures)
    ]
    totals = {
        q: {
            kind: {
                "chunks_tried": sum(f[q]["chunks_tried"] for f in fixtures),
                "wrong_answers": sum(f[q]["wrong_answers"][kind] for f in fixtures),
            }
            for kind in FAULTS
        }
        for q in asked
    }
    record: dict[str, Any] = {
        "checkpoint": found.name if found else checkpoint.name,
        "how": "teacher forced, bf16, transformers on CPU; the whole chunks before the question prefilled "
        "as a cache hit loads them, one chunk of 256 tokens of that KV faulted at a time",
        "seconds": round(time.time() - started, 1),
        "totals": totals,
        "fixtures": fixtures,
    }
    if "dense_marks" in asked:  # the spacing its lines had
        record["dense_every"] = ft.DENSE_EVERY
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    if args.out:
        args.out.write_text(text)
    print(json.dumps(totals, sort_keys=True))


if __name__ == "__main__":
    main()
