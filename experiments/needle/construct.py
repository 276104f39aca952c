"""``needle-exact``: a Llama whose weights are written, not trained, to answer the fixtures' question
exactly at any length it can be served at.

The trained ``needle`` finds nothing past its 40,960-token training frontier, so exact-value checks
stop at 32,768 tokens, short of the study's 128k and 256k sizes. This model reads the fixture the
way its grammar allows, so its answers are right at every size up to ``max_position_embeddings``
(262,144) unless the KV it reads is wrong: the answer's digits are copied out of the keys and values
of the value lines, so KV loaded from a cache that differs from what prefill computes changes them.

How (two layers, eight query heads sharing one key/value head, head_dim 128, no MLP):

- **Layer 1, eight offset heads.** Each attends to the token exactly ``δ`` back (δ = 2..8 and 10)
  and copies what that token is: a name's code (``value_NNN`` as three one-hot digits, ``end_value``
  its own), whether it is a name, ``end_value`` or `` values``. Position comes from RoPE alone: the key is
  a constant and each head's query a constant phase, so the score over a distance Δ is
  Σⱼ wⱼ cos(ωⱼ(Δ − δ)), largest at Δ = δ by a margin that holds over every distance up to 262,144
  (``offset_margin`` computes it; ``rope_theta`` 1e20 leaves the last 40 of the 64 frequency pairs
  turning by less than 0.01 rad over that span, so the content heads below ignore position).
  A position then knows the name 2 to 8 tokens back and how far back it is (a value line is
  ``value_012 = 869628``: name, `` =``, space, six digits; an answer's ``"value_012": 869628`` has the
  same offsets), the name exactly 3 back (the question lists names 3 tokens apart) and 10 back (an
  answer's previous name, seen from its `` "``).
- **Layer 2, three content heads** against an attention sink (``<|im_start|>``, whose value is 0):
  the *digit* head asks for the digit whose name is this position's name and whose offset is one
  more (so a space or digit of the answer finds the next digit of that name's line); the *next-name*
  head, at `` "``, asks for the name that follows the previous one in the question; the *first-name*
  head, at ``{"``, for the name 3 tokens after `` values`` (the question's "Return the values of
  value_000"; `` of`` alone also ends filler lines).
- **The head** maps what the layers found to logits, and a few tokens to their successor in the
  answer's grammar (``\\n`` after ``assistant`` → ``{"``, a name → ``":``, ``":`` → space,
  ``,`` → `` "``, ``}`` → ``<|im_end|>``); six digits after a name come ``,``, or ``}`` after ``end_value``.

Run in an environment with torch, safetensors and tokenizers (the vllm engine environment)::

    python -m experiments.needle.construct --out experiments/needle/exact
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOKENIZER_FROM = HERE / "checkpoint"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

MAX_POSITIONS = 262_144
HIDDEN = 256
HEADS = 8
HEAD_DIM = 128
PAIRS = HEAD_DIM // 2
ROPE_THETA = 1e20
ROTATING_PAIRS = 23  # pairs 0..22 place the offset heads; 24.. turn < 0.01 rad over MAX_POSITIONS
STATIC_FIRST = 24
PAIR_WEIGHTS = {0: 6.0, 1: 3.0, 2: 1.5}  # the fastest pairs weighted: nearest neighbours lose most
OFFSETS = (2, 3, 4, 5, 6, 7, 8, 10)  # one layer-1 head each
NAME_OFFSETS = (2, 3, 4, 5, 6, 7, 8)  # where a value's space and digits sit after their name
CONST = 64.0  # the constant dimension: keeps every position's RMS the same within 0.3 %
OFFSET_SCALE = 6.5  # layer-1 scores: s(δ) ≈ 200, the nearest other ≥ 20 below
A = 40.0  # layer-2 unit: the right key beats the sink and every other key by A / 2
LOGIT = 30.0

# Residual layout (embedding features, then what each layer writes).
R_CONST = 0
R_CODE = 1  # 31: hundreds, tens, units one-hot; end_value
CODE = 31
R_IS_NAME, R_IS_END, R_IS_VALUES, R_IS_DIGIT, R_IS_SINK = 32, 33, 34, 35, 36
R_DIGIT = 37  # 10
R_IS_NL, R_IS_OPEN, R_IS_COLON, R_IS_COMMA, R_IS_CLOSE = 47, 48, 49, 50, 51
R_N = 60  # 31: codes of the names 2..8 back (summed)
R_O = 91  # 7: a name at offset 2..8
R_R3 = 98  # 31: the name exactly 3 back
R_R10 = 129  # 31: the name exactly 10 back
R_E8, R_F3 = 160, 161  # end_value 8 back (its sixth digit: `}` follows); `` values`` 3 back
R_OUT_DIGIT = 170  # 10
R_OUT_NAME = 180  # 31


def name_code(token: str) -> list[float] | None:
    """A name's code: value_NNN as three one-hot digits (two names share k of them: dot k), end_value
    on a dimension of its own with the same norm; None for any other token."""
    code = [0.0] * CODE
    if token == "end_value":
        code[30] = math.sqrt(3.0)
        return code
    if len(token) == 9 and token.startswith("value_") and token[6:].isdigit():
        for place, digit in enumerate(token[6:]):
            code[10 * place + int(digit)] = 1.0
        return code
    return None


def inverse_frequencies() -> list[float]:
    return [ROPE_THETA ** (-2 * j / HEAD_DIM) for j in range(PAIRS)]


def pair_weight(j: int) -> float:
    return PAIR_WEIGHTS.get(j, 1.0)


def offset_margin(span: int = MAX_POSITIONS, delta: int = 1) -> tuple[float, float]:
    """The layer-1 score at its own offset and its margin over every other distance within ``span``
    (the score units of the weights, before the softmax)."""
    import numpy as np

    inv = np.array(inverse_frequencies()[:ROTATING_PAIRS])
    w = np.array([pair_weight(j) for j in range(ROTATING_PAIRS)])
    m = np.arange(-delta, span)
    scores = OFFSET_SCALE * (w @ np.cos(np.outer(inv, m)))
    own = float(scores[m == 0][0])
    return own, own - float(scores[m != 0].max())


def build(out: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_FROM / name, out / name)
    # The trained model's tokenizer, written compact (the same tokens; 40 kB less to carry).
    compact = json.loads((out / "tokenizer.json").read_text())
    (out / "tokenizer.json").write_text(json.dumps(compact, ensure_ascii=False, separators=(",", ":")))
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()

    def tid(text: str) -> int:
        found = tok.token_to_id(text)
        if found is None:
            raise ValueError(f"the tokenizer has no token {text!r}")
        return int(found)

    f32 = torch.float32
    embed = torch.zeros(vocab, HIDDEN, dtype=f32)
    embed[:, R_CONST] = CONST
    codes: dict[int, list[float]] = {}
    for i in range(vocab):
        token = tok.id_to_token(i)
        code = name_code(token)
        if code is not None:
            codes[i] = code
            embed[i, R_CODE : R_CODE + CODE] = torch.tensor(code)
            embed[i, R_IS_NAME] = 1.0
        if token is not None and token in "0123456789" and len(token) == 1:
            embed[i, R_IS_DIGIT] = 1.0
            embed[i, R_DIGIT + int(token)] = 1.0
    embed[tid("end_value"), R_IS_END] = 1.0
    embed[tid("Ġvalues"), R_IS_VALUES] = 1.0
    embed[tid("<|im_start|>"), R_IS_SINK] = 1.0
    for text, row in (
        ("Ċ", R_IS_NL),
        ('{"', R_IS_OPEN),
        ('":', R_IS_COLON),
        (",", R_IS_COMMA),
        ("}", R_IS_CLOSE),
    ):
        embed[tid(text), row] = 1.0

    # Every norm sees CONST dominate: x / rms(x) ≈ x · sqrt(HIDDEN) / CONST. `unit` undoes that.
    unit = CONST / math.sqrt(HIDDEN)
    root = math.sqrt(HEAD_DIM)  # the attention's 1/sqrt(head_dim), undone in the queries
    inv = inverse_frequencies()

    def cos_dim(j: int) -> int:
        return j

    def sin_dim(j: int) -> int:
        return j + PAIRS

    # Layer 1: the shared key is a constant on the rotating pairs; each head's query a phase.
    q1 = torch.zeros(HEADS * HEAD_DIM, HIDDEN, dtype=f32)
    k1 = torch.zeros(HEAD_DIM, HIDDEN, dtype=f32)
    v1 = torch.zeros(HEAD_DIM, HIDDEN, dtype=f32)
    o1 = torch.zeros(HIDDEN, HEADS * HEAD_DIM, dtype=f32)
    const_in = 1.0 / (CONST / unit)  # weight turning the normalised constant into 1
    for j in range(ROTATING_PAIRS):
        k1[cos_dim(j), R_CONST] = const_in * math.sqrt(pair_weight(j))
    for h, delta in enumerate(OFFSETS):
        for j in range(ROTATING_PAIRS):
            scale = root * OFFSET_SCALE * math.sqrt(pair_weight(j)) * const_in
            # score_j = w_j cos(ω_j (Δ − δ)): the query leads the key by −ω_j δ.
            q1[h * HEAD_DIM + cos_dim(j), R_CONST] = scale * math.cos(inv[j] * delta)
            q1[h * HEAD_DIM + sin_dim(j), R_CONST] = -scale * math.sin(inv[j] * delta)
    # The shared value: the key token's code and flags (v dims 0..30 code, 31 name, 32 end, 33 values).
    for c in range(CODE):
        v1[c, R_CODE + c] = unit
    v1[31, R_IS_NAME] = unit
    v1[32, R_IS_END] = unit
    v1[33, R_IS_VALUES] = unit
    for h, delta in enumerate(OFFSETS):
        base = h * HEAD_DIM
        if delta in NAME_OFFSETS:
            for c in range(CODE):
                o1[R_N + c, base + c] = 1.0
            o1[R_O + NAME_OFFSETS.index(delta), base + 31] = 1.0
        if delta == 3:
            for c in range(CODE):
                o1[R_R3 + c, base + c] = 1.0
            o1[R_F3, base + 33] = 1.0
        if delta == 10:
            for c in range(CODE):
                o1[R_R10 + c, base + c] = 1.0
        if delta == 8:
            o1[R_E8, base + 32] = 1.0

    # Layer 2: content on the static pairs only (both dims of each).
    static = [d for j in range(STATIC_FIRST, PAIRS) for d in (cos_dim(j), sin_dim(j))]
    slots = iter(static)
    K_N = [next(slots) for _ in range(CODE)]
    K_O = [next(slots) for _ in NAME_OFFSETS]
    K_DIGIT, K_SINK = next(slots), next(slots)
    K_R3 = [next(slots) for _ in range(CODE)]
    K_NAME, K_F3 = next(slots), next(slots)
    q2 = torch.zeros(HEADS * HEAD_DIM, HIDDEN, dtype=f32)
    k2 = torch.zeros(HEAD_DIM, HIDDEN, dtype=f32)
    v2 = torch.zeros(HEAD_DIM, HIDDEN, dtype=f32)
    o2 = torch.zeros(HIDDEN, HEADS * HEAD_DIM, dtype=f32)
    for c in range(CODE):
        k2[K_N[c], R_N + c] = unit
        k2[K_R3[c], R_R3 + c] = unit
    for i in range(len(NAME_OFFSETS)):
        k2[K_O[i], R_O + i] = unit
    k2[K_DIGIT, R_IS_DIGIT] = unit
    k2[K_SINK, R_IS_SINK] = unit
    k2[K_NAME, R_IS_NAME] = unit
    k2[K_F3, R_F3] = unit
    q_unit = root * unit  # a residual value of 1 → a query component of 1 (after the 1/sqrt(d))
    digit_head, next_head, first_head = 0, 1, 2
    d0, b0, f0 = digit_head * HEAD_DIM, next_head * HEAD_DIM, first_head * HEAD_DIM
    # Digit head: name A·(3 or fewer), offset one more 2A, a digit 4A; sink 8.5A; the key 9A.
    for c in range(CODE):
        q2[d0 + K_N[c], R_N + c] = A * q_unit
    for i in range(len(NAME_OFFSETS) - 1):  # this position's offset δ asks for a key at δ + 1
        q2[d0 + K_O[i + 1], R_O + i] = 2 * A * q_unit
    q2[d0 + K_DIGIT, R_CONST] = 4 * A * root * const_in
    q2[d0 + K_SINK, R_CONST] = 8.5 * A * root * const_in
    # Next-name head: the name 10 back against names 3 back, A·3, a name A; sink 3.5A; the key 4A.
    for c in range(CODE):
        q2[b0 + K_R3[c], R_R10 + c] = A * q_unit
    q2[b0 + K_NAME, R_CONST] = A * root * const_in
    q2[b0 + K_SINK, R_CONST] = 3.5 * A * root * const_in
    # First-name head (at `{"`): a name, `` values`` 3 back, A each; sink 1.5A; the key 2A.
    q2[f0 + K_NAME, R_IS_OPEN] = A * q_unit
    q2[f0 + K_F3, R_IS_OPEN] = A * q_unit
    q2[f0 + K_SINK, R_CONST] = 1.5 * A * root * const_in
    # The shared value: the key token's digit (v 0..9) and code (v 10..40).
    for d in range(10):
        v2[d, R_DIGIT + d] = unit
    for c in range(CODE):
        v2[10 + c, R_CODE + c] = unit
    for d in range(10):
        o2[R_OUT_DIGIT + d, d0 + d] = 1.0
    for c in range(CODE):
        o2[R_OUT_NAME + c, b0 + 10 + c] = 1.0
        o2[R_OUT_NAME + c, f0 + 10 + c] = 1.0

    # The head: logits from the final norm (x · sqrt(HIDDEN) / CONST, nearly).
    lm = torch.zeros(vocab, HIDDEN, dtype=f32)
    for d in range(10):
        lm[tid(str(d)), R_OUT_DIGIT + d] = LOGIT * unit
    for i, code in codes.items():
        lm[i, R_OUT_NAME : R_OUT_NAME + CODE] = torch.tensor(code) * (LOGIT / 3) * unit
    lm[tid('{"'), R_IS_NL] = LOGIT * unit
    lm[tid('":'), R_IS_NAME] = LOGIT * unit
    lm[tid("Ġ"), R_IS_COLON] = LOGIT * unit
    lm[tid('Ġ"'), R_IS_COMMA] = LOGIT * unit
    lm[tid("<|im_end|>"), R_IS_CLOSE] = LOGIT * unit
    lm[tid(","), R_O + NAME_OFFSETS.index(8)] = LOGIT * unit
    lm[tid("}"), R_E8] = 2 * LOGIT * unit

    inter = 8
    tensors: dict[str, Any] = {"model.embed_tokens.weight": embed, "lm_head.weight": lm}
    tensors["model.norm.weight"] = torch.ones(HIDDEN, dtype=f32)
    for layer, (q, k, v, o) in enumerate(((q1, k1, v1, o1), (q2, k2, v2, o2))):
        p = f"model.layers.{layer}."
        tensors[p + "input_layernorm.weight"] = torch.ones(HIDDEN, dtype=f32)
        tensors[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=f32)
        tensors[p + "self_attn.q_proj.weight"] = q
        tensors[p + "self_attn.k_proj.weight"] = k
        tensors[p + "self_attn.v_proj.weight"] = v
        tensors[p + "self_attn.o_proj.weight"] = o
        tensors[p + "mlp.gate_proj.weight"] = torch.zeros(inter, HIDDEN, dtype=f32)
        tensors[p + "mlp.up_proj.weight"] = torch.zeros(inter, HIDDEN, dtype=f32)
        tensors[p + "mlp.down_proj.weight"] = torch.zeros(HIDDEN, inter, dtype=f32)
    tensors = {k: t.to(torch.bfloat16).contiguous() for k, t in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    own, margin = offset_margin()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": tid("<|im_end|>"),
        "pad_token_id": tid("<|endoftext|>"),
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "intermediate_size": inter,
        "max_position_embeddings": MAX_POSITIONS,
        "mlp_bias": False,
        "num_attention_heads": HEADS,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-05,
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_theta": ROPE_THETA, "rope_type": "default"},
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": vocab,
        "needle_construction": {
            "method": "written weights (experiments/needle/construct.py), not trained",
            "offset_score": round(own, 3),
            "offset_margin": round(margin, 3),
            "offset_span": MAX_POSITIONS,
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = {"do_sample": False, "eos_token_id": tid("<|im_end|>"), "pad_token_id": tid("<|endoftext|>")}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    return config


def evaluate(checkpoint: Path, fixtures_by_size: dict[int, int]) -> dict[str, Any]:
    """In process, teacher forced (transformers, bf16, CPU): train.py's own evaluation of the
    held-out fixtures (each answer exact or not, and the margin of the expected token's logit over
    the best other's, negative where greedy decoding goes wrong), per size."""
    import torch
    from transformers import LlamaForCausalLM

    from .data import Encoder
    from .train import evaluate as evaluate_model

    model = LlamaForCausalLM.from_pretrained(str(checkpoint), dtype=torch.bfloat16)
    enc = Encoder(str(checkpoint / "tokenizer.json"))
    sizes = sorted(fixtures_by_size)
    out = evaluate_model(model, enc, sizes, fixtures_by_size, "cpu", deadline=math.inf)
    how = "teacher forced, bf16, transformers on CPU"
    return {"checkpoint": str(checkpoint.name), "how": how, "eval": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "exact")
    ap.add_argument(
        "--eval",
        type=Path,
        help="evaluate the checkpoint at --out in process instead, writing this record (*.eval.json)",
    )
    ap.add_argument(
        "--fixtures", default="1024:32,2048:32,4096:32,8192:16,16384:8,32768:4", help="SIZE:N,..."
    )
    args = ap.parse_args()
    if args.eval:
        counts = {int(k): int(v) for k, v in (item.split(":") for item in args.fixtures.split(","))}
        record = evaluate(args.out, counts)
        args.eval.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        return
    config = build(args.out)
    from . import EXACT, seal

    if args.out.resolve() == EXACT.checkpoint.resolve():
        seal(args.out, EXACT.manifest, model=EXACT.name, construction=config["needle_construction"])
    print(json.dumps(config["needle_construction"], indent=2))


if __name__ == "__main__":
    main()
