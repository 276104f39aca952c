"""Renderers: JSON, Markdown and the terminal, all from one list of sections.

Output carries no rendering time or host, so one ledger head always gives the
same bytes; numbers are formatted with fixed places.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ._derive import TTFT_METHOD_LABELS
from ._validation import BYTES, HELPERS, PINNED


@dataclass
class Section:
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def to_json(report: dict[str, Any]) -> str:
    """Sorted keys, two-space indent, shortest round-trip floats (orjson): stable bytes."""
    return (orjson.dumps(report, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n").decode()


def num(x: Any, places: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    return f"{float(x):.{places}f}"


def pct(x: Any) -> str:
    return "–" if x is None else f"{float(x):+.2f}%"


def short(text: Any, n: int = 12) -> str:
    return "–" if text is None else str(text)[:n]


def size(tokens: Any) -> str:
    """A nominal size as the study writes it: ``8k``, ``32k``, ``128k``, ``256k``.

    Nominal sizes are round thousands of tokens in the screening (8000 …
    256000; the seed's 128k sessions start at 128,000 tokens) and may be
    multiples of 1024 elsewhere (8192 … 262144). Thousands are tried first,
    so 128000 (= 125 × 1024) reads 128k, not 125k; 131072 reads 128k too.
    Anything else is printed exactly.
    """
    if tokens is None:
        return "–"
    t = int(tokens)
    for unit in (1000, 1024):
        if t >= unit and t % unit == 0:
            return f"{t // unit}k"
    return str(t)


def _inference(row: dict[str, Any]) -> str:
    inf = row["inference"]
    if inf["mode"] == "descriptive":
        return f"descriptive ({inf['n_block_pairs']} block pairs)"
    return (
        f"Hodges–Lehmann {pct(inf['hodges_lehmann_change_pct'])} "
        f"{_interval(inf['wilcoxon_ci'], 'Wilcoxon')}; "
        f"median {pct(inf['median_change_pct'])} {_interval(inf['sign_ci'], 'sign-test')}; "
        f"Wilcoxon p={num(inf['wilcoxon_signed_rank_p'], 4)}, sign p={num(inf['sign_test_p'], 4)} "
        f"({inf['n_block_pairs']} block pairs)"
    )


def _interval(ci: dict[str, Any] | None, method: str) -> str:
    """``[low, high] (exact METHOD, LEVEL)``: the level the exact interval attains, not the nominal one."""
    if ci is None:
        return "(no exact interval)"
    return f"[{pct(ci['low'])}, {pct(ci['high'])}] (exact {method} {100 * ci['level']:.1f}%)"


def _observations(row: dict[str, Any], places: int = 3) -> str:
    parts = [
        f"{arm}: " + ", ".join(num(v, places) for v in row["arms"][arm]["observations"])
        for arm in ("OFF", "ON")
    ]
    return "; ".join(parts)


def run_label(text: Any) -> str:
    """A run id as the tables print it: its first 8 characters."""
    return short(text, 8)


def _paired_rows(
    table: list[dict[str, Any]],
    dims: list[tuple[str, Any]],
    places: int = 3,
    label: Callable[[Any], str] = run_label,
    key: str = "run_id",
) -> list[list[str]]:
    """One row per paired cell, led by its ``key`` column (a run, or a series of runs)."""
    rows = []
    for r in table:
        rows.append(
            [
                label(r[key]),
                *(fn(r) for _, fn in dims),
                num(r["arms"]["OFF"]["median"], places),
                num(r["arms"]["ON"]["median"], places),
                pct(r["mean_change_pct"]),
                _order(r.get("order_effect_pct")),
                str(r["matched_units"]),
                _inference(r),
                _observations(r, places),
            ]
        )
    return rows


def _order(effect: dict[str, Any] | None) -> str:
    """The order effect of each arm (its second-in-pair blocks against its first-in-pair ones)."""
    if not effect or all(v is None for v in effect.values()):
        return "–"
    return "; ".join(f"{arm} {pct(effect.get(arm))}" for arm in ("OFF", "ON"))


_PAIRED_HEAD = [
    "OFF median",
    "ON median",
    "mean 100×(ON/OFF−1)",
    "order effect (2nd vs 1st in pair)",
    "matched units",
    "statistics",
    "observations",
]


def _not_pooled_note(row: dict[str, Any], label: Callable[[Any], str] = run_label) -> str:
    """Why a replay is not in its original's pooled series."""
    reasons = []
    for name in row["differs"]:
        if name == "hardware":
            ran = ", ".join(row["hardware"]) or "unrecorded"
            original = ", ".join(row["original_hardware"]) or "unrecorded"
            reasons.append(f"hardware differs ({ran} against {original})")
        elif name == "plan":
            reasons.append("its plan differs or is unregistered")
        else:
            reasons.append("its validated config differs")
    return (
        f"run {label(row['run_id'])} replays {label(row['replay_of'])} but is not pooled with it: "
        + "; ".join(reasons)
    )


def ttft_method_notes(rows: list[dict[str, Any]], label: Callable[[Any], str] = run_label) -> list[str]:
    """How the TTFT figures were dated, per run; a run with several methods is called mixed."""
    by_run: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_run.setdefault(str(r["run_id"]), []).append(r)
    notes: list[str] = []
    if all(r["ttft_method"] == "unrecorded" for r in rows):
        return notes  # a ledger from before methods were recorded: its report reads as it always did
    for run_id, methods in by_run.items():
        if len(methods) == 1:
            m = methods[0]
            notes.append(
                f"run {label(run_id)}: TTFT dated by {m['ttft_method']}, "
                f"{TTFT_METHOD_LABELS.get(m['ttft_method'], m['ttft_method'])} "
                f"({m['observations']} observations)"
            )
        else:
            counts = ", ".join(f"{m['ttft_method']} {m['observations']}" for m in methods)
            notes.append(
                f"run {label(run_id)}: TTFT dated by MIXED methods ({counts}); "
                "see the audit's ttft-method-mixed"
            )
    return notes


def sections(report: dict[str, Any], label: Callable[[Any], str] = run_label) -> list[Section]:
    """The report as titled tables, shared by every human-readable format (``label``: run ids)."""
    t = report["tables"]
    acc = report["accounting"]
    out = [
        Section(
            "Accounting",
            ["field", "value"],
            [[k, ", ".join(v) if isinstance(v, list) else str(v)] for k, v in sorted(acc.items())],
        ),
        Section(
            "Exclusions (whole blocks, never single requests)",
            ["run", "block", "source", "reason"],
            [
                [label(e["run_id"]), short(e["block_id"]), e["source"], e["reason"]]
                for e in report["exclusions"]
            ],
        ),
        Section(
            "Pairing",
            ["status", "count"],
            [[k, str(v)] for k, v in sorted(report["pairing"]["counts"].items())],
            [
                f"{p['status']}: {p['workload']} {p['step']} ON {short(p['on_request'])} OFF "
                f"{short(p['off_request'])}"
                for p in report["pairing"]["not_matched"]
            ],
        ),
        Section(
            "Table 3: TTFT (s) by nominal size × locality",
            ["run", "size", "locality", *_PAIRED_HEAD],
            _paired_rows(
                t["ttft"],
                [("size", lambda r: size(r["nominal_tokens"])), ("locality", lambda r: r["locality_label"])],
                label=label,
            ),
            ttft_method_notes(report.get("measurement", {}).get("ttft_methods", []), label),
        ),
        *(
            [
                Section(
                    "Table 3, pooled: a run and its replays (same plan, config and hardware) as one "
                    "sample of block pairs",
                    ["series", "size", "locality", *_PAIRED_HEAD],
                    _paired_rows(
                        t["ttft_series"],
                        [
                            ("size", lambda r: size(r["nominal_tokens"])),
                            ("locality", lambda r: r["locality_label"]),
                        ],
                        label=label,
                        key="series",
                    ),
                    [
                        *sorted(
                            {
                                f"series {label(r['series'])}: runs {', '.join(label(x) for x in r['runs'])}"
                                + (f" on {', '.join(r['hardware'])}" if r.get("hardware") else "")
                                for r in t["ttft_series"]
                            }
                        ),
                        *(_not_pooled_note(r, label) for r in t.get("replays_not_pooled", [])),
                    ],
                )
            ]
            if "ttft_series" in t
            else []
        ),
        Section(
            "Table 4: session wall time (s) by size × routing",
            ["run", "size", "routing", *_PAIRED_HEAD],
            _paired_rows(
                t["sessions"],
                [("size", lambda r: size(r["nominal_tokens"])), ("routing", lambda r: r["placement"])],
                2,
                label,
            ),
        ),
        Section(
            "Decode rate (tokens/s), forced-length generation",
            ["run", "input", "prefix", "output", *_PAIRED_HEAD],
            _paired_rows(
                t["decode"],
                [
                    ("input", lambda r: size(r["nominal_tokens"])),
                    ("prefix", lambda r: r["step"]),
                    ("output", lambda r: str(r["max_tokens"])),
                ],
                2,
                label,
            ),
        ),
        Section(
            "Concurrency windows: output tokens/s",
            ["run", "sessions", "placement", *_PAIRED_HEAD],
            _paired_rows(
                t["windows"],
                [("sessions", lambda r: str(r["sessions"])), ("placement", lambda r: r["placement"])],
                2,
                label,
            ),
        ),
        regime_section(report.get("regime", [])),
        Section(
            "Blocks: starting cache state",
            ["run", "block", "arm", "prefix-cache reset", "KV cache usage", "LMCache stored objects"],
            [
                [
                    short(b["run_id"], 8),
                    str(b["position"]),
                    str(b["arm"]),
                    {True: "succeeded", False: "FAILED"}.get(b["reset_ok"], "not attempted"),
                    num(b["kv_cache_usage"], 4),
                    _stored(b),
                ]
                for b in report.get("block_states", [])
            ],
        ),
        *validation_sections(t["validation"]),
    ]
    out[-1].notes.append(report["statistics"]["rule"] + ".")
    out[-1].notes.append(report["statistics"]["order_effect"] + ".")
    return out


def _stored(block: dict[str, Any]) -> str:
    """What the shared tier held at the block's start: objects and resident bytes, each where its
    service exposes them."""
    held = []
    if block["lmcache_stored_objects"] is not None:
        held.append(str(block["lmcache_stored_objects"]))
    if block.get("lmcache_stored_bytes") is not None:
        held.append(f"{block['lmcache_stored_bytes']:,} bytes resident")
    if held:
        return ", ".join(held)
    return "no shared service" if block["arm"] == "OFF" else "not exposed"


def regime_section(rows: list[dict[str, Any]]) -> Section:
    """Each result's regime beside the local-reuse baseline, and what a shared tier can do there."""
    notes: dict[str, list[str]] = {}
    for r in rows:
        notes.setdefault(r["regime"] + ": " + r["statement"], []).append(
            f"{short(r['run_id'], 8)} {r['workload']} {size(r['nominal_tokens'])}"
        )
    return Section(
        "Regime: working set against the device cache (vllm:cache_config_info)",
        [
            "run",
            "workload",
            "size",
            "working set (tokens)",
            "device cache (tokens)",
            "regime",
            "local reuse TTFT OFF (s)",
            "local reuse TTFT ON (s)",
        ],
        [
            [
                short(r["run_id"], 8),
                str(r["workload"]),
                size(r["nominal_tokens"]),
                num(r["working_set_tokens"]),
                num(r["device_cache_tokens"]),
                r["regime"],
                num(r["off_local_reuse_ttft_s"]),
                num(r["on_local_reuse_ttft_s"]),
            ]
            for r in rows
        ],
        [f"{text} ({', '.join(where)})" for text, where in notes.items()],
    )


def validation_sections(v: dict[str, Any]) -> list[Section]:
    layers = Section(
        "Table 2: validation layers",
        ["layer", "applies to", "checks", "passed", "status"],
        [
            [
                x["layer"],
                x["applies_to"],
                str(x["checks"]),
                str(x["passed_checks"]),
                x["status"],
            ]
            for x in v["layers"]
        ],
    )
    by_name = {x["layer"]: x for x in v["layers"]}
    copy, helpers, pinned = by_name[BYTES], by_name[HELPERS], by_name[PINNED]
    layers.notes = (
        [
            f"{x['layer']}: not applicable — {x['applicability']}"
            for x in v["layers"]
            if not x["applicable"] and x.get("applicability")
        ]
        + [
            f"{c['method']} {c['direction']} {'delayed' if c['delayed'] else 'undelayed'}: "
            f"{c['passed']}/{c['checks']} passed"
            for c in copy["cells"]
        ]
        + [
            f"LMCache {p['lmcache_version']} {p['allocator']} allocator, "
            f"{'with' if p['with_ops'] else 'without'} compiled ops ({p['copy']}), {p['direction']} "
            f"{'delayed' if p['delayed'] else 'undelayed'}: {p['passed']}/{p['checks']} passed"
            + (f", {p['errored']} errored" if p["errored"] else "")
            + (f", first bad byte {p['first_bad_offset']}" if p["first_bad_offset"] is not None else "")
            for p in helpers["paths"]
        ]
        + [
            f"{s['series']}, {s['bytes_requested']} bytes: reserved {s['bytes_reserved']} unmitigated, "
            + (
                (f"within tolerance under {s['mitigation']}" if s["mitigation"] else "within tolerance")
                if s["passed"]
                else f"beyond {pinned['tolerance']} under every setting tried"
            )
            + (f"; refused: {', '.join(s['refused'])}" if s["refused"] else "")
            for s in pinned["sizes"]
        ]
    )
    configs = Section(
        "Validation coverage of ON configurations",
        ["config", "transfer path", "layers", "status"],
        [
            [
                short(c["config_sha256"], 16),
                "/".join(c["transfer_paths"]),
                "; ".join(f"{k}: {state}" for k, state in c["layers"].items()),
                "validated" if c["passed"] else "NOT validated",
            ]
            for c in v["configs"]
        ],
    )
    return [layers, configs]


# What a run's exact-value checks asked, where not the seed's three lines (experiments' asked_lines).
_ASKED_NOTE = {"every": ", every value line asked", "dense": ", dense value lines, every one asked"}


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(report: dict[str, Any]) -> str:
    head = report["head"] or {"seq": 0, "chain": None}
    lines = [
        "# kvledger report",
        "",
        f"Derived from ledger head seq {head['seq']}, chain `{head['chain']}`"
        + (f", run `{report['scope']['run']}`." if report["scope"]["run"] else ", all runs."),
        "",
        "Runs: "
        + (
            ", ".join(
                f"`{r['run_id']}` ({r['experiment']}, {'–'.join(b['arm'] for b in r['blocks'])}"
                # What its exact-value checks asked, where not the seed's three lines.
                + _ASKED_NOTE.get(str(r.get("asked_lines")), "")
                + ")"
                for r in report["runs"]
            )
            or "none"
        ),
        "",
    ]
    lines += markdown_lines(sections(report))
    return "\n".join(lines).rstrip() + "\n"


def markdown_lines(secs: list[Section]) -> list[str]:
    """Each section as a ``##`` heading, a Markdown table (or _none_) and its notes."""
    lines: list[str] = []
    for s in secs:
        lines += [f"## {s.title}", ""]
        if s.rows:
            lines.append("| " + " | ".join(s.headers) + " |")
            lines.append("|" + "---|" * len(s.headers))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in s.rows]
        else:
            lines.append("_none_")
        lines += [""] + [f"- {_md_cell(n)}" for n in s.notes] + ([""] if s.notes else [])
    return lines


