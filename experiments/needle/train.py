"""Train the needle model: a small Llama that answers the fixtures' question exactly.

    python -m experiments.needle.train --variant long --out DIR [--device cuda] \\
        [--train-seconds 450] [--deadline-seconds 540] [--workers 14]

Runs where torch, transformers, tokenizers and safetensors are installed (no
kvledger needed: the text comes from ``experiments.fixture_text``). Settings
are ``settings.toml``'s ``[train]`` with ``[variants.NAME]`` over it, and
``--set '{"key": value}'`` over both (smoke tests shrink the model with it).

Training is bounded by time, not steps. The length curriculum starts at
``start_len`` tokens and moves its frontier up by sqrt(2) whenever the running
exact match of frontier batches reaches ``gate_exact``, up to ``max_len``.
Batches hold ``batch_tokens`` tokens of samples padded on the right, so
positions are 0..n-1 and no attention mask is needed (transformers treats a
jump in position ids as a new packed sequence). The loss is cross-entropy on
the answer tokens only. Every minute, and at the end, the weights are written
(bf16 safetensors, ``config.json``); then a held-out evaluation at each
``--eval-sizes`` prints (stdout, JSON lines) exact accuracy and the minimum top-1 margin over the
answer tokens (teacher forced: the margin of the expected token over the best
other token, negative where greedy decoding would go wrong).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import multiprocessing as mp
import random
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from experiments.needle import data

HERE = Path(__file__).resolve().parent
_ENC: data.Encoder | None = None


def settings(variant: str, overrides: dict[str, Any]) -> dict[str, Any]:
    raw = tomllib.loads((HERE / "settings.toml").read_text())
    if variant not in raw["variants"]:
        raise SystemExit(f"unknown variant {variant!r}; settings.toml has {sorted(raw['variants'])}")
    return {**raw["train"], **raw["variants"][variant], **overrides, "variant": variant}


def _init_worker(tokenizer_json: str) -> None:
    global _ENC
    _ENC = data.Encoder(tokenizer_json)


def _batch(
    length: int, rows: int, seed: str, quiz_share: float = 0.0, quiz_turns: int = 0
) -> tuple[Any, Any, int, str]:
    assert _ENC is not None
    ids, mask = data.make_batch(_ENC, length, rows, seed, quiz_share, quiz_turns)
    return ids, mask, length, seed


class Curriculum:
    """The length frontier, moved by frontier batches' exact match."""

    def __init__(self, s: dict[str, Any], rng: random.Random) -> None:
        self.s, self.rng = s, rng
        self.frontier = int(s["start_len"])
        self.ema: float | None = None
        self.seen = 0

    def pick(self) -> tuple[int, bool]:
        """A batch length, and whether it counts as a frontier batch."""
        top = self.frontier >= self.s["max_len"]
        share = self.s["long_share"] if top else self.s["frontier_share"]
        if self.rng.random() < share:
            lo = self.frontier // 2 if top else int(self.frontier / math.sqrt(2))
            return self.rng.randint(lo, self.frontier), True
        low = math.log(min(int(self.s.get("floor_len", 256)), self.frontier))
        return int(math.exp(self.rng.uniform(low, math.log(self.frontier)))), False

    def update(self, length: int, exact: float) -> bool:
        if length < int(self.frontier / math.sqrt(2)) or self.frontier >= self.s["max_len"]:
            return False
        self.ema = exact if self.ema is None else 0.9 * self.ema + 0.1 * exact
        self.seen += 1
        if self.seen >= self.s["gate_batches"] and self.ema >= self.s["gate_exact"]:
            self.frontier = min(int(self.s["max_len"]), round(self.frontier * math.sqrt(2)))
            self.ema, self.seen = None, 0
            return True
        return False


