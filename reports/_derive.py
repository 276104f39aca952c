"""The report: every table derived from the ledger through reports/_views.py.

SQL does the joins, pairing and filtering; the small per-cell aggregation
(medians, means of paired changes, exact tests) happens here over rows fetched
in seq order, with exact summation, so output is byte-stable.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ._source import Source
from ._stats import fmt, mean, median, paired_summary
from ._validation import validation_layers

SCOPE = "($run IS NULL OR run_id = $run)"
LOCALITY_LABELS = {"cold": "cold", "local1": "first local reuse", "cross": "cross-replica reuse"}


def head_dict(src: Source) -> dict[str, Any] | None:
    return {"seq": src.head.seq, "chain": src.head.chain} if src.head else None


def runs(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Performance runs in scope (those with ON/OFF blocks) and their block order."""
    rows = src.rows(
        f"""
        SELECT r.run_id, r.experiment, r.target, r.finish_status, r.code_commit,
               list({{'block_id': b.block_id, 'position': b.position, 'arm': b.arm, 'pair': b.pair,
                     'config_sha256': b.config_sha256, 'status': b.finish_status}} ORDER BY b.position, b.seq)
                 AS blocks
        FROM kv_runs r JOIN kv_blocks b USING (run_id) WHERE {SCOPE.replace("run_id", "r.run_id")}
        GROUP BY ALL ORDER BY min(r.seq)""",
        {"run": run},
    )
    return rows


def accounting(src: Source, run: str | None) -> dict[str, Any]:
    """DESIGN.md's accounting object, every count derived from events."""
    p = {"run": run}
    checks = src.rows(
        f"""
        SELECT count(*) FILTER (WHERE a."check" = 'exact_values') AS exact_value_checks,
               count(*) FILTER (WHERE a."check" = 'exact_values' AND a.passed) AS exact_value_passed,
               count(*) FILTER (WHERE a."check" = 'output_length') AS forced_length_checks,
               count(*) FILTER (WHERE a."check" = 'exact_values' AND NOT a.independent) AS not_independent
        FROM kv_assertions a JOIN kv_measured m USING (request_id)
        WHERE NOT m.excluded AND {SCOPE.replace("run_id", "m.run_id")}""",
        p,
    )[0]
    pairs = src.rows(
        f"""
        SELECT count(*) FILTER (WHERE status IN ('matched', 'payload-mismatch', 'gpu-mismatch')) AS pairs,
               count(*) FILTER (WHERE status = 'matched') AS matched_pairs
        FROM kv_pairs WHERE {SCOPE}""",
        p,
    )[0]
    return {
        "measured": int(src.scalar(f"SELECT count(*) FROM kv_measured WHERE NOT excluded AND {SCOPE}", p)),
        "warmups": int(
            src.scalar(
                f"""SELECT count(*) FROM kv_requests WHERE arm IS NOT NULL AND warmup
            AND block_id NOT IN (SELECT block_id FROM kv_excluded_blocks) AND {SCOPE}""",
                p,
            )
        ),
        **{k: int(v or 0) for k, v in pairs.items()},
        **{k: int(v or 0) for k, v in checks.items()},
        "excluded_blocks": [
            r["block_id"]
            for r in src.rows(
                f"SELECT DISTINCT block_id FROM kv_excluded_blocks WHERE {SCOPE} ORDER BY block_id", p
            )
        ],
    }


