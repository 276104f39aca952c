"""Teacher-forced margins, in process, on the very prompts a ``needle_eval`` run sent.

When an engine's answer is wrong, this says whether the weights themselves get that prompt
wrong (a model miss) or only the engine does (its numerics, its cache): the fixture is rebuilt
from its key (``SEED:needle_eval:SIZE:INDEX``, as ``experiments/needle_eval.py`` names them),
sized with the checkpoint's own chat template as vLLM sizes it, and the expected answer is
scored token by token as ``train.py``'s evaluation does (margin: the expected token's logit
minus the best other's; negative where greedy decoding goes wrong).

    python -m experiments.needle.recheck --size 32768 --index 6 7 0 --out records/x.json

Needs torch, transformers and orjson beside the repository (the vllm engine environment with
orjson on the path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from . import CHECKPOINT, data
from .train import answer_margin

SEED = 271828  # experiments/needle_eval.py's


def recheck(
    size: int, indices: list[int], seed: int = SEED, checkpoint: Path = CHECKPOINT
) -> list[dict[str, Any]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from experiments.fixtures import FixtureFactory

    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    enc = data.Encoder(str(checkpoint / "tokenizer.json"))

    def ids_of(messages: Any) -> list[int]:
        return list(
            tok.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=True, enable_thinking=False, return_dict=True
            )["input_ids"]
        )

    async def count(messages: Any) -> int:
        return len(ids_of(messages))

    factory = FixtureFactory(count)
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.bfloat16).eval()
    out = []
    for i in indices:
        fx = asyncio.run(factory.fixture(f"{seed}:needle_eval:{size}:{i}", size))
        prompt = ids_of(fx.messages)
        answer = [*enc.enc(json.dumps(fx.expected)), enc.im_end]
        margin = answer_margin(model, prompt, answer)
        row = {
            "key": fx.key,
            "fixture_id": fx.fixture_id,
            "payload_sha256": fx.payload_sha256,  # as the run's fixture.created records it
            "prompt_tokens": len(prompt),
            "expected": fx.expected,
            "min_margin": round(margin, 3),
            "exact": margin > 0,
        }
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--index", type=int, nargs="+", required=True)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = recheck(args.size, args.index, args.seed)
    if args.out:
        import torch

        record = {
            "weights_sha256": json.loads((CHECKPOINT.parent / "MANIFEST.sha256.json").read_text())["files"][
                "model.safetensors"
            ],
            "device": "cpu",
            "dtype": "bfloat16",
            "torch": torch.__version__,
            "how": f"python -m experiments.needle.recheck --size {args.size} --index "
            + " ".join(map(str, args.index)),
            "fixtures": rows,
        }
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
