"""The needle model: a small Llama trained by this project to answer the fixtures' question.

Files here:

- ``tokenizer.py``, ``data.py``, ``train.py``, ``settings.toml``: how it is built and
  trained (run them again to reproduce it; ``README.md`` says how);
- ``checkpoint/``: what vLLM serves (safetensors weights, config, tokenizer);
- ``MANIFEST.sha256.json``: the SHA-256 of every checkpoint file, which the
  ``vllm`` target audits the checkpoint against;
- ``card.json``: the evaluated accuracy per prompt size and the largest size it
  serves (accuracy >= 99 %); the target takes exact-value checks as applicable
  only up to there;
- ``records/``: the training logs and in-process evaluations as they came back.

This package imports nothing beyond the standard library at import time, so the
training script runs where kvledger's own dependencies are not installed.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..fixture_text import CARD_PARTS, served_key

__all__ = [
    "CARD",
    "CHECKPOINT",
    "COMMITTED",
    "EXACT",
    "HERE",
    "MANIFEST",
    "NEEDLE",
    "Card",
    "Committed",
    "committed",
    "load_card",
    "manifest_files",
    "seal",
    "write_card",
]

HERE = Path(__file__).resolve().parent
CHECKPOINT = HERE / "checkpoint"
MANIFEST = HERE / "MANIFEST.sha256.json"
CARD = HERE / "card.json"


@dataclass(frozen=True)
class Committed:
    """A checkpoint this repository commits, with what audits and describes it: the manifest of
    its files' SHA-256, the card of the sizes it serves, and the evaluations the card cites."""

    name: str
    checkpoint: Path
    manifest: Path
    card: Path
    sources: Path

    def load_card(self) -> Card:
        return load_card(self.card)


NEEDLE = Committed("needle", CHECKPOINT, MANIFEST, CARD, HERE / "card.toml")
# Written, not trained (construct.py): every size up to its max_position_embeddings.
EXACT = Committed(
    "needle-exact",
    HERE / "exact",
    HERE / "exact.MANIFEST.sha256.json",
    HERE / "exact.card.json",
    HERE / "exact.card.toml",
)
COMMITTED = (NEEDLE, EXACT)


def committed(model: str | Path | None) -> Committed | None:
    """The committed checkpoint ``model`` names, by name or by its directory; None names the
    default, the trained needle; any other model gives None."""
    if model is None:
        return NEEDLE
    for c in COMMITTED:
        if str(model) == c.name:
            return c
    path = Path(model).expanduser()
    if path.is_dir():
        return next((c for c in COMMITTED if path.resolve() == c.checkpoint.resolve()), None)
    return None


@dataclass(frozen=True)
class Card:
    """What the model card declares: accuracy per size and the largest size served."""

    served_max_tokens: int
    accuracy_by_size: dict[int, float]
    min_margin_by_size: dict[int, float | None]
    threshold: float
    source: str
    longer_max_tokens: dict[str, int] = field(default_factory=dict)
    """For each longer question (a key of fixture_text.CARD_PARTS) whose card part exists, the
    largest prompt whose answers to it the card serves; a question never evaluated is absent."""

    def max_tokens_for(self, asked: str) -> int | None:
        """The largest prompt served for questions that ask ``asked`` (fixture_text.ASKED_LINES);
        None where the card cites no evaluation that asked them."""
        if asked == "spot":
            return self.served_max_tokens
        if asked not in CARD_PARTS:  # an unknown question is refused, not served
            raise KeyError(asked)
        return self.longer_max_tokens.get(asked)

    def serves(self, prompt_tokens: int | None) -> bool:
        """Whether answers at this prompt size are meaningful (exact-value checks apply)."""
        return prompt_tokens is not None and prompt_tokens <= self.served_max_tokens

    def unserved(self) -> dict[int, float]:
        return {n: a for n, a in sorted(self.accuracy_by_size.items()) if n > self.served_max_tokens}

    def summary(self) -> dict[str, Any]:
        """What a run records about the card (JSON: sizes as strings)."""
        return {
            "served_max_tokens": self.served_max_tokens,
            "threshold": self.threshold,
            "accuracy_by_size": {str(n): a for n, a in sorted(self.accuracy_by_size.items())},
            "unserved": {str(n): a for n, a in self.unserved().items()},
            "source": self.source,
            **{
                served_key(asked): limit
                for asked in CARD_PARTS
                if (limit := self.max_tokens_for(asked)) is not None
            },
        }


