"""The report: every table derived from the ledger through reports/_views.py.

SQL does the joins, pairing, filtering and grouping; the small per-cell
aggregation (medians, means of paired changes, exact tests) happens here over
values listed in seq order, with exact summation, so output is byte-stable.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from ._gc import no_cycle_collection
from ._regime import regime
from ._source import Source
from ._stats import fmt, mean, median, paired_summary
from ._validation import validation_layers

SCOPE = "($run IS NULL OR run_id = $run)"
LOCALITY_LABELS = {"cold": "cold", "local1": "first local reuse", "cross": "cross-replica reuse"}
TTFT_METHOD_LABELS = {
    "kernel-stamp": "the kernel's receive timestamp of the read (SO_TIMESTAMPNS; raw socket transport)",
    "socket-read": "the time the client's read returned (user space; raw socket transport)",
    "httpx-read": "the time httpx handed the read over (user space; httpx transport)",
    "unrecorded": "not recorded (a response from before methods were recorded)",
}
"""What each ``response.received.ttft_method`` means: which transport and clock dated TTFT."""


def head_dict(src: Source) -> dict[str, Any] | None:
    return {"seq": src.head.seq, "chain": src.head.chain} if src.head else None


def runs(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Performance runs in scope (those with ON/OFF blocks) and their block order."""
    return _without_seq(_runs(src, run))


def _runs(src: Source, run: str | None) -> list[dict[str, Any]]:
    """:func:`runs`, each with the seq it is ordered by (``_seq``: its start)."""
    return src.rows(
        f"""
        SELECT r.run_id, r.experiment, r.target, r.finish_status, r.code_commit, r.asked_lines,
               list({{'block_id': b.block_id, 'position': b.position, 'arm': b.arm, 'pair': b.pair,
                     'config_sha256': b.config_sha256, 'status': b.finish_status}} ORDER BY b.position, b.seq)
                 AS blocks, min(r.seq) AS _seq
        FROM kv_runs r JOIN kv_blocks b USING (run_id) WHERE {SCOPE.replace("run_id", "r.run_id")}
        GROUP BY ALL ORDER BY min(r.seq)""",
        {"run": run},
    )


def block_states(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Each block's starting cache state (``cache.inspected``), in the order blocks ran."""
    return _without_seq(_block_states(src, run))


def _block_states(src: Source, run: str | None) -> list[dict[str, Any]]:
    return src.rows(
        f"""SELECT run_id, block_id, position, arm, reset_ok, kv_cache_usage, lmcache_stored_objects,
                   lmcache_metric, lmcache_stored_bytes, lmcache_bytes_metric, seq AS _seq
            FROM kv_block_states WHERE arm IS NOT NULL AND {SCOPE}
            ORDER BY seq""",
        {"run": run},
    )


_ACCOUNTING_COUNTS = (
    "measured",
    "warmups",
    "pairs",
    "matched_pairs",
    "exact_value_checks",
    "exact_value_passed",
    "forced_length_checks",
    "not_independent",
)


def accounting(src: Source, run: str | None) -> dict[str, Any]:
    """The accounting object of docs/design.md, every count derived from events."""
    return _sum_accounting(_accounting(src, run))


def _accounting(
    src: Source, run: str | None
) -> tuple[dict[str | None, dict[str, int]], list[tuple[Any, Any]]]:
    """:func:`accounting` run by run (counts by run id), and the excluded blocks with their runs."""
    p = {"run": run}
    by_run: dict[str | None, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_ACCOUNTING_COUNTS, 0))

    def add(sql: str) -> None:
        for row in src.rows(sql, p):
            counts = by_run[row.pop("run_id")]
            for key, value in row.items():
                counts[key] += int(value or 0)

    add(
        f"SELECT run_id, count(*) AS measured FROM kv_measured WHERE NOT excluded AND {SCOPE} GROUP BY run_id"
    )
    add(
        f"""SELECT run_id, count(*) AS warmups FROM kv_requests WHERE arm IS NOT NULL AND warmup
            AND block_id NOT IN (SELECT block_id FROM kv_excluded_blocks) AND {SCOPE} GROUP BY run_id"""
    )
    add(
        f"""
        SELECT run_id,
               count(*) FILTER (WHERE status IN ('matched', 'payload-mismatch', 'gpu-mismatch')) AS pairs,
               count(*) FILTER (WHERE status = 'matched') AS matched_pairs
        FROM kv_pairs WHERE {SCOPE} GROUP BY run_id"""
    )
    add(
        f"""
        SELECT m.run_id,
               count(*) FILTER (WHERE a."check" = 'exact_values') AS exact_value_checks,
               count(*) FILTER (WHERE a."check" = 'exact_values' AND a.passed) AS exact_value_passed,
               count(*) FILTER (WHERE a."check" = 'output_length') AS forced_length_checks,
               count(*) FILTER (WHERE a."check" = 'exact_values' AND NOT a.independent) AS not_independent
        FROM kv_assertions a JOIN kv_measured m USING (request_id)
        WHERE NOT m.excluded AND {SCOPE.replace("run_id", "m.run_id")} GROUP BY m.run_id"""
    )
    excluded = src.tuples(f"SELECT DISTINCT run_id, block_id FROM kv_excluded_blocks WHERE {SCOPE}", p)
    return dict(by_run), excluded


