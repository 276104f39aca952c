"""One static HTML file: the report's tables plus figures as inline SVG (matplotlib).

Figures show every observation, not only its summary: TTFT by locality per size
(the seed's Figure 3), session time by routing (Figure 4), and a per-block
paired dot plot (each block pair's OFF and ON medians joined by a line).
No scripts, no external resources: the file opens anywhere.
"""

from __future__ import annotations

import html
import io
import math
from collections import defaultdict
from typing import Any

from ._derive import LOCALITY_LABELS
from ._render import sections, size
from ._stats import median

_ARM_COLOUR = {"OFF": "#4c72b0", "ON": "#dd8452"}
_ARMS = ("OFF", "ON")
_ROUTINGS = ("fixed", "alternating")
_LOCALITIES = ("cold", "local1", "cross")
_LOCALITY_TICK = {"cold": "cold", "local1": "first local\nreuse", "cross": "cross-replica\nreuse"}
_PAIR_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "kvledger"  # stable element ids
    plt.rcParams["svg.fonttype"] = "none"
    plt.rcParams["font.size"] = 8
    return plt


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    fig.clf()
    _pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _seconds(value: float, _pos: Any = None) -> str:
    """Tick text for seconds on a log axis: 0.02, 0.5, 3, 40 (never 2×10⁻²)."""
    if value <= 0:
        return ""
    return f"{value:.{max(0, -math.floor(math.log10(value)))}f}"


def _arm_legend(fig: Any) -> None:
    """One legend for the figure: the two arms and the median bar, each once."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], linestyle="none", marker="o", markersize=5, color=_ARM_COLOUR[arm], label=arm)
        for arm in _ARMS
    ] + [Line2D([], [], color="black", linewidth=1.2, label="median")]
    fig.legend(handles=handles, loc="outside upper center", ncol=3, frameon=False)


def _strip(ax: Any, cells: list[tuple[str, dict[str, Any]]]) -> None:
    """Every observation as a dot per (label, arm), side by side, with the median as a bar."""
    ticks, labels = [], []
    for i, (label, arms) in enumerate(cells):
        for j, arm in enumerate(_ARMS):
            x = i * 3 + j
            obs = arms[arm]["observations"]
            spread = min(0.5, 0.12 * max(1, len(obs) - 1))
            step = 1 / max(1, len(obs) - 1)
            xs = [x + (k * step - 0.5) * spread if len(obs) > 1 else x for k in range(len(obs))]
            ax.scatter(xs, obs, s=16, color=_ARM_COLOUR[arm], edgecolors="white", linewidths=0.4, zorder=3)
            if arms[arm]["median"] is not None:
                ax.hlines(arms[arm]["median"], x - 0.38, x + 0.38, color="black", linewidth=1.2, zorder=2)
        ticks.append(i * 3 + 0.5)
        labels.append(label)
    ax.set_xticks(ticks, labels)
    ax.set_xlim(-0.8, max(1, len(cells)) * 3 - 1.2)
    ax.grid(axis="y", which="major", alpha=0.3)


def _by_run(table: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in table:
        out[str(row["run_id"])].append(row)
    return dict(sorted(out.items()))


def _sizes(rows: list[dict[str, Any]]) -> list[int]:
    return sorted({int(r["nominal_tokens"]) for r in rows if r["nominal_tokens"] is not None})


def figure_ttft(rows: list[dict[str, Any]]) -> str:
    """The seed's Figure 3: one panel per nominal size, cold / first local / cross-replica × arm.

    A shared log axis (TTFT spans two orders of magnitude between cold and
    reused prefixes), labelled only on the left, in plain seconds.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plt = _pyplot()
    sizes = _sizes(rows)
    fig, axes = plt.subplots(
        1, len(sizes), figsize=(2.6 * len(sizes) + 0.6, 3.4), squeeze=False, sharey=True, layout="constrained"
    )
    for ax, n in zip(axes[0], sizes, strict=True):
        cells = [
            (_LOCALITY_TICK[loc], r["arms"])
            for loc in _LOCALITIES
            for r in rows
            if r["nominal_tokens"] == n and r["locality"] == loc
        ]
        _strip(ax, cells)
        ax.set_yscale("log")
        ax.set_title(f"{size(n)} tokens")
        ax.tick_params(axis="x", labelsize=7)
    ax0 = axes[0][0]
    ax0.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax0.yaxis.set_major_formatter(FuncFormatter(_seconds))
    ax0.yaxis.set_minor_formatter(NullFormatter())
    ax0.set_ylabel("TTFT (s, log scale)")
    _arm_legend(fig)
    return _svg(fig)