def load_card(path: Path = CARD) -> Card:
    data = json.loads(path.read_text())
    return Card(
        served_max_tokens=int(data["served_max_tokens"]),
        accuracy_by_size={int(k): float(v) for k, v in data["accuracy_by_size"].items()},
        min_margin_by_size={int(k): v for k, v in data["min_margin_by_size"].items()},
        threshold=float(data["threshold"]),
        source=str(data["source"]),
        longer_max_tokens={
            asked: int(data[part]["served_max_tokens"]) for asked, part in CARD_PARTS.items() if part in data
        },
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest_files(directory: Path = CHECKPOINT) -> dict[str, str]:
    """File name → SHA-256 of every file of the checkpoint directory."""
    return {p.name: _sha256(p) for p in sorted(directory.iterdir()) if p.is_file()}


def seal(directory: Path = CHECKPOINT, manifest: Path = MANIFEST, **about: Any) -> dict[str, Any]:
    """Write ``generation_config.json`` from the tokenizer's specials, then the manifest."""
    tok = json.loads((directory / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    gen = {"do_sample": False, "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}
    (directory / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    data = {**about, "files": manifest_files(directory)}
    manifest.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data


def _decide(evaluations: dict[str, dict[str, Any]], threshold: float) -> dict[str, Any]:
    """The figures of each size from the evaluations that measured it, and the sizes served."""

    def measured(name: str, size: str) -> bool:
        return evaluations[name]["accuracy_by_size"].get(size) is not None

    def worst_first(name: str, size: str) -> tuple[float, float]:
        m = evaluations[name]["min_margin_by_size"].get(size)
        return float(evaluations[name]["accuracy_by_size"][size]), math.inf if m is None else m

    engines = [n for n in evaluations if n.startswith("vllm")]
    others = [n for n in evaluations if not n.startswith("vllm")]
    acc: dict[int, float] = {}
    margin: dict[int, float | None] = {}
    count: dict[int, int] = {}
    source: dict[int, str] = {}
    for size in sorted({s for ev in evaluations.values() for s in ev["accuracy_by_size"]}, key=int):
        by_engine = [n for n in engines if measured(n, size)]
        # min keeps the first listed among equals, as "the first listed first" does for the others.
        name = (
            min(by_engine, key=lambda n: worst_first(n, size))
            if by_engine
            else next((n for n in others if measured(n, size)), None)
        )
        if name is None:
            continue
        ev, n = evaluations[name], int(size)
        acc[n], source[n] = float(ev["accuracy_by_size"][size]), name
        margin[n] = ev["min_margin_by_size"].get(size)
        count[n] = int(ev["n_by_size"][size])
    served = 0
    for size in sorted(acc):
        if acc[size] < threshold:
            break
        served = size
    return {
        "served_max_tokens": served,
        "accuracy_by_size": {str(k): acc[k] for k in sorted(acc)},
        "min_margin_by_size": {str(k): margin[k] for k in sorted(acc)},
        "n_by_size": {str(k): count[k] for k in sorted(acc)},
        "source_by_size": {str(k): source[k] for k in sorted(acc)},
    }


def write_card(
    evaluations: dict[str, dict[str, Any]], threshold: float = 0.99, path: Path = CARD, **about: Any
) -> dict[str, Any]:
    """The card from evaluations (each: ``accuracy_by_size``, ``min_margin_by_size``,
    ``n_by_size`` keyed by size as text). Engine evaluations (names starting ``vllm``) decide
    the sizes they measured: a size takes the figures of the engine that did worst there (lower
    accuracy, then lower margin), so a size is served only where every engine that measured it
    answered at or above ``threshold``. Other evaluations (in process) fill in sizes no engine
    measured, the first listed first. The card serves every size up to the first one below
    ``threshold``.

    Evaluations that asked every value line (``asks = "every"``) decide, by the same rules,
    the card's ``every_line`` part: the sizes at which every-line questions are served; those
    that asked dense ones (``asks = "dense"``), its ``dense_lines`` part (fixture_text.CARD_PARTS).
    The others decide the card's own figures (the seed's spot question)."""
    spot = {n: e for n, e in evaluations.items() if e.get("asks", "spot") == "spot"}
    data = {
        **about,
        "threshold": threshold,
        **_decide(spot, threshold),
        "source": ", ".join(f"{n}: {e.get('what', '')}" for n, e in evaluations.items()),
        "evaluations": {n: {k: v for k, v in e.items()} for n, e in evaluations.items()},
    }
    for asked, part in CARD_PARTS.items():
        cited = {n: e for n, e in evaluations.items() if e.get("asks") == asked}
        if cited:
            data[part] = _decide(cited, threshold)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data
