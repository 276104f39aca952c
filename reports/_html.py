"""One static HTML file: the report's tables plus figures as inline SVG (matplotlib).

Figures show every observation (PEERS.md D15): TTFT by locality per size
(the seed's Figure 3), session time by routing (Figure 4), and a per-block
paired dot plot (each block pair's OFF and ON medians joined by a line).
No scripts, no external resources: the file opens anywhere.
"""

from __future__ import annotations

import html
import io
from collections import defaultdict
from typing import Any

from ._render import sections, size
from ._stats import median

_ARM_COLOUR = {"OFF": "#4c72b0", "ON": "#dd8452"}
_LOCALITIES = ("cold", "local1", "cross")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "kvledger"  # stable element ids
    plt.rcParams["svg.fonttype"] = "none"
    return plt


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    fig.clf()
    _pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _strip(ax: Any, cells: list[tuple[str, dict[str, Any]]], ylabel: str) -> None:
    """Every observation as a dot per (label, arm), with the median as a bar."""
    ticks, labels = [], []
    for i, (label, arms) in enumerate(cells):
        for j, arm in enumerate(("OFF", "ON")):
            x = i * 3 + j
            obs = arms[arm]["observations"]
            jitter = [x + (k - (len(obs) - 1) / 2) * 0.06 for k in range(len(obs))]
            ax.scatter(jitter, obs, s=14, color=_ARM_COLOUR[arm], label=arm if i == 0 else None, zorder=3)
            if arms[arm]["median"] is not None:
                ax.hlines(arms[arm]["median"], x - 0.3, x + 0.3, color="black", linewidth=1)
        ticks.append(i * 3 + 0.5)
        labels.append(label)
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def _by_run(table: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in table:
        out[str(row["run_id"])].append(row)
    return dict(sorted(out.items()))


def figure_ttft(rows: list[dict[str, Any]]) -> str:
    plt = _pyplot()
    sizes = sorted({r["nominal_tokens"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.2 * len(sizes), 3.2), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        cells = [
            (r["locality"], r["arms"])
            for loc in _LOCALITIES
            for r in rows
            if r["nominal_tokens"] == n and r["locality"] == loc
        ]
        _strip(ax, cells, "TTFT (s)")
        ax.set_yscale("log")
        ax.set_title(f"{size(n)} tokens", fontsize=9)
    axes[0][0].legend(fontsize=8)
    return _svg(fig)


def figure_sessions(rows: list[dict[str, Any]]) -> str:
    plt = _pyplot()
    sizes = sorted({r["nominal_tokens"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.6 * len(sizes), 3.2), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        _strip(
            ax,
            [(r["placement"], r["arms"]) for r in rows if r["nominal_tokens"] == n],
            "session wall time (s)",
        )
        ax.set_title(f"{size(n)}-token sessions", fontsize=9)
    axes[0][0].legend(fontsize=8)
    return _svg(fig)


def _pair_medians(arm: dict[str, Any]) -> dict[int, float]:
    by_pair: dict[int, list[float]] = defaultdict(list)
    for v, p in zip(arm["observations"], arm["observation_pairs"], strict=True):
        by_pair[p].append(v)
    return {p: float(median(vs) or 0.0) for p, vs in by_pair.items()}


def figure_paired(rows: list[dict[str, Any]]) -> str:
    """Per block pair: OFF median → ON median, one line per pair, one panel per cell."""
    plt = _pyplot()
    cells = [r for r in rows if r["locality"] in _LOCALITIES]
    cols = max(1, min(6, len(cells)))
    nrows = max(1, -(-len(cells) // cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(1.9 * cols, 2.2 * nrows), squeeze=False)
    for ax in axes.flat[len(cells) :]:
        ax.axis("off")
    for ax, row in zip(axes.flat, cells, strict=False):
        off, on = _pair_medians(row["arms"]["OFF"]), _pair_medians(row["arms"]["ON"])
        for p in sorted(set(off) & set(on)):
            ax.plot([0, 1], [off[p], on[p]], marker="o", markersize=4, linewidth=1, label=f"pair {p}")
        ax.set_xticks([0, 1], ["OFF", "ON"], fontsize=7)
        ax.set_xlim(-0.4, 1.4)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_title(f"{size(row['nominal_tokens'])} {row['locality']}", fontsize=8)
    return _svg(fig)


def _table_html(title: str, headers: list[str], rows: list[list[str]], notes: list[str]) -> str:
    parts = [f"<h2>{html.escape(title)}</h2>"]
    if rows:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    else:
        parts.append("<p><em>none</em></p>")
    parts += [f"<p class='note'>{html.escape(n)}</p>" for n in notes]
    return "\n".join(parts)


def _figures(report: dict[str, Any]) -> list[str]:
    out = []
    sessions = _by_run(report["tables"]["sessions"])
    for run_id, rows in _by_run(report["tables"]["ttft"]).items():
        out.append(f"<h2>Figures for run {html.escape(run_id)}</h2>")
        out.append(
            "<figure class='fig' id='fig-ttft'>"
            + figure_ttft(rows)
            + "<figcaption>Figure 3: TTFT by locality per size; every observation, bar = median."
            "</figcaption></figure>"
        )
        if run_id in sessions:
            out.append(
                "<figure class='fig' id='fig-sessions'>"
                + figure_sessions(sessions[run_id])
                + "<figcaption>Figure 4: six-turn session wall time by routing.</figcaption></figure>"
            )
        out.append(
            "<figure class='fig' id='fig-paired'>"
            + figure_paired(rows)
            + "<figcaption>Per-block paired dot plot: each block pair's OFF and ON median TTFT."
            "</figcaption></figure>"
        )
    return out


_STYLE = """body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px;margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:left;vertical-align:top}th{background:#f3f3f3}.note{font-size:12px;color:#555}
figure.fig svg{max-width:100%;height:auto}code{font-size:12px}"""


def to_html(report: dict[str, Any]) -> str:
    head = report["head"] or {"seq": 0, "chain": None}
    body = [
        f"<h1>kvledger report</h1><p>Derived from ledger head seq {head['seq']}, chain "
        f"<code>{html.escape(str(head['chain']))}</code>.</p>"
    ]
    body += [_table_html(s.title, s.headers, s.rows, s.notes) for s in sections(report)]
    body += _figures(report)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>kvledger report</title>"
        f"<style>{_STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