# Below this width the terminal leaves out the per-observation column (it would wrap every row),
# and the paired tables take their narrow form: short headers, the statistics in a few characters,
# the run column only when the report holds more than one run.
WIDE_TERMINAL = 160
_NARROW_HEADERS = {
    "OFF median": "OFF",
    "ON median": "ON",
    "mean 100×(ON/OFF−1)": "ON/OFF−1",
    "matched units": "units",
    "statistics": "stats",
}
NARROW_LEGEND = (
    "OFF, ON: medians; ON/OFF−1: mean of 100×(ON/OFF−1) over matched units; stats: descr. = "
    "descriptive only (fewer than 6 block pairs), else the Wilcoxon signed-rank p; n = block pairs"
)
_DESCRIPTIVE = re.compile(r"descriptive \((\d+) block pairs\)")
_TESTED = re.compile(r"Wilcoxon p=([^,]+), sign p=[^ ]+ \((\d+) block pairs\)")


def compact_statistics(text: str) -> str:
    """A statistics cell in a few characters: ``descr. n=2`` or ``p=0.0312 n=8``."""
    if m := _DESCRIPTIVE.fullmatch(text):
        return f"descr. n={m.group(1)}"
    if m := _TESTED.fullmatch(text):
        return f"p={m.group(1)} n={m.group(2)}"
    return text


