"""Build a deterministic tiny Llama checkpoint + byte-level BPE tokenizer (no hub).

Run inside the vllm engine environment (torch, transformers, tokenizers, safetensors):

    python _build_tiny_model.py --out DIR --params '{"seed": 1, "hidden_size": 128, ...}'

Everything is derived from ``--params``: the weights from ``seed`` (random, meaningless
text but deterministic), the tokenizer from text generated from ``seed``. Files are
written with fixed content and no timestamps, so two builds are byte-identical.
This script is not imported by kvledger; engines.py runs it as a subprocess.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PAD, IM_START, IM_END = SPECIAL_TOKENS

# ChatML, as Qwen-style models use it. Content given as a list of parts is joined.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_ONSETS = ["", *"b c d f g h k l m n p r s t v w st tr pl ch sh th gr br cl".split()]  # noqa: SIM905
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io", "y"]
_CODAS = ["", "", "n", "s", "t", "r", "l", "m", "nd", "st", "ck", "ng", "x"]
_PUNCT = [".", ".", ".", ",", ",", ";", ":", "?", "!"]


def corpus(seed: int, n_words: int) -> list[str]:
    """Deterministic pseudo-text: a Zipf-ish lexicon of made-up words, numbers, punctuation."""
    rng = random.Random(seed)
    lexicon = sorted(
        {
            "".join(
                rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                for _ in range(rng.randint(1, 3))
            )
            for _ in range(6000)
        }
    )
    rng.shuffle(lexicon)
    weights = [1.0 / (i + 1) for i in range(len(lexicon))]
    lines: list[str] = []
    words_left = n_words
    while words_left > 0:
        n = rng.randint(4, 24)
        ws = rng.choices(lexicon, weights=weights, k=n)
        for i in range(n):
            r = rng.random()
            if r < 0.05:
                ws[i] = str(rng.randint(0, 99999))
            elif r < 0.12:
                ws[i] = ws[i].capitalize()
        sentence = " ".join(ws)
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice(_PUNCT))
        words_left -= n
    # Group sentences into paragraphs of a few lines.
    paras, i = [], 0
    while i < len(lines):
        k = rng.randint(1, 6)
        paras.append(" ".join(lines[i : i + k]))
        i += k
    return paras


def build_tokenizer(p: dict[str, Any], out: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=int(p["vocab_size"]),
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(int(p["seed"]), int(p["corpus_words"])), trainer=trainer)
    tok.save(str(out / "tokenizer.json"), pretty=True)

    write_tokenizer_files(tok, out, int(p["max_position_embeddings"]))
    return tok


def write_tokenizer_files(tok: Any, out: Path, model_max_length: int) -> None:
    """tokenizer_config.json (ChatML template, specials) and special_tokens_map.json beside tok's file.

    The needle model's tokenizer writes its files with this too.
    """
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    _dump(out / "tokenizer_config.json", config)
    _dump(
        out / "special_tokens_map.json",
        {"additional_special_tokens": [IM_START, IM_END], "eos_token": IM_END, "pad_token": PAD},
    )


def build_model(p: dict[str, Any], tok: Any, out: Path) -> int:
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[p["dtype"]]
    eos = tok.token_to_id(IM_END)
    pad = tok.token_to_id(PAD)
    heads = int(p["num_attention_heads"])
    config = LlamaConfig(
        vocab_size=int(p["vocab_size"]),
        hidden_size=int(p["hidden_size"]),
        intermediate_size=int(p["intermediate_size"]),
        num_hidden_layers=int(p["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(p["num_key_value_heads"]),
        head_dim=int(p["hidden_size"]) // heads,
        max_position_embeddings=int(p["max_position_embeddings"]),
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
        initializer_range=0.02,
    )
    torch.manual_seed(int(p["seed"]))
    model = LlamaForCausalLM(config).eval()
    # Draw every parameter afresh from one generator so that the weights depend only
    # on the seed and the shapes, not on transformers' init order.
    gen = torch.Generator().manual_seed(int(p["seed"]))
    state: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * config.initializer_range)
    model = model.to(dtype)
    for name, tensor in sorted(model.state_dict().items()):
        state[name] = tensor.detach().contiguous().clone()
    config.dtype = p["dtype"]
    # Fixed metadata only: safetensors writes tensors sorted, with no timestamps.
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.architectures = ["LlamaForCausalLM"]
    config.to_json_file(str(out / "config.json"), use_diff=False)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad, do_sample=False).to_json_file(
        str(out / "generation_config.json"), use_diff=True
    )
    return sum(t.numel() for t in state.values())


def _dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def smoke(out: Path) -> dict[str, Any]:
    """Load the result the way vLLM will, and run one forward pass."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tk = AutoTokenizer.from_pretrained(str(out))
    chat = tk.apply_chat_template(
        [{"role": "user", "content": "Hello there."}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nHello there.<|im_end|>\n<|im_start|>assistant\n", chat
    ids = tk("Hello there, plain text 12345.")["input_ids"]
    assert tk.decode(ids) == "Hello there, plain text 12345.", tk.decode(ids)
    assert tk.eos_token == IM_END
    cfg = AutoConfig.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape[-1] == cfg.vocab_size
    return {"tokenizer_vocab": len(tk), "example_tokens": len(ids), "chat_template_ok": True}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--params", required=True, help="JSON object of build parameters")
    args = ap.parse_args()
    p = json.loads(args.params)
    args.out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(p, args.out)
    n_params = build_model(p, tok, args.out)
    info = smoke(args.out)
    info["parameters"] = n_params
    print(json.dumps(info, sort_keys=True))


if __name__ == "__main__":
    main()