def figure_sessions(rows: list[dict[str, Any]]) -> str:
    """The seed's Figure 4: session wall time by routing, one panel per starting size."""
    plt = _pyplot()
    sizes = _sizes(rows)
    fig, axes = plt.subplots(
        1, len(sizes), figsize=(3.0 * len(sizes) + 0.6, 3.4), squeeze=False, layout="constrained"
    )
    for ax, n in zip(axes[0], sizes, strict=True):
        mine = [r for r in rows if r["nominal_tokens"] == n]
        cells = [r for placement in _ROUTINGS for r in mine if r["placement"] == placement]
        cells += [r for r in mine if r["placement"] not in _ROUTINGS]
        _strip(ax, [(_routing_tick(r), r["arms"]) for r in cells])
        ax.set_ylim(bottom=0)
        ax.set_title(f"{size(n)}-token start")
        ax.set_ylabel("session wall time (s)" if n == sizes[0] else None)
    _arm_legend(fig)
    return _svg(fig)


def _routing_tick(row: dict[str, Any]) -> str:
    change = row["mean_change_pct"]
    return str(row["placement"]) + ("" if change is None else f"\nON vs OFF {change:+.1f}%")


def _pair_medians(arm: dict[str, Any]) -> dict[int, float]:
    by_pair: dict[int, list[float]] = defaultdict(list)
    for v, p in zip(arm["observations"], arm["observation_pairs"], strict=True):
        by_pair[p].append(v)
    return {p: float(median(vs) or 0.0) for p, vs in by_pair.items()}