def exclusions(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Excluded blocks with source (namespace-leak or declared) and reason; declared request exclusions."""
    blocks = src.rows(
        f"""SELECT run_id, block_id, source, reason FROM kv_excluded_blocks WHERE {SCOPE}
                          ORDER BY seq, block_id, source""",
        {"run": run},
    )
    requests = src.rows(
        f"""SELECT run_id, NULL AS block_id, 'declared' AS source,
                              'request ' || target || ': ' || reason AS reason
                            FROM kv_declared WHERE scope = 'request' AND {SCOPE} ORDER BY seq""",
        {"run": run},
    )
    return blocks + requests


def pairing(src: Source, run: str | None) -> dict[str, Any]:
    """Counts by pairing status and every pair that is not a clean match (never dropped silently)."""
    p = {"run": run}
    counts = {
        r["status"]: int(r["n"])
        for r in src.rows(
            f"SELECT status, count(*) AS n FROM kv_pairs WHERE {SCOPE} GROUP BY status ORDER BY status", p
        )
    }
    other = src.rows(
        f"""
        SELECT status, run_id, pair, workload, step, chain, session, "window", turn, on_request, off_request
        FROM kv_pairs WHERE status <> 'matched' AND {SCOPE} ORDER BY seq, on_request, off_request""",
        p,
    )
    return {"counts": counts, "not_matched": other}


def _cells(
    rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], tuple[Any, ...]]
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        cells[key(row)].append(row)
    return cells


def _arm_summary(rows: list[dict[str, Any]], value: str) -> dict[str, Any]:
    kept = [r for r in rows if r[value] is not None]
    values = [float(r[value]) for r in kept]
    return {
        "n": len(values),
        "median": fmt(median(values)),
        "observations": [fmt(v) for v in values],
        "observation_pairs": [int(r["pair"]) for r in kept],
    }


def _paired(units: list[dict[str, Any]]) -> dict[str, Any]:
    per_pair: dict[int, list[float]] = defaultdict(list)
    for u in units:
        per_pair[int(u["pair"])].append(float(u["change_pct"]))
    changes = [float(u["change_pct"]) for u in units]
    return {
        "matched_units": len(units),
        "mean_change_pct": fmt(mean(changes)),
        "unit_change_pct": [fmt(c) for c in changes],
        "inference": paired_summary(per_pair),
    }


def _cell_order(cell: tuple[Any, ...]) -> tuple[tuple[bool, bool, float, str], ...]:
    """Numbers numerically (8k before 32k before 128k; 512 before 2048), text alphabetically, None last."""
    return tuple(
        (v is None, not isinstance(v, int | float), float(v) if isinstance(v, int | float) else 0.0, str(v))
        for v in cell
    )


def _table(
    obs: list[dict[str, Any]], units: list[dict[str, Any]], dims: tuple[str, ...], value: str
) -> list[dict[str, Any]]:
    """One row per cell of ``dims``: per-arm observations and medians, then the paired change."""

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(r[d] for d in dims)

    obs_cells, unit_cells = _cells(obs, key), _cells(units, key)
    out = []
    for cell in sorted(set(obs_cells) | set(unit_cells), key=_cell_order):
        rows = obs_cells.get(cell, [])
        arms = {arm: _arm_summary([r for r in rows if r["arm"] == arm], value) for arm in ("OFF", "ON")}
        out.append({**dict(zip(dims, cell, strict=True)), "arms": arms, **_paired(unit_cells.get(cell, []))})
    return out


def ttft_table(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Table 3 / Figure 3: TTFT by nominal size × locality × arm."""
    p = {"run": run}
    obs = src.rows(
        f"""SELECT run_id, nominal_tokens, locality, arm, pair, block_id, request_id, ttft_s
                       FROM kv_ttft WHERE {SCOPE} ORDER BY seq""",
        p,
    )
    units = src.rows(
        f"""SELECT run_id, nominal_tokens, locality, pair, chain, change_pct
                         FROM kv_ttft_pairs WHERE {SCOPE} ORDER BY seq""",
        p,
    )
    table = _table(obs, units, ("run_id", "nominal_tokens", "locality"), "ttft_s")
    order = {"cold": 0, "local1": 1, "cross": 2}
    table.sort(key=lambda r: (str(r["run_id"]), r["nominal_tokens"] or 0, order.get(r["locality"], 9)))
    for row in table:
        row["locality_label"] = LOCALITY_LABELS.get(row["locality"], row["locality"])
    return table


def session_table(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Table 4 / Figure 4: session wall time by size × routing."""
    p = {"run": run}
    obs = src.rows(
        f"""SELECT run_id, nominal_tokens, placement, arm, pair, wall_s FROM kv_sessions
                       WHERE NOT excluded AND {SCOPE} ORDER BY seq""",
        p,
    )
    units = src.rows(
        f"""SELECT run_id, nominal_tokens, placement, pair, change_pct FROM kv_session_pairs
                         WHERE {SCOPE} ORDER BY seq""",
        p,
    )
    return _table(obs, units, ("run_id", "nominal_tokens", "placement"), "wall_s")


def decode_table(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Decode rate of forced-length generation by input size, cache state and output length."""
    p = {"run": run}
    obs = src.rows(
        f"""SELECT run_id, nominal_tokens, step, max_tokens, arm, pair, decode_rate FROM kv_measured
                       WHERE workload = 'generation' AND NOT excluded AND {SCOPE} ORDER BY seq""",
        p,
    )
    units = src.rows(
        f"""SELECT run_id, nominal_tokens, step, max_tokens, pair, change_pct FROM kv_decode_pairs
                         WHERE {SCOPE} ORDER BY seq""",
        p,
    )
    return _table(obs, units, ("run_id", "nominal_tokens", "step", "max_tokens"), "decode_rate")


def window_table(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Output tokens per second of concurrency windows by sessions × placement."""
    p = {"run": run}
    obs = src.rows(
        f"""SELECT run_id, sessions, placement, arm, pair, tokens_per_s FROM kv_windows
                       WHERE NOT excluded AND {SCOPE} ORDER BY seq""",
        p,
    )
    units = src.rows(
        f"""SELECT run_id, sessions, placement, pair, change_pct FROM kv_window_pairs
                         WHERE {SCOPE} ORDER BY seq""",
        p,
    )
    return _table(obs, units, ("run_id", "sessions", "placement"), "tokens_per_s")


def _clean(value: Any) -> Any:
    """Floats rounded everywhere, so every renderer prints the same digits.

    Exact type checks (not isinstance) keep this cheap on reports of a million
    events; bool is not float, and no other float subclass reaches here.
    """
    kind = type(value)
    if kind is float:
        return fmt(value)
    if kind is dict:
        return {k if type(k) is str else str(k): _clean(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_clean(v) for v in value]
    if isinstance(value, float):
        return fmt(float(value))
    return value


def derive_report(src: Source, run: str | None = None) -> dict[str, Any]:
    """The whole report as a JSON-able dict (no rendering time, sorted when dumped)."""
    return _clean(
        {
            "kvledger_report": 1,
            "head": head_dict(src),
            "scope": {"run": run},
            "runs": runs(src, run),
            "accounting": accounting(src, run),
            "exclusions": exclusions(src, run),
            "pairing": pairing(src, run),
            "tables": {
                "ttft": ttft_table(src, run),
                "sessions": session_table(src, run),
                "decode": decode_table(src, run),
                "windows": window_table(src, run),
                "validation": validation_layers(src, run),
            },
            "statistics": {
                "unit": "block pair",
                "rule": "cells with fewer than 6 block pairs are descriptive (no CIs, no p-values); "
                "with 6 or "
                "more, exact two-sided Wilcoxon signed-rank and sign tests over per-pair mean changes",
                "change": "mean of 100 × (ON/OFF − 1) over matched units",
            },
        }
    )