def _sum_accounting(
    parts: tuple[dict[str | None, dict[str, int]], list[tuple[Any, Any]]],
) -> dict[str, Any]:
    by_run, excluded = parts
    totals = dict.fromkeys(_ACCOUNTING_COUNTS, 0)
    for counts in by_run.values():
        for key, value in counts.items():
            totals[key] += value
    return {**totals, "excluded_blocks": sorted({block for _, block in excluded}, key=_null_last)}


def exclusions(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Excluded blocks with source (namespace-leak or declared) and reason; declared request exclusions."""
    blocks, requests = _exclusions(src, run)
    return _without_seq(blocks) + _without_seq(requests)


def _exclusions(src: Source, run: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    blocks = src.rows(
        f"""SELECT run_id, block_id, source, reason, seq AS _seq FROM kv_excluded_blocks WHERE {SCOPE}
                          ORDER BY seq, block_id, source""",
        {"run": run},
    )
    requests = src.rows(
        f"""SELECT run_id, NULL AS block_id, 'declared' AS source,
                              'request ' || target || ': ' || reason AS reason, seq AS _seq
                            FROM kv_declared WHERE scope = 'request' AND {SCOPE} ORDER BY seq""",
        {"run": run},
    )
    return blocks, requests


def pairing(src: Source, run: str | None) -> dict[str, Any]:
    """Counts by pairing status and every pair that is not a clean match (never dropped silently)."""
    counts, other = _pairing(src, run)
    return {"counts": _sum_counts(counts), "not_matched": _without_seq(other)}


def _pairing(src: Source, run: str | None) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """:func:`pairing`'s counts by run and status, and its pairs not matched with their seq."""
    p = {"run": run}
    counts = src.tuples(f"SELECT run_id, status, count(*) FROM kv_pairs WHERE {SCOPE} GROUP BY ALL", p)
    other = src.rows(
        f"""
        SELECT status, run_id, pair, workload, step, chain, session, "window", turn, on_request, off_request,
               seq AS _seq
        FROM kv_pairs WHERE status <> 'matched' AND {SCOPE} ORDER BY seq, on_request, off_request""",
        p,
    )
    return counts, other


def _sum_counts(counts: list[tuple[Any, ...]]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for _, status, n in counts:
        totals[status] += int(n)
    return {status: totals[status] for status in sorted(totals, key=_null_last)}


def _null_last(value: Any) -> tuple[bool, Any]:
    """ORDER BY's order (nulls last) for values of one type."""
    return (value is None, "" if value is None else value)


def _without_seq(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:
        del row["_seq"]
    return rows


def _rounded(floats: list[float]) -> Clean:
    return Clean([fmt(v) for v in floats])  # a list built whole: faster than from a generator


def _median(values: list[float] | None) -> float | None:
    """:func:`median` of floats already converted (None: no values)."""
    return median(values) if values else None


def _order_effect(ran_first: list[float] | None, ran_second: list[float] | None) -> float | None:
    """100 × (median as second block of its pair / median as first − 1): carryover and drift
    within a pair, for one arm (None unless it ran both first and second)."""
    a, b = _median(ran_first), _median(ran_second)
    if a is None or b is None or a == 0:
        return None
    return fmt(100 * (b / a - 1))


def _arm_summary(floats: list[float], pairs: list[int]) -> dict[str, Any]:
    return {
        "n": len(floats),
        "median": fmt(median(floats)),
        "observations": _rounded(floats),
        "observation_pairs": Clean(pairs),
    }


def _paired(pairs: list[int], changes: list[float]) -> dict[str, Any]:
    per_pair: dict[int, list[float]] = defaultdict(list)
    for pair, change in zip(pairs, changes, strict=True):
        per_pair[pair].append(change)
    return {
        "matched_units": len(changes),
        "mean_change_pct": fmt(mean(changes)),
        "unit_change_pct": _rounded(changes),
        "inference": paired_summary(per_pair),
    }


def _value_order(v: Any) -> tuple[bool, bool, float, str]:
    """Numbers numerically (8k before 32k before 128k; 512 before 2048), text alphabetically, None last."""
    number = isinstance(v, int | float)
    return (v is None, not number, float(v) if number else 0.0, str(v))


def _table(
    src: Source, run: str | None, dims: tuple[str, ...], value: str, observations: str, units: str
) -> list[dict[str, Any]]:
    """One row per cell of ``dims``: per-arm observations and medians, then the paired change.

    ``observations`` and ``units`` are ``relation WHERE condition``. DuckDB groups them
    into lists in seq order, as DOUBLE and BIGINT (Python's float and int), and the values of
    the blocks that ran first and second in their pair apart; the medians and means are
    computed here, exactly.
    """
    columns, p = ", ".join(dims), {"run": run}
    kept = f"FILTER (WHERE {value} IS NOT NULL"  # closed by each use, some with a further condition
    relation, condition = observations.split(" WHERE ", 1)
    # Whether each observation's block ran first in its block pair (positions 2k, 2k + 1).
    with_position = (
        f"(SELECT o.*, coalesce((SELECT b.position % 2 = 0 FROM kv_blocks b WHERE b.block_id = o.block_id),"
        f" true) AS first_in_pair FROM {relation} o) o WHERE {condition}"
    )
    as_float = f"CAST({value} AS DOUBLE)"
    empty: tuple[list[float], list[int], float | None] = ([], [], None)
    arms: dict[tuple[Any, ...], dict[str, tuple[list[float], list[int], float | None]]] = defaultdict(dict)
    for *dim_values, arm, values, pairs, ran_first, ran_second in src.tuples(
        f"SELECT {columns}, arm, list({as_float} ORDER BY seq) {kept}), "
        f"list(CAST(pair AS BIGINT) ORDER BY seq) {kept}), "
        f"list({as_float} ORDER BY seq) {kept} AND first_in_pair), "
        f"list({as_float} ORDER BY seq) {kept} AND NOT first_in_pair) "
        f"FROM {with_position} AND {SCOPE} GROUP BY ALL",
        p,
    ):
        arms[tuple(dim_values)][arm] = (values or [], pairs or [], _order_effect(ran_first, ran_second))
    paired = {
        tuple(dim_values): (pairs, changes)
        for *dim_values, pairs, changes in src.tuples(
            f"SELECT {columns}, list(CAST(pair AS BIGINT) ORDER BY seq), "
            f"list(CAST(change_pct AS DOUBLE) ORDER BY seq) FROM {units} AND {SCOPE} GROUP BY ALL",
            p,
        )
    }
    order = lru_cache(maxsize=None, typed=True)(_value_order)  # per call: few distinct values per dimension
    out = []
    for cell in sorted(arms.keys() | paired.keys(), key=lambda cell: tuple(map(order, cell))):
        by_arm = arms.get(cell, {})
        off, on = by_arm.get("OFF", empty), by_arm.get("ON", empty)
        row = dict(zip(dims, cell, strict=True))
        row["arms"] = {"OFF": _arm_summary(off[0], off[1]), "ON": _arm_summary(on[0], on[1])}
        row.update(_paired(*paired.get(cell, ([], []))))
        row["order_effect_pct"] = {"OFF": off[2], "ON": on[2]}
        out.append(row)
    return out


def ttft_table(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Table 3 / Figure 3: TTFT by nominal size × locality × arm."""
    table = _table(
        src,
        run,
        ("run_id", "nominal_tokens", "locality"),
        "ttft_s",
        "kv_ttft WHERE true",
        "kv_ttft_pairs WHERE true",
    )
    return _in_table_3_order(table, "run_id")


def _in_table_3_order(table: list[dict[str, Any]], unit: str) -> list[dict[str, Any]]:
    """Table 3's cells by ``unit`` (run or series), size, then cold, first local, cross; labelled."""
    order = {"cold": 0, "local1": 1, "cross": 2}
    table.sort(key=lambda r: (str(r[unit]), r["nominal_tokens"] or 0, order.get(r["locality"], 9)))
    for row in table:
        row["locality_label"] = LOCALITY_LABELS.get(row["locality"], row["locality"])
    return table


# The series that pool runs (kv_series: a run and its replays of the same plan and config).
_POOLED_SERIES = "SELECT series FROM kv_series GROUP BY series HAVING count(DISTINCT run_id) > 1"


def _by_series(relation: str) -> str:
    """``relation``'s rows of pooled series, its ``pair`` the series' unit (kv_series), as
    :func:`_table`'s ``relation WHERE condition``. Joined here, when asked, rather than kept as
    views that every report would materialise."""
    return (
        f"(SELECT t.* EXCLUDE (pair), s.series, s.unit AS pair FROM {relation} t "
        f"JOIN kv_series s ON s.run_id = t.run_id AND s.pair = t.pair) "
        f"WHERE series IN ({_POOLED_SERIES})"
    )


def ttft_series_table(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Table 3 over each series that pools runs (a run and its replays: kv_series), its block pairs
    counted together as one sample; ``series`` is the first run's id, ``runs`` the runs pooled.
    With ``run``, the series that holds it."""
    pooled = {
        str(series): [str(r) for r in runs]
        for series, runs in src.tuples(
            "SELECT series, list(run_id ORDER BY seq) FROM (SELECT DISTINCT s.series, s.run_id, r.seq "
            f"FROM kv_series s JOIN kv_runs r USING (run_id) WHERE s.series IN ({_POOLED_SERIES})) "
            "GROUP BY series"
        )
    }
    if run is not None:
        pooled = {series: runs for series, runs in pooled.items() if run in runs}
    if not pooled:
        return []
    cells = _table(
        src,
        None,
        ("series", "nominal_tokens", "locality"),
        "ttft_s",
        _by_series("kv_ttft"),
        _by_series("kv_ttft_pairs"),
    )
    table = _in_table_3_order([row for row in cells if row["series"] in pooled], "series")
    hardware = {
        str(run): list(devices or [])
        for run, devices in src.tuples("SELECT run_id, hardware FROM kv_run_hardware")
    }
    for row in table:
        row["runs"] = pooled[row["series"]]
        row["hardware"] = hardware.get(row["series"], [])
    return table


def replays_not_pooled(src: Source, run: str | None) -> list[dict[str, Any]]:
    """The replays with block pairs that kv_series keeps out of their original's series, and what
    differs: the plan (or none registered), the validated config, or the hardware its blocks ran
    on. With ``run``, those that replay it or are it."""
    rows = src.rows(
        """SELECT run_id, replay_of, seq AS _seq, same_plan, same_config, same_hardware, hardware,
               original_hardware
        FROM kv_replay_links
        WHERE NOT (same_plan AND same_config AND same_hardware)
          AND run_id IN (SELECT run_id FROM kv_series WHERE pair IS NOT NULL)
          AND ($run IS NULL OR $run IN (run_id, replay_of))
        ORDER BY seq""",
        {"run": run},
    )
    for row in rows:
        row["differs"] = [key for key in ("plan", "config", "hardware") if not row.pop(f"same_{key}")]
        row["hardware"] = list(row["hardware"] or [])
        row["original_hardware"] = list(row["original_hardware"] or [])
    return rows


def ttft_methods(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Which method dated the TTFT table's observations, per run (more than one: mixed)."""
    return src.rows(
        f"""SELECT run_id, coalesce(ttft_method, 'unrecorded') AS ttft_method, count(*) AS observations
            FROM kv_ttft WHERE {SCOPE} GROUP BY ALL ORDER BY run_id, ttft_method""",
        {"run": run},
    )


def session_table(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Table 4 / Figure 4: session wall time by size × routing."""
    return _table(
        src,
        run,
        ("run_id", "nominal_tokens", "placement"),
        "wall_s",
        "kv_sessions WHERE NOT excluded",
        "kv_session_pairs WHERE true",
    )


def decode_table(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Decode rate of forced-length generation by input size, cache state and output length."""
    return _table(
        src,
        run,
        ("run_id", "nominal_tokens", "step", "max_tokens"),
        "decode_rate",
        "kv_measured WHERE workload = 'generation' AND NOT excluded",
        "kv_decode_pairs WHERE true",
    )


def window_table(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Output tokens per second of concurrency windows by sessions × placement."""
    return _table(
        src,
        run,
        ("run_id", "sessions", "placement"),
        "tokens_per_s",
        "kv_windows WHERE NOT excluded",
        "kv_window_pairs WHERE true",
    )


class Clean(list[Any]):
    """A list already in output form (every float through ``fmt``): :func:`_clean` keeps it as it
    is. The study tables are built that way (tests check they are a fixed point of ``_clean``);
    their observation lists are most of a large report's values."""


def _clean(value: Any) -> Any:
    """Floats rounded everywhere, so every renderer prints the same digits.

    Exact type checks first keep this cheap on reports of a million events (bool
    is not float); a float subclass (numpy's, say) is caught by the last check.
    """
    kind = type(value)
    if kind is float:
        return fmt(value)
    if kind is dict:
        return {k if type(k) is str else str(k): _clean(v) for k, v in value.items()}
    if kind is Clean:
        return value
    if kind is list or kind is tuple:
        return [_clean(v) for v in value]
    if isinstance(value, float):
        return fmt(float(value))
    return value


def headline(ttft: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The study's question per run and nominal size: the ON arm's median TTFT of a cold prefill,
    a first local reuse and a cross-replica reuse (cells where all three were measured)."""
    cells: dict[tuple[str, int], dict[str, Any]] = {}
    for row in ttft:
        if row["nominal_tokens"] is None:
            continue
        on = row["arms"].get("ON") or {}
        cells.setdefault((str(row["run_id"]), int(row["nominal_tokens"])), {})[row["locality"]] = on.get(
            "median"
        )
    return [
        {"run_id": r, "nominal_tokens": n, "cold_s": c["cold"], "local_s": c["local1"], "cross_s": c["cross"]}
        for (r, n), c in sorted(cells.items())
        if all(c.get(k) is not None for k in ("cold", "local1", "cross"))
    ]


def derive_report(src: Source, run: str | None = None, pool_replays: bool = False) -> dict[str, Any]:
    """The whole report as a JSON-able dict (no rendering time, sorted when dumped). With
    ``pool_replays``, ``tables.ttft_series`` adds Table 3 over each run and its replays pooled."""
    src.require(run)
    with no_cycle_collection():
        return merge_report([report_parts(src, run, pool_replays)], run)


@dataclass
class ReportParts:
    """What a source derives of the report, before it is put together: each section's rows with
    their run (and the seq that orders them, ``_seq``), the counts still by run. One source's
    parts make its report (:func:`merge_report`); the parts of several sources, each holding
    some runs' observations, merge to the report of all of them (reports/_stream.py)."""

    head: dict[str, Any] | None
    runs: list[dict[str, Any]]
    accounting: tuple[dict[str | None, dict[str, int]], list[tuple[Any, Any]]]
    exclusions: tuple[list[dict[str, Any]], list[dict[str, Any]]]
    pairing: tuple[list[tuple[Any, ...]], list[dict[str, Any]]]
    ttft: list[dict[str, Any]]
    sessions: list[dict[str, Any]]
    decode: list[dict[str, Any]]
    windows: list[dict[str, Any]]
    validation: dict[str, Any]
    ttft_methods: list[dict[str, Any]]
    regime: list[dict[str, Any]]
    block_states: list[dict[str, Any]]
    ttft_series: list[dict[str, Any]] | None
    replays_not_pooled: list[dict[str, Any]] | None = None

    def owned(self, keep: Callable[[str | None], bool]) -> ReportParts:
        """These parts' rows of the runs ``keep`` says yes to (a pooled series by its first run;
        ``validation`` and ``head`` are about the whole ledger and stay)."""

        def rows(items: list[dict[str, Any]], key: str = "run_id") -> list[dict[str, Any]]:
            return [row for row in items if keep(row[key])]

        by_run, excluded = self.accounting
        counts, not_matched = self.pairing
        return replace(
            self,
            runs=rows(self.runs),
            accounting=({r: c for r, c in by_run.items() if keep(r)}, [e for e in excluded if keep(e[0])]),
            exclusions=(rows(self.exclusions[0]), rows(self.exclusions[1])),
            pairing=([c for c in counts if keep(c[0])], rows(not_matched)),
            ttft=rows(self.ttft),
            sessions=rows(self.sessions),
            decode=rows(self.decode),
            windows=rows(self.windows),
            ttft_methods=rows(self.ttft_methods),
            regime=rows(self.regime),
            block_states=rows(self.block_states),
            ttft_series=None if self.ttft_series is None else rows(self.ttft_series, "series"),
            replays_not_pooled=None if self.replays_not_pooled is None else rows(self.replays_not_pooled),
        )


def report_parts(src: Source, run: str | None, pool_replays: bool = False) -> ReportParts:
    """Every section of ``src``'s report about ``run`` (None: every run it holds), not yet merged."""
    with no_cycle_collection():
        return ReportParts(
            head=head_dict(src),
            runs=_runs(src, run),
            accounting=_accounting(src, run),
            exclusions=_exclusions(src, run),
            pairing=_pairing(src, run),
            ttft=ttft_table(src, run),
            sessions=session_table(src, run),
            decode=decode_table(src, run),
            windows=window_table(src, run),
            validation=validation_layers(src, run),
            ttft_methods=ttft_methods(src, run),
            regime=regime(src, run),
            block_states=_block_states(src, run),
            ttft_series=ttft_series_table(src, run) if pool_replays else None,
            replays_not_pooled=replays_not_pooled(src, run) if pool_replays else None,
        )


def merge_report(parts: list[ReportParts], run: str | None) -> dict[str, Any]:
    """The report of ``parts`` (from sources whose runs do not overlap, after :meth:`ReportParts.owned`;
    the first gives ``head`` and ``validation``): each list in the order one source's query gives
    it, each count summed. Rows are merged by the key their query sorts them by first (a run, or a
    seq); a run's rows all come from one part, in that part's order."""

    def joined(
        section: Callable[[ReportParts], list[dict[str, Any]]], key: Callable[[Any], Any]
    ) -> list[Any]:
        return sorted((row for part in parts for row in section(part)), key=key)

    def by_seq(row: dict[str, Any]) -> Any:
        return row["_seq"]

    first = parts[0]
    ttft = joined(lambda p: p.ttft, lambda r: str(r["run_id"]))
    by_run = {r: c for p in parts for r, c in p.accounting[0].items()}
    blocks = joined(
        lambda p: p.exclusions[0], lambda r: (r["_seq"], _null_last(r["block_id"]), _null_last(r["source"]))
    )
    not_matched = joined(
        lambda p: p.pairing[1],
        lambda r: (r["_seq"], _null_last(r["on_request"]), _null_last(r["off_request"])),
    )
    first_run = lambda r: _value_order(r["run_id"])  # noqa: E731 (the study tables' first dimension)
    report: dict[str, Any] = _clean(
        {
            "kvledger_report": 1,
            "head": first.head,
            "scope": {"run": run},
            "runs": _without_seq(joined(lambda p: p.runs, by_seq)),
            "accounting": _sum_accounting((by_run, [e for p in parts for e in p.accounting[1]])),
            "exclusions": _without_seq(blocks) + _without_seq(joined(lambda p: p.exclusions[1], by_seq)),
            "pairing": {
                "counts": _sum_counts([c for p in parts for c in p.pairing[0]]),
                "not_matched": _without_seq(not_matched),
            },
            "tables": {
                "ttft": Clean(ttft),
                "sessions": Clean(joined(lambda p: p.sessions, first_run)),
                "decode": Clean(joined(lambda p: p.decode, first_run)),
                "windows": Clean(joined(lambda p: p.windows, first_run)),
                "validation": first.validation,
            },
            "headline": headline(ttft),
            "measurement": {
                "ttft_methods": joined(lambda p: p.ttft_methods, lambda r: _null_last(r["run_id"]))
            },
            "regime": joined(lambda p: p.regime, lambda r: _null_last(r["run_id"])),
            "block_states": _without_seq(joined(lambda p: p.block_states, by_seq)),
            "statistics": STATISTICS,
        }
    )
    if first.ttft_series is not None:
        series = joined(lambda p: p.ttft_series or [], lambda r: str(r["series"]))
        report["tables"]["ttft_series"] = Clean(series)
        report["tables"]["replays_not_pooled"] = _without_seq(
            joined(lambda p: p.replays_not_pooled or [], by_seq)
        )
    return report


STATISTICS = {
    "unit": "block pair",
    "rule": "cells with fewer than 6 block pairs are descriptive (no CIs, no p-values); "
    "with 6 or more, the Hodges–Lehmann estimate over per-pair mean changes with its exact "
    "Wilcoxon signed-rank interval, the median with its exact sign-test interval (each at the "
    "level it attains, at least 95 %) and exact two-sided Wilcoxon and sign tests; "
    "nothing over requests",
    "change": "mean of 100 × (ON/OFF − 1) over matched units",
    "order_effect": "per arm, 100 × (median of its blocks that ran second in their block pair / "
    "median of those that ran first − 1): carryover and drift within a pair, beside the "
    "ON/OFF change it would bias",
}