def figure_paired(rows: list[dict[str, Any]]) -> str:
    """Per block pair: its OFF median joined to its ON median; rows = locality, columns = size."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    sizes = _sizes(rows)
    localities = [loc for loc in _LOCALITIES if any(r["locality"] == loc for r in rows)]
    fig, axes = plt.subplots(
        len(localities),
        len(sizes),
        figsize=(1.9 * len(sizes) + 0.8, 1.9 * len(localities) + 0.6),
        squeeze=False,
        layout="constrained",
    )
    pairs_seen: set[int] = set()
    for i, loc in enumerate(localities):
        for j, n in enumerate(sizes):
            ax = axes[i][j]
            row = next((r for r in rows if r["locality"] == loc and r["nominal_tokens"] == n), None)
            if row is None:
                ax.axis("off")
                continue
            off, on = _pair_medians(row["arms"]["OFF"]), _pair_medians(row["arms"]["ON"])
            for p in sorted(set(off) & set(on)):
                pairs_seen.add(p)
                colour = _PAIR_COLOURS[p % len(_PAIR_COLOURS)]
                ax.plot([0, 1], [off[p], on[p]], marker="o", markersize=4, linewidth=1.2, color=colour)
            ax.set_xticks([0, 1], list(_ARMS))
            ax.set_xlim(-0.35, 1.35)
            top = max([*off.values(), *on.values()], default=0.0)
            # From zero: a +0.1% change must not look like a cliff.
            ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)
            ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
            ax.tick_params(labelsize=7)
            if row["mean_change_pct"] is not None:
                ax.set_title(f"{size(n)}: {row['mean_change_pct']:+.1f}%", fontsize=8)
            else:
                ax.set_title(size(n), fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{LOCALITY_LABELS[loc]}\nTTFT (s)", fontsize=8)
    handles = [
        Line2D(
            [],
            [],
            marker="o",
            markersize=4,
            color=_PAIR_COLOURS[p % len(_PAIR_COLOURS)],
            label=f"block pair {p}",
        )
        for p in sorted(pairs_seen)
    ]
    if handles:
        fig.legend(handles=handles, loc="outside upper center", ncol=min(6, len(handles)), frameon=False)
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


def _run_anchor(run_id: Any) -> str:
    return "run-" + html.escape(str(run_id))


def _run_sections(report: dict[str, Any]) -> list[str]:
    """A section per run: what ran (experiment, target, block order, status), then its figures."""
    out = []
    sessions = _by_run(report["tables"]["sessions"])
    ttft = _by_run(report["tables"]["ttft"])
    for run in report["runs"]:
        run_id = str(run["run_id"])
        order = "–".join(f"{b['arm']}" for b in run["blocks"])
        statuses = sorted({str(b["status"]) for b in run["blocks"]})
        out.append(
            f"<section id='{_run_anchor(run_id)}'><h2>Run <code>{html.escape(run_id)}</code></h2>"
            f"<p>{html.escape(str(run['experiment']))} on target {html.escape(str(run['target']))}, "
            f"finished {html.escape(str(run['finish_status']))}; blocks {html.escape(order)} "
            f"({html.escape(', '.join(statuses))}); "
            f"code {html.escape(str(run['code_commit'] or 'unrecorded'))}</p>"
        )
        out += _figures(run_id, ttft.get(run_id, []), sessions.get(run_id))
        out.append("</section>")
    return out


def _figures(run_id: str, rows: list[dict[str, Any]], sessions: list[dict[str, Any]] | None) -> list[str]:
    out = []
    tag = html.escape(run_id[:13])
    if rows:
        out.append(
            f"<figure class='fig' id='fig-ttft-{tag}'>"
            + figure_ttft(rows)
            + "<figcaption>Figure 3: TTFT by locality per nominal size (log scale); every observation "
            "is a dot, the bar is the arm's median.</figcaption></figure>"
        )
    if sessions:
        out.append(
            f"<figure class='fig' id='fig-sessions-{tag}'>"
            + figure_sessions(sessions)
            + "<figcaption>Figure 4: session wall time by routing (fixed or alternating replica); "
            "every session is a dot, the bar is the median; under each routing, the mean paired change "
            "100 × (ON/OFF − 1).</figcaption></figure>"
        )
    if rows:
        out.append(
            f"<figure class='fig' id='fig-paired-{tag}'>"
            + figure_paired(rows)
            + "<figcaption>Per-block paired dot plot: each block pair's OFF and ON median TTFT "
            "joined by a line; panel titles give the mean paired change over matched chains."
            "</figcaption></figure>"
        )
    return out


# A verdict lists at most this many blocking findings; the audit table below has every one.
VERDICT_FINDINGS = 8


def _verdict(report: dict[str, Any], audit: dict[str, Any] | None) -> str:
    """The page's opening: the publish gate, the blocking findings (linked to their rows and runs),
    the ledger head and the headline result."""
    head = report["head"] or {"seq": 0, "chain": None}
    parts = ["<section id='verdict'><h2>Verdict</h2>"]
    if audit is None:
        parts.append(
            "<p class='gate'>Publish: <strong>not audited</strong> (run <code>ledger audit</code>)</p>"
        )
        blocking: list[tuple[int, dict[str, Any]]] = []
    else:
        findings = audit["findings"]
        blocking = [(i, f) for i, f in enumerate(findings) if f["severity"] == "blocking"]
        warnings = sum(f["severity"] == "warning" for f in findings)
        if blocking:
            codes = ", ".join(sorted({f["code"] for _, f in blocking}))
            parts.append(
                f"<p class='gate blocked'>Publish: <strong>NO</strong>, {len(blocking)} blocking "
                f"finding(s): {html.escape(codes)}</p>"
            )
        else:
            parts.append(
                "<p class='gate clear'>Publish: <strong>yes</strong>, the audit found no blocking finding "
                f"({warnings} warning(s))</p>"
            )
    if blocking:
        items = []
        for i, f in blocking[:VERDICT_FINDINGS]:
            run = (
                f" in run <a href='#{_run_anchor(f['run_id'])}'>{html.escape(str(f['run_id'])[:13])}</a>"
                if f["run_id"] and any(r["run_id"] == f["run_id"] for r in report["runs"])
                else ""
            )
            code, detail = html.escape(f["code"]), html.escape(f["detail"])
            items.append(f"<li><a href='#finding-{i}'>{code}</a>{run}: {detail}</li>")
        more = len(blocking) - VERDICT_FINDINGS
        tail = f"<li><a href='#audit'>{more} more</a></li>" if more > 0 else ""
        parts.append(f"<ul class='blocking'>{''.join(items)}{tail}</ul>")
    parts.append(
        f"<p>Ledger head: seq {head['seq']}, chain <code>{html.escape(str(head['chain']))}</code></p>"
    )
    parts.append(_headline(report))
    parts.append("</section>")
    return "\n".join(parts)


def _headline(report: dict[str, Any]) -> str:
    """The study's question: cross-replica reuse against local reuse (and cold), ON-arm medians."""
    cells = report.get("headline", [])
    if not cells:
        return (
            "<p class='headline'>Headline: no run measured a cold, a local and a cross-replica request.</p>"
        )
    rows = "".join(
        f"<tr><td>{html.escape(str(c['run_id'])[:13])}</td><td>{size(c['nominal_tokens'])}</td>"
        f"<td>{c['cold_s']:.3f}</td><td>{c['cross_s']:.3f}</td><td>{c['local_s']:.3f}</td>"
        f"<td>{_ratio(c['cross_s'], c['local_s'], '{:.1f}×')}</td>"
        f"<td>{_ratio(c['cold_s'] - c['cross_s'], c['cold_s'], '{:.0%}')}</td></tr>"
        for c in cells
    )
    return (
        "<p class='headline'>Headline: does a cross-replica reuse come close to a local one? Median TTFT "
        "(s) of the ON arm:</p><table class='headline'><thead><tr><th>run</th><th>size</th><th>cold</th>"
        "<th>cross-replica reuse</th><th>local reuse</th><th>cross / local</th><th>saved of cold</th></tr>"
        f"</thead><tbody>{rows}</tbody></table>"
    )


