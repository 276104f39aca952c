"""Write the model card from the evaluations it cites, every figure derived again.

    python -m experiments.needle.card            # rewrite card.json from card.toml's sources
    python -m experiments.needle.card --check    # exit 1 when card.json is not what they give
    python -m experiments.needle.card --model needle-exact   # the constructed checkpoint's card

``card.toml`` lists the evaluations (name, record, what), most trusted engine first. A record
that is a ledger export (``*.jsonl.xz``, a ``needle_eval`` run as ``ledger export`` wrote it)
is imported into an empty SQLite ledger, its chain verified, its checkpoint audit required to
match the committed manifest, and its figures derived from its events
(:func:`reports.needle_figures`). A record that is ``train.py``'s in-process evaluation
(``*.eval.json``) is read as recorded. :func:`experiments.needle.write_card` then decides the
sizes served (engines first, the worst engine deciding each size).

Example:

    python -m experiments.needle.card --check && git diff --stat experiments/needle/card.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from ..fixture_text import ASKED_LINES, CARD_PARTS
from . import CARD, COMMITTED, HERE, MANIFEST, NEEDLE, Committed, committed, write_card

SOURCES = HERE / "card.toml"


class CardSourceError(Exception):
    """A cited evaluation cannot be read, does not verify, or evaluated another checkpoint."""


def _ledger_figures(
    record: Path, manifest: dict[str, str], run_id: str | None, asks: str = "spot"
) -> dict[str, Any]:
    from ledger import import_jsonl, open_ledger, verify_ledger
    from reports import needle_figures

    with tempfile.TemporaryDirectory() as tmp:
        led = open_ledger(f"sqlite:///{Path(tmp) / 'card.db'}")
        try:
            import_jsonl(led, record)
            if not verify_ledger(led).ok:
                raise CardSourceError(f"{record.name}: the ledger's chain does not verify")
            started = {
                str(e.run_id): e.data
                for e in led.events(kind="run.started")
                if e.run_id and e.data.get("experiment") == "needle_eval"
            }
            runs = list(started)
            if run_id is None:
                if len(runs) != 1:
                    raise CardSourceError(
                        f"{record.name}: {len(runs)} needle_eval runs; name one with run = ..."
                    )
                run_id = runs[0]
            elif run_id not in runs:
                raise CardSourceError(f"{record.name}: no needle_eval run {run_id}")
            # What the run's fixtures asked, as it recorded them (a run from before the choice
            # existed asked the spot question).
            asked = (started[run_id].get("params") or {}).get("asked_lines", "spot")
            if asked != asks:
                raise CardSourceError(
                    f"{record.name}: run {run_id} asked {asked!r} lines, the card cites it for {asks!r}"
                )
            audits = [e for e in led.events(run_id=run_id, kind="checkpoint.audited")]
            files = {f["name"]: f["sha256"] for a in audits for f in a.data.get("files", [])}
            if not audits or files != manifest:
                raise CardSourceError(
                    f"{record.name}: run {run_id} evaluated another checkpoint than the manifest names"
                )
            return needle_figures(led, run_id)
        finally:
            led.close()


def _in_process_figures(record: Path) -> dict[str, Any]:
    evaluated = json.loads(record.read_text())["eval"]
    return {
        "accuracy_by_size": {k: v["accuracy"] for k, v in evaluated.items()},
        "min_margin_by_size": {k: v["min_margin"] for k, v in evaluated.items()},
        "n_by_size": {k: v["n"] for k, v in evaluated.items()},
    }


def evaluations(sources: dict[str, Any], manifest: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each cited evaluation's figures, derived again from its record (card.toml order)."""
    out: dict[str, dict[str, Any]] = {}
    for item in sources["evaluation"]:
        record = HERE / item["record"]
        if not record.is_file():
            raise CardSourceError(f"{item['name']}: no record at {item['record']}")
        asks = item.get("asks", "spot")
        if asks not in ASKED_LINES:
            raise CardSourceError(
                f"{item['name']}: asks must be one of {', '.join(ASKED_LINES)}, got {asks!r}"
            )
        if record.name.endswith(".jsonl.xz"):
            got = _ledger_figures(record, manifest, item.get("run"), asks)
        elif record.name.endswith(".eval.json"):
            if asks != "spot":
                raise CardSourceError(f"{item['name']}: an in-process record asks the spot question only")
            got = _in_process_figures(record)
        else:
            raise CardSourceError(
                f"{item['name']}: {item['record']} is neither a ledger export nor an eval.json"
            )
        # "asks" only where it is not the spot question: the cards written before it stay as they are.
        out[item["name"]] = {
            **got,
            "record": item["record"],
            "what": item["what"],
            **({"asks": asks} if asks != "spot" else {}),
        }
    return out


def build(
    sources_path: Path = SOURCES, manifest_path: Path = MANIFEST, card_path: Path = CARD
) -> dict[str, Any]:
    sources = tomllib.loads(sources_path.read_text())
    manifest = json.loads(manifest_path.read_text())["files"]
    return write_card(
        evaluations(sources, manifest),
        threshold=float(sources.get("threshold", 0.99)),
        path=card_path,
        **sources.get("about", {}),
    )


def build_for(kept: Committed, card_path: Path | None = None) -> dict[str, Any]:
    """:func:`build` of a committed checkpoint's own sources, manifest and card."""
    return build(kept.sources, kept.manifest, kept.card if card_path is None else card_path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m experiments.needle.card", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--check", action="store_true", help="compare with card.json instead of writing it")
    ap.add_argument("--model", default=NEEDLE.name, choices=[c.name for c in COMMITTED])
    args = ap.parse_args(argv)
    kept = committed(args.model)
    assert kept is not None  # one of argparse's choices
    try:
        if args.check:
            with tempfile.TemporaryDirectory() as tmp:
                fresh = build_for(kept, Path(tmp) / "card.json")
            if fresh != json.loads(kept.card.read_text()):
                print(
                    f"{kept.card.name} differs from what {kept.sources.name}'s evaluations give",
                    file=sys.stderr,
                )
                return 1
            print(f"{kept.card.name} is what its {len(fresh['evaluations'])} evaluations give")
            return 0
        card = build_for(kept)
    except (CardSourceError, KeyError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    served = card["served_max_tokens"]
    for size, acc in card["accuracy_by_size"].items():
        mark = "served" if int(size) <= served else "not served"
        print(
            f"{int(size):>7,}  n={card['n_by_size'][size]:>4}  exact {acc:7.2%}  "
            f"margin {card['min_margin_by_size'][size]}  {card['source_by_size'][size]:<18} {mark}"
        )
    parts = {asked: card[part] for asked, part in CARD_PARTS.items() if part in card}
    for asked, part in parts.items():
        for size, acc in part["accuracy_by_size"].items():
            mark = "served" if int(size) <= part["served_max_tokens"] else "not served"
            print(
                f"{int(size):>7,}  n={part['n_by_size'][size]:>4}  {asked} exact {acc:7.2%}  "
                f"margin {part['min_margin_by_size'][size]}  {part['source_by_size'][size]:<18} {mark}"
            )
    print(f"wrote {kept.card.relative_to(HERE.parent.parent)}: serves up to {served:,} tokens")
    for asked, part in parts.items():
        print(f"  {asked} questions up to {part['served_max_tokens']:,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
