"""The needle model's tokenizer: byte-level BPE trained on fixture text, with whole names.

Run in an environment with ``tokenizers`` (the vllm engine environment has it)::

    python -m experiments.needle.tokenizer --out experiments/needle/checkpoint

Pre-tokenization decides what the model can read exactly:

- every ``value_NNN`` (and ``end_value``) is one piece, so BPE learns it as one
  token and the name in the question is the same token as the name on its line
  (a look-alike such as ``value_010`` / ``value_001`` is a different token, not
  two shared digits);
- every other digit is a piece of its own, so a six-digit value is six tokens
  and copying it is six single-digit copies;
- words keep a leading space, as in GPT-2's split.

The BPE merges are trained on fixture text from training keys (see
``experiments.needle.data``) plus every name ``value_000``..``value_999``, so the
result is fixed by this file and the tokenizers version. ChatML specials and
the chat template make vLLM's ``/tokenize`` and chat requests render the
fixtures the way the model was trained on them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any


def _tiny_model_script() -> ModuleType:
    """The tiny model's build script, which also writes ChatML tokenizer files.

    Loaded by path: the ``experiments.targets.vllm`` package imports kvledger's own
    dependencies, which the engine environment this runs in does not have.
    """
    path = Path(__file__).resolve().parents[1] / "targets" / "vllm" / "_build_tiny_model.py"
    spec = importlib.util.spec_from_file_location("_build_tiny_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_CHATML = _tiny_model_script()
SPECIAL_TOKENS: list[str] = _CHATML.SPECIAL_TOKENS
PAD, IM_START, IM_END = SPECIAL_TOKENS
CHAT_TEMPLATE: str = _CHATML.CHAT_TEMPLATE
# One piece per name, per digit, per word (with its leading space), per run of punctuation.
SPLIT_PATTERN = (
    r"value_\d{3}|end_value| ?(?!value_\d{3}|end_value)[A-Za-z_]+"
    r"|\d| ?[^\sA-Za-z\d_]+|\s+(?!\S)|\s+"
)
NAMES = 1000


def corpus() -> list[str]:
    """Fixture-shaped text from training keys, every name, the question and chat words."""
    from experiments import fixture_text as ft

    texts = []
    for s in range(40):
        key = f"needle-tokenizer/{s}"
        texts.append("".join(ft.stream_lines(key, 400, every=3 + s)))
        names = [ft.mark_name(i) for i in range(0, 400 // (3 + s))]
        rest, asked, _ = ft.tail(key, 1000, s, [*names[:3], "end_value"])
        texts.append(rest + "\n" + ft.turn_text(key, 1, 60, asked))
        texts.append(json.dumps({n: ft.value(key, n) for n in names[:4]}))
    texts.extend(f"{ft.mark_name(i)} {ft.mark_name(i)}\n" for i in range(NAMES))
    texts.append("user\nassistant\nsystem\n")
    return texts


def build(out: Path, max_len: int) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,  # a cap, not reached: merges stop when every piece is one token
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"), pretty=True)
    check(tok)
    _CHATML.write_tokenizer_files(tok, out, max_len)
    return tok


def check(tok: Any) -> None:
    """What the model relies on: whole names, single digits, lossless round trips."""
    from experiments import fixture_text as ft

    for i in range(NAMES):
        name = ft.mark_name(i)
        ids = tok.encode(name).ids
        assert len(ids) == 1, (name, tok.encode(name).tokens)
        assert tok.encode(" " + name).ids[-1] == ids[0], name
    assert tok.encode(" end_value").ids[-1] == tok.encode("end_value").ids[0]
    assert tok.encode("938639").tokens == list("938639")
    text = "".join(ft.stream_lines("needle-check", 90))
    sample = text + ft.tail("needle-check", 9, 3, ["value_001", "end_value"])[0]
    assert tok.decode(tok.encode(sample).ids) == sample
    answer = json.dumps({"value_000": 938639, "end_value": 100200})
    assert tok.decode(tok.encode(answer).ids) == answer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-len", type=int, default=262144)
    args = ap.parse_args()
    tok = build(args.out, args.max_len)
    print(json.dumps({"vocab": tok.get_vocab_size(), "out": str(args.out)}))


if __name__ == "__main__":
    main()