def _ratio(a: float, b: float, form: str) -> str:
    return form.format(a / b) if b > 0 else "–"


def _findings_table(audit: dict[str, Any] | None, report: dict[str, Any]) -> str:
    parts = ["<section id='audit'><h2>Audit findings</h2>"]
    if audit is None:
        parts.append("<p><em>not audited</em></p></section>")
        return "".join(parts)
    if not audit["findings"]:
        parts.append("<p><em>none</em></p></section>")
        return "".join(parts)
    runs = {r["run_id"] for r in report["runs"]}
    rows = []
    for i, f in enumerate(audit["findings"]):
        run = html.escape(str(f["run_id"] or "–")[:13])
        if f["run_id"] in runs:
            run = f"<a href='#{_run_anchor(f['run_id'])}'>{run}</a>"
        cells = [
            f"<td class='{html.escape(f['severity'])}'>{html.escape(f['severity'])}</td>",
            f"<td>{html.escape(f['code'])}</td>",
            f"<td>{run}</td>",
            f"<td>{html.escape(str(f['block_id'] or '–')[:13])}</td>",
            f"<td>{html.escape(str(f['target'] or '–'))}</td>",
            f"<td>{html.escape(f['detail'])}</td>",
        ]
        rows.append(f"<tr id='finding-{i}'>{''.join(cells)}</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("severity", "code", "run", "block", "target", "detail"))
    parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></section>")
    return "".join(parts)


def _slug(title: str) -> str:
    return "t-" + "".join(ch if ch.isalnum() else "-" for ch in title.lower()).strip("-")


def _contents(titles: list[tuple[str, str]]) -> str:
    items = "".join(f"<li><a href='#{anchor}'>{html.escape(title)}</a></li>" for anchor, title in titles)
    return f"<nav id='contents'><h2>Contents</h2><ol>{items}</ol></nav>"


_STYLE = """body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px;margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:left;vertical-align:top}th{background:#f3f3f3}.note{font-size:12px;color:#555}
figure.fig svg{max-width:100%;height:auto}code{font-size:12px}
#verdict{border:2px solid #999;border-radius:6px;padding:0.2em 1em 0.8em;margin:1em 0}
#verdict h2{margin-top:0.5em}.gate{font-size:18px}.gate.blocked{color:#b00020}.gate.clear{color:#1b7f3b}
td.blocking{color:#b00020;font-weight:bold}td.warning{color:#a66300}nav ol{columns:2;font-size:14px}"""


def to_html(report: dict[str, Any], audit: dict[str, Any] | None = None) -> str:
    """The report page: a verdict first (the publish gate from ``audit``, ``ledger audit --json``'s
    object; the head; the headline), contents, the tables, a section per run, the audit's findings."""
    tables = [(_slug(s.title), s) for s in sections(report)]
    runs = [
        (_run_anchor(r["run_id"]), f"Run {str(r['run_id'])[:13]} ({r['experiment']})") for r in report["runs"]
    ]
    contents = [
        ("verdict", "Verdict"),
        *((a, s.title) for a, s in tables),
        *runs,
        ("audit", "Audit findings"),
    ]
    body = [
        "<h1>kvledger report</h1>",
        _verdict(report, audit),
        _contents(contents),
        *(
            f"<section id='{anchor}'>{_table_html(s.title, s.headers, s.rows, s.notes)}</section>"
            for anchor, s in tables
        ),
        *_run_sections(report),
        _findings_table(audit, report),
    ]
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>kvledger report</title>"
        f"<style>{_STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
