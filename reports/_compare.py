"""``ledger compare RUN_A RUN_B``: two runs' tables side by side.

Each run's cells are derived as in its own report (reports/_derive.py) and
matched by their dimensions (size, locality, routing, ...). Per run: the OFF
and ON medians and the paired ON/OFF change, which is the Hodges–Lehmann
estimate with its exact interval where the run has at least 6 block pairs in
the cell, and the descriptive mean change otherwise (said so). Where the two
runs' block pairs pair up (the same block-pair indices in the cell), the
difference B − A of their per-pair changes is summarised the same way; it is
never computed over requests.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ._derive import _clean, decode_table, session_table, ttft_table, window_table
from ._render import Section, markdown_lines, num, pct, size
from ._source import Source
from ._stats import paired_summary

__all__ = ["compare", "compare_markdown", "compare_sections"]

_TABLES: dict[str, tuple[Any, tuple[str, ...]]] = {
    "ttft": (ttft_table, ("nominal_tokens", "locality")),
    "sessions": (session_table, ("nominal_tokens", "placement")),
    "decode": (decode_table, ("nominal_tokens", "step", "max_tokens")),
    "windows": (window_table, ("sessions", "placement")),
}
_TITLES = {
    "ttft": "TTFT (s) by nominal size × locality",
    "sessions": "session wall time (s) by size × routing",
    "decode": "decode rate (tokens/s), forced-length generation",
    "windows": "concurrency windows: output tokens/s",
}


def _side(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    inf = row["inference"]
    exact = inf["mode"] != "descriptive"
    return {
        "off_median": row["arms"]["OFF"]["median"],
        "on_median": row["arms"]["ON"]["median"],
        "change_pct": inf["hodges_lehmann_change_pct"] if exact else row["mean_change_pct"],
        "estimate": "hodges-lehmann" if exact else "mean (descriptive)",
        "ci": inf.get("wilcoxon_ci") if exact else None,
        "n_block_pairs": inf["n_block_pairs"],
        "per_pair": dict(zip(inf.get("pairs", []), inf["per_pair_change_pct"], strict=True)),
    }


def _between(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """B − A over the block pairs both runs have in this cell."""
    if a is None or b is None:
        return None
    common = sorted(set(a["per_pair"]) & set(b["per_pair"]))
    if not common:
        return None
    summary = paired_summary({p: [b["per_pair"][p] - a["per_pair"][p]] for p in common})
    exact = summary["mode"] != "descriptive"
    return {
        "block_pairs": common,
        "difference_pct_points": summary["hodges_lehmann_change_pct"]
        if exact
        else _mean([b["per_pair"][p] - a["per_pair"][p] for p in common]),
        "estimate": "hodges-lehmann" if exact else "mean (descriptive)",
        "ci": summary.get("wilcoxon_ci"),
        "note": summary.get("note"),
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def compare(src: Source, run_a: str, run_b: str) -> dict[str, Any]:
    """The comparison as a JSON-able dict (same head, same bytes)."""
    src.require(run_a, run_b)
    tables: dict[str, list[dict[str, Any]]] = {}
    for name, (derive, dims) in _TABLES.items():
        cells: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = defaultdict(dict)
        for side, run in (("a", run_a), ("b", run_b)):
            for row in derive(src, run):
                cells[tuple(row[d] for d in dims)][side] = row
        rows = []
        for key in sorted(cells, key=lambda k: tuple((v is None, str(v).zfill(12)) for v in k)):
            a, b = _side(cells[key].get("a")), _side(cells[key].get("b"))
            rows.append({**dict(zip(dims, key, strict=True)), "a": a, "b": b, "b_minus_a": _between(a, b)})
        tables[name] = rows
    head = {"seq": src.head.seq, "chain": src.head.chain} if src.head else None
    hardware = {
        str(run): list(devices or [])
        for run, devices in src.tuples(
            "SELECT run_id, hardware FROM kv_run_hardware WHERE run_id IN ($a, $b)", {"a": run_a, "b": run_b}
        )
    }
    return _clean(
        {
            "kvledger_compare": 1,
            "head": head,
            "runs": {"a": run_a, "b": run_b},
            # What each run's replicas ran on: a comparison of two kinds of hardware says so.
            "hardware": {"a": hardware.get(run_a, []), "b": hardware.get(run_b, [])},
            "tables": tables,
        }
    )


def _change(side: dict[str, Any] | None) -> str:
    if side is None:
        return "–"
    text = pct(side["change_pct"])
    if side["ci"]:
        text += f" [{pct(side['ci']['low'])}, {pct(side['ci']['high'])}]"
    return f"{text} ({side['estimate']}, {side['n_block_pairs']} pairs)"


def _difference(d: dict[str, Any] | None) -> str:
    if d is None:
        return "no common block pairs"
    text = "–" if d["difference_pct_points"] is None else f"{d['difference_pct_points']:+.2f} pp"
    if d["ci"]:
        text += f" [{d['ci']['low']:+.2f}, {d['ci']['high']:+.2f}]"
    return f"{text} ({d['estimate']}, pairs {', '.join(str(p) for p in d['block_pairs'])})"


def _label(row: dict[str, Any], dims: tuple[str, ...]) -> list[str]:
    return [size(row[d]) if d == "nominal_tokens" else "–" if row[d] is None else str(row[d]) for d in dims]


def compare_sections(result: dict[str, Any]) -> list[Section]:
    """The comparison as titled tables (Markdown and terminal)."""
    a, b = result["runs"]["a"][:8], result["runs"]["b"][:8]
    out = []
    for name, (_, dims) in _TABLES.items():
        rows = []
        for r in result["tables"][name]:
            sides = [r["a"], r["b"]]
            rows.append(
                [
                    *_label(r, dims),
                    *(num(s["off_median"]) if s else "–" for s in sides[:1]),
                    *(num(s["on_median"]) if s else "–" for s in sides[:1]),
                    _change(r["a"]),
                    *(num(s["off_median"]) if s else "–" for s in sides[1:]),
                    *(num(s["on_median"]) if s else "–" for s in sides[1:]),
                    _change(r["b"]),
                    _difference(r["b_minus_a"]),
                ]
            )
        out.append(
            Section(
                _TITLES[name],
                [
                    *dims,
                    f"{a} OFF median",
                    f"{a} ON median",
                    f"{a} change",
                    f"{b} OFF median",
                    f"{b} ON median",
                    f"{b} change",
                    "B − A (per-pair change)",
                ],
                rows,
                [
                    "change: Hodges–Lehmann over per-pair changes with its exact Wilcoxon interval where a "
                    "cell has at least 6 block pairs, else the descriptive mean of 100 × (ON/OFF − 1); "
                    "B − A pairs the runs' block pairs by index, never requests"
                ],
            )
        )
    return out


def _on(result: dict[str, Any], side: str) -> str:
    devices = result["hardware"][side]
    return f" on {', '.join(devices)}" if devices else ""


def compare_markdown(result: dict[str, Any]) -> str:
    head = result["head"] or {"seq": 0, "chain": None}
    lines = [
        "# kvledger compare",
        "",
        f"Derived from ledger head seq {head['seq']}, chain `{head['chain']}`: "
        f"A = run `{result['runs']['a']}`{_on(result, 'a')}, "
        f"B = run `{result['runs']['b']}`{_on(result, 'b')}.",
        *(
            [
                "",
                "The two runs ran on different hardware: their difference is the hardware's as much as "
                "the configuration's.",
            ]
            if result["hardware"]["a"] != result["hardware"]["b"]
            else []
        ),
        "",
        *markdown_lines(compare_sections(result)),
    ]
    return "\n".join(lines).rstrip() + "\n"