def build_model(s: dict[str, Any], vocab: int, pad: int, eos: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = int(s["num_attention_heads"])
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=int(s["hidden_size"]),
        intermediate_size=int(s["intermediate_size"]),
        num_hidden_layers=int(s["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=int(s["hidden_size"]) // heads,
        max_position_embeddings=int(s["max_position_embeddings"]),
        rope_parameters={"rope_type": "default", "rope_theta": float(s["rope_theta"])},
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
        attn_implementation="sdpa",
    )
    torch.manual_seed(int(s["seed"]))
    return LlamaForCausalLM(config)


def save(model: Any, out: Path, s: dict[str, Any], info: dict[str, Any]) -> None:
    """bf16 safetensors and config.json (with a top-level rope_theta for other loaders)."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()}
    state.pop("lm_head.weight", None)  # tied to the embeddings
    tmp = out / "model.safetensors.tmp"
    save_file(dict(sorted(state.items())), str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")
    config = model.config.to_dict()
    config.update(architectures=["LlamaForCausalLM"], dtype="bfloat16", rope_theta=float(s["rope_theta"]))
    config.pop("attn_implementation", None)
    config.pop("_attn_implementation_autoset", None)
    config["needle_training"] = info
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def with_rope(model: Any, rope: dict[str, Any]) -> Any:
    """The same weights under other RoPE parameters (the rotary tables are built from the
    config when the model is made, so a new model takes the state)."""
    import copy

    from transformers import LlamaForCausalLM

    config = copy.deepcopy(model.config)
    config.rope_parameters = rope
    scaled = LlamaForCausalLM(config).to(model.device, dtype=next(model.parameters()).dtype)
    scaled.load_state_dict(model.state_dict())
    return scaled.eval()


def answer_margin(model: Any, prompt: list[int], answer: list[int], device: str = "cpu") -> float:
    """Teacher forced: the smallest margin over the answer's tokens of the expected token's logit
    over the best other token's (negative where greedy decoding goes wrong)."""
    import torch

    ids = torch.tensor([prompt + answer[:-1]], device=device)
    with torch.no_grad():
        h = model.model(input_ids=ids, use_cache=False).last_hidden_state[0, len(prompt) - 1 :]
        logits = model.lm_head(h).float()
    target = torch.tensor(answer, device=device)
    right = logits.gather(1, target[:, None])[:, 0]
    other = logits.scatter(1, target[:, None], -math.inf).max(dim=1).values
    return float((right - other).min())


def evaluate(
    model: Any, enc: data.Encoder, sizes: list[int], counts: dict[int, int], device: str, deadline: float
) -> dict[str, Any]:
    """Teacher-forced exact match and minimum margin per size, bf16 weights as served."""
    import torch

    results: dict[str, Any] = {}
    model = model.to(torch.bfloat16).eval()
    for size in sizes:
        exact, n, margin = 0, 0, math.inf
        for i in range(counts.get(size, 4)):
            if time.time() > deadline:
                break
            prompt, answer, _ = data.eval_fixture(enc, size, i)
            m = answer_margin(model, prompt, answer, device)
            margin = min(margin, m)
            exact += int(m > 0)
            n += 1
        results[str(size)] = {
            "n": n,
            "exact": exact,
            "accuracy": exact / n if n else None,
            "min_margin": round(margin, 3) if n else None,
        }
        print(json.dumps({"eval": size, **results[str(size)]}), flush=True)
    return results


def load_model(
    s: dict[str, Any], enc: data.Encoder, init: Path | None, device: str
) -> tuple[Any, dict[str, Any]]:
    """The model of settings ``s`` on ``device``, with ``init``'s weights where given, and the
    training record those weights carry (empty for a fresh model)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    model = build_model(s, enc.tok.get_vocab_size(), enc.pad, enc.im_end)
    trained: dict[str, Any] = {}
    if init:
        from safetensors.torch import load_file

        missing, unexpected = model.load_state_dict(load_file(str(init / "model.safetensors")), strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:  # the head is tied to the embeddings
            raise SystemExit(f"--init {init}: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        trained = json.loads((init / "config.json").read_text()).get("needle_training", {})
    return model.to(device), trained


def eval_plan(sizes_arg: str, counts_arg: str) -> tuple[list[int], dict[int, int]]:
    """``--eval-sizes`` (comma-separated) and ``--eval-counts`` (a JSON object of size: count),
    checked: a bad value is named before anything runs."""
    try:
        sizes = [int(x) for x in sizes_arg.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--eval-sizes must be comma-separated integers, got {sizes_arg!r}") from None
    try:
        raw = json.loads(counts_arg)
        if not isinstance(raw, dict):
            raise ValueError
        counts = {int(k): int(v) for k, v in raw.items()}
    except (ValueError, TypeError):
        raise SystemExit(
            "--eval-counts must be a JSON object of size: count, "
            f"e.g. '{{\"32768\": 128}}', got {counts_arg!r}"
        ) from None
    return sizes, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--train-seconds", type=float, default=450.0)
    ap.add_argument("--deadline-seconds", type=float, default=540.0)
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--eval-sizes", default="1024,2048,3072,8192,16384,32768,131072")
    ap.add_argument(
        "--eval-counts",
        default='{"1024": 64, "2048": 64, "3072": 64, "8192": 32, "16384": 16, "32768": 16, "131072": 4}',
    )
    ap.add_argument("--set", default="{}", help="JSON object over the settings")
    ap.add_argument(
        "--eval-rope",
        default="{}",
        help='JSON {"name": rope_parameters}: evaluate the trained weights again under each '
        "(e.g. YaRN scaling at serving time) after the plain evaluation",
    )
    ap.add_argument("--init", type=Path, help="start from this checkpoint's weights (continue training)")
    ap.add_argument(
        "--eval-only",
        action="store_true",
        help="no training: evaluate --init's weights as they are (eval.json in --out)",
    )
    args = ap.parse_args()
    t0 = time.time()
    # Every argument is checked before the first step: a typo found after the training would
    # cost the whole run's evaluation.
    sizes, counts = eval_plan(args.eval_sizes, args.eval_counts)
    if args.eval_only and not args.init:
        ap.error("--eval-only needs --init: the checkpoint to evaluate")
    for name in ("set", "eval_rope"):
        try:
            if not isinstance(json.loads(getattr(args, name)), dict):
                raise ValueError
        except ValueError:
            ap.error(f"--{name.replace('_', '-')} must be a JSON object, got {getattr(args, name)!r}")
    s = settings(args.variant, json.loads(args.set))
    tokenizer_json = str(HERE / s["vocab_from"])
    enc = data.Encoder(tokenizer_json)
    args.out.mkdir(parents=True, exist_ok=True)

    def say(**kv: Any) -> None:
        print(json.dumps({"t": round(time.time() - t0, 1), **kv}), flush=True)

    if args.eval_only:
        import torch

        model, trained = load_model(s, enc, args.init, args.device)
        say(eval_only=str(args.init), device=args.device, torch=torch.__version__)
        results = evaluate(model, enc, sizes, counts, args.device, t0 + args.deadline_seconds)
        only: dict[str, Any] = {"init": str(args.init), "trained": trained, "eval": results}
        (args.out / "eval.json").write_text(json.dumps(only, indent=2) + "\n")
        say(eval=results)
        return
    # The data workers fork before torch is imported.
    pool = mp.get_context("fork").Pool(args.workers, _init_worker, (tokenizer_json,))
    import torch

    model, trained = load_model(s, enc, args.init, args.device)
    init_tokens = int(trained.get("tokens", 0))
    params = sum(p.numel() for p in model.parameters())
    say(
        settings=s,
        parameters=params,
        device=args.device,
        init=str(args.init) if args.init else None,
        gpu=torch.cuda.get_device_name() if args.device == "cuda" else None,
        torch=torch.__version__,
        python=sys.version.split()[0],
    )
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": s["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
        lr=s["lr"],
        betas=tuple(s["betas"]),
        fused=args.device == "cuda",
    )
    rng = random.Random(s["seed"])
    cur = Curriculum(s, rng)
    pending: collections.deque[Any] = collections.deque()
    serial = 0
    # A continuation draws streams its checkpoint never saw: the batch seeds name how many
    # tokens the checkpoint was trained on (a fresh run keeps the plain seeds).
    streams = f"{args.variant}/{s['seed']}" + (f"/after-{init_tokens}" if init_tokens else "")

    def request() -> None:
        nonlocal serial
        length, front = cur.pick()
        rows = max(1, int(s["batch_tokens"]) // length)
        seed = f"{streams}/{serial}"
        serial += 1
        quiz = (float(s.get("quiz_share", 0.0)), int(s.get("quiz_turns", 0)))
        pending.append((front, pool.apply_async(_batch, (length, rows, seed, *quiz))))

    for _ in range(args.workers * 2):
        request()
    train_start = time.time()
    end_at = t0 + args.train_seconds
    step, tokens, last_save, last_say = 0, 0, time.time(), 0.0
    losses: collections.deque[float] = collections.deque(maxlen=50)
    while time.time() < end_at:
        front, fut = pending.popleft()
        ids_np, mask_np, length, _ = fut.get()
        request()
        now = time.time()
        frac = (now - train_start) / max(1.0, end_at - train_start)
        lr = s["lr"] * min(1.0, (step + 1) / s["warmup_steps"])
        if frac > 1 - s["decay_share"]:
            p = (frac - (1 - s["decay_share"])) / s["decay_share"]
            lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids = torch.from_numpy(ids_np).to(args.device, non_blocking=True)
        mask = torch.from_numpy(mask_np).to(args.device, non_blocking=True)
        with torch.autocast(args.device, dtype=torch.bfloat16):
            h = model.model(input_ids=ids, use_cache=False).last_hidden_state[:, :-1]
            m = mask[:, 1:]
            logits = model.lm_head(h[m]).float()
        target = ids[:, 1:][m]
        loss = torch.nn.functional.cross_entropy(logits, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s["grad_clip"])
        opt.step()
        step += 1
        tokens += int(ids_np.size)
        with torch.no_grad():
            rows = m.nonzero()[:, 0]
            wrong = torch.zeros(ids.shape[0], device=ids.device).index_add_(
                0, rows, (logits.argmax(-1) != target).float()
            )
            exact = float((wrong[m.any(dim=1)] == 0).float().mean())
        losses.append(float(loss.detach()))
        moved = cur.update(length, exact) if front else False
        if moved or time.time() - last_say > 10:
            last_say = time.time()
            say(
                step=step,
                loss=round(sum(losses) / len(losses), 4),
                exact=round(exact, 3),
                len=length,
                frontier=cur.frontier,
                lr=round(lr, 6),
                tokens=tokens,
                tok_per_s=round(tokens / (time.time() - train_start)),
            )
        if time.time() - last_save > 60:
            save(model, args.out, s, {"steps": step, "tokens": tokens, "frontier": cur.frontier})
            last_save = time.time()
    pool.terminate()
    seconds = round(time.time() - train_start, 1)
    info = {
        "steps": step,
        "tokens": tokens,
        "train_seconds": seconds,
        "frontier": cur.frontier,
        "init": str(args.init) if args.init else None,
        "parameters": params,
        "variant": args.variant,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if args.device == "cuda" else None,
    }
    save(model, args.out, s, info)
    say(done=info)
    results = evaluate(model, enc, sizes, counts, args.device, t0 + args.deadline_seconds)
    record: dict[str, Any] = {"training": info, "eval": results}
    (args.out / "eval.json").write_text(json.dumps(record, indent=2) + "\n")
    say(eval=results)
    for name, rope in json.loads(args.eval_rope).items():
        scaled = with_rope(model, {**rope, "rope_theta": float(s["rope_theta"])})
        say(eval_rope=name, rope_parameters=scaled.config.rope_parameters)
        got = evaluate(scaled, enc, sizes, counts, args.device, t0 + args.deadline_seconds)
        record.setdefault("eval_rope", {})[name] = {"rope_parameters": rope, "eval": got}
        (args.out / "eval.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