def terminal_run_label(run_ids: list[str]) -> Callable[[Any], str]:
    """Run ids as the terminal prints them: 8 characters, or, where two runs share those (UUIDv7
    ids of runs started within a minute do), the first 8 and the last 4."""
    if len({str(r)[:8] for r in run_ids}) == len(run_ids):
        return run_label
    return lambda text: "–" if text is None else f"{str(text)[:8]}…{str(text)[-4:]}"


def terminal_sections(report: dict[str, Any], width: int) -> list[Section]:
    """The sections for a terminal ``width`` columns wide: the observations column only when it fits,
    and below that the narrow form of the paired tables."""
    out = sections(report, terminal_run_label([r["run_id"] for r in report["runs"]]))
    if width >= WIDE_TERMINAL:
        return out
    one_run = len(report["runs"]) <= 1
    for s in out:
        if s.headers and s.headers[-1] == "observations":
            s.headers = s.headers[:-1]
            s.rows = [row[:-1] for row in s.rows]
            if s.rows:
                s.notes.insert(0, "every observation: ledger report --markdown, --json or --html")
        if "statistics" in s.headers:
            stats = s.headers.index("statistics")
            s.rows = [[*row[:stats], compact_statistics(row[stats]), *row[stats + 1 :]] for row in s.rows]
            s.headers = [_NARROW_HEADERS.get(h, h) for h in s.headers]
        if one_run and s.headers and s.headers[0] == "run":
            s.headers = s.headers[1:]
            s.rows = [row[1:] for row in s.rows]
    return out


def print_terminal(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    head = report["head"] or {"seq": 0, "chain": None}
    console.print(
        f"[bold]kvledger report[/bold] — ledger head seq {head['seq']} chain {short(head['chain'])}"
    )
    runs = report["runs"]
    label = terminal_run_label([r["run_id"] for r in runs])
    console.print(
        "runs: " + (", ".join(f"{label(r['run_id'])} ({r['experiment']})" for r in runs) or "none"),
        highlight=False,
    )
    narrow = console.width < WIDE_TERMINAL
    if narrow:
        console.print(f"[dim]{NARROW_LEGEND}[/dim]")
    for s in terminal_sections(report, console.width):
        if not s.rows:
            console.print(f"[bold]{s.title}[/bold]: none")
        else:
            table = Table(title=s.title, title_justify="left", show_lines=False)
            for header in s.headers:
                # The statistics and run ids never wrap: a wrapped p-value or id reads as two.
                keep = header in ("stats", "statistics", "run")
                table.add_column(header, no_wrap=keep, min_width=8 if header == "run" else None)
            for row in s.rows:
                table.add_row(*row)
            console.print(table)
        for note in s.notes:
            console.print(f"  • {note}", highlight=False)
