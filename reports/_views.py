"""The SQL views behind every report table and audit check.

Each view reads the extractions (one per kind: rows of the ledger's
``events`` with explicit field types, so it works whatever kinds a ledger
happens to hold) or earlier views here. A report reads the extractions as
projections kept beside the snapshot's segments, so the JSON of an event is
parsed once; :func:`with_clause` renders extractions and views as one
``WITH`` so the same SQL can be pasted into ``ledger sql``; reports/VIEWS.md is
generated from :data:`EXTRACTIONS` and :data:`VIEWS`. Views are materialised as
temporary tables in an in-memory DuckDB: nothing is written to the ledger.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb

from ledger import view_name

# Each kind the views read, as rows with typed data fields: ``kv_x_<kind>`` → SQL over
# ``events``. A report reads them as projections kept per snapshot segment (see
# ledger.Analytics), so each event's JSON is parsed once, when its segment is written.
EXTRACTIONS: dict[str, str] = {}


def _extract(kind: str, fields: dict[str, Any]) -> str:
    """Rows of one kind with typed data fields (one JSON parse per row, done by the projection)."""
    name = "kv_x_" + view_name(kind)
    structure = json.dumps(fields, separators=(",", ":"))
    sql = (f"SELECT seq, run_id, block_id, unnest(json_transform(data, '{structure}')) "
           f"FROM events WHERE kind = '{kind}'")
    if EXTRACTIONS.setdefault(name, sql) != sql:
        raise ValueError(f"{kind} is extracted with two different field sets")
    return f"SELECT * FROM {name}"


def projections() -> dict[str, str]:
    """The extractions as the snapshot projections a report's Analytics keeps (``kv_src_<kind>``)."""
    return {_source_name(name): sql for name, sql in EXTRACTIONS.items()}


def _source_name(extraction: str) -> str:
    return extraction.replace("kv_x_", "kv_src_", 1)


_REQUEST_FIELDS = {
    "request_id": "VARCHAR",
    "replica": "VARCHAR",
    "gpu": "JSON",
    "workload": "VARCHAR",
    "step": "VARCHAR",
    "chain": "VARCHAR",
    "session": "VARCHAR",
    "window": "VARCHAR",
    "turn": "BIGINT",
    "placement": "VARCHAR",
    "warmup": "BOOLEAN",
    "payload_sha256": "VARCHAR",
    "namespace": "VARCHAR",
    "nominal_tokens": "BIGINT",
    "params": {"max_tokens": "BIGINT"},
}
_RESPONSE_FIELDS = {
    "request_id": "VARCHAR",
    "status": "BIGINT",
    "ttft_s": "DOUBLE",
    "t_first": "DOUBLE",
    "t_last": "DOUBLE",
    "e2e_s": "DOUBLE",
    "prompt_tokens": "BIGINT",
    "output_tokens": "BIGINT",
    "decode_rate": "DOUBLE",
    "error": "VARCHAR",
}
_HITS_FIELDS = {
    "request_id": "VARCHAR",
    "window": "VARCHAR",
    "replica": "VARCHAR",
    "prefix_queries": "BIGINT",
    "local_hit_tokens": "BIGINT",
    "external_hit_tokens": "BIGINT",
    "prompt_tokens": "BIGINT",
}

# (name, SQL) in dependency order. Names are prefixed kv_ so they never shadow ledger views.
VIEWS: list[tuple[str, str]] = [
    (
        "kv_runs",
        f"""
SELECT r.run_id, r.seq, r.experiment, r.params->>'target' AS target,
       r.params->>'config_sha256' AS validated_config,
       coalesce(r.code->>'commit', r.code->>'git_commit') AS code_commit,
       r.packages, f.status AS finish_status
FROM ({
            _extract(
                "run.started", {"experiment": "VARCHAR", "params": "JSON", "code": "JSON", "packages": "JSON"}
            )
        }) r
LEFT JOIN (SELECT run_id, arg_max(status, seq) AS status
           FROM ({_extract("run.finished", {"status": "VARCHAR"})}) GROUP BY run_id) f USING (run_id)""",
    ),
    (
        "kv_blocks",
        f"""
SELECT b.run_id, b.block_id, b.seq, b."index" AS position, b.arm, b.pair, b."order", b.gpu_swap,
       b.config_sha256, b.restarted, f.status AS finish_status, f.error AS finish_error
FROM ({
            _extract(
                "block.started",
                {
                    "index": "BIGINT",
                    "arm": "VARCHAR",
                    "pair": "BIGINT",
                    "order": "JSON",
                    "gpu_swap": "BOOLEAN",
                    "config_sha256": "VARCHAR",
                    "restarted": "BOOLEAN",
                },
            )
        }) b
LEFT JOIN (SELECT block_id, arg_max(status, seq) AS status, arg_max(error, seq) AS error
           FROM ({
            _extract("block.finished", {"status": "VARCHAR", "error": "VARCHAR"})
        }) GROUP BY block_id) f USING (block_id)
-- Validation runs deploy an ON block too, but they are the service regression, not a comparison.
WHERE b.run_id NOT IN (SELECT run_id FROM kv_runs WHERE experiment = 'validation')""",
    ),
    (
        "kv_launches",
        f"""
SELECT run_id, block_id, seq, replica, config_sha256, transfer_path, target, model->>'revision' AS revision
FROM ({
            _extract(
                "deployment.launched",
                {
                    "replica": "VARCHAR",
                    "config_sha256": "VARCHAR",
                    "transfer_path": "VARCHAR",
                    "target": "VARCHAR",
                    "model": "JSON",
                },
            )
        })""",
    ),
    # Every hits.observed (single-request and window-level) with its block's arm (parsed once).
    (
        "kv_hits",
        f"""
SELECT h.seq, h.run_id, h.block_id, b.arm, h.request_id, h."window", h.replica, h.prefix_queries,
       h.local_hit_tokens, h.external_hit_tokens, h.prompt_tokens
FROM ({_extract("hits.observed", _HITS_FIELDS)}) h LEFT JOIN kv_blocks b USING (block_id)""",
    ),
    # Each request with its first response and first single-request hits (by seq).
    (
        "kv_requests",
        f"""
SELECT q.seq, q.run_id, q.block_id, b.arm, b.pair, q.request_id, q.replica, CAST(q.gpu AS VARCHAR) AS gpu,
       q.workload, q.step, q.chain, q.session, q."window", q.turn, q.placement, q.warmup,
       q.payload_sha256, q.namespace, q.nominal_tokens, q.params.max_tokens AS max_tokens,
       r.status, r.error, r.ttft_s, r.t_first, r.t_last, r.e2e_s, r.output_tokens,
       coalesce(r.decode_rate, (r.output_tokens - 1) / nullif(r.t_last - r.t_first, 0)) AS decode_rate,
       coalesce(h.prompt_tokens, r.prompt_tokens) AS prompt_tokens,
       h.request_id IS NOT NULL AS has_hits, h.prefix_queries, h.local_hit_tokens, h.external_hit_tokens
FROM ({_extract("request.sent", _REQUEST_FIELDS)}) q
LEFT JOIN kv_blocks b ON b.block_id = q.block_id
LEFT JOIN (WITH r AS ({_extract("response.received", _RESPONSE_FIELDS)})
           SELECT * FROM r WHERE seq IN (SELECT min(seq) FROM r GROUP BY request_id)) r USING (request_id)
LEFT JOIN (SELECT * FROM kv_hits WHERE seq IN (SELECT min(seq) FROM kv_hits WHERE request_id IS NOT NULL
                                                GROUP BY request_id)) h USING (request_id)""",
    ),
    (
        "kv_assertions",
        f"""
SELECT a.seq, a.run_id, a.block_id, a.request_id, a."check", a.passed, a.independent, a.config_sha256,
       CAST(a.expected AS VARCHAR) AS expected, CAST(a.observed AS VARCHAR) AS observed
FROM ({
            _extract(
                "assertion.evaluated",
                {
                    "request_id": "VARCHAR",
                    "check": "VARCHAR",
                    "passed": "BOOLEAN",
                    "independent": "BOOLEAN",
                    "config_sha256": "VARCHAR",
                    "expected": "JSON",
                    "observed": "JSON",
                },
            )
        }) a""",
    ),
    (
        "kv_checkpoints",
        f"""
SELECT seq, run_id, path, revision, matched, stable, CAST(files AS VARCHAR) AS files,
       CAST(missing AS VARCHAR) AS missing
FROM ({
            _extract(
                "checkpoint.audited",
                {
                    "path": "VARCHAR",
                    "revision": "VARCHAR",
                    "matched": "BOOLEAN",
                    "stable": "BOOLEAN",
                    "files": "JSON",
                    "missing": "JSON",
                },
            )
        })""",
    ),
    (
        "kv_declared",
        f"""
SELECT seq, run_id, block_id AS event_block, scope, target, reason
FROM ({_extract("exclusion.declared", {"scope": "VARCHAR", "target": "VARCHAR", "reason": "VARCHAR"})})""",
    ),
    # Whole blocks kept out of every count, pair and median: a cold measured request with any
    # local or external hit (namespace leak), a block that finished failed or aborted, and
    # declared exclusions (block or run scope). A block may be listed once per source.
    (
        "kv_excluded_blocks",
        """
SELECT run_id, block_id, 'block-' || finish_status AS source,
       'block ' || finish_status || coalesce(': ' || finish_error, '') AS reason, seq
FROM kv_blocks WHERE finish_status IN ('failed', 'aborted')
UNION ALL
SELECT run_id, block_id, 'namespace-leak' AS source,
       'cold request ' || request_id || ' saw ' || coalesce(local_hit_tokens, 0) || ' local and '
       || coalesce(external_hit_tokens, 0) || ' external hit tokens' AS reason, seq
FROM kv_requests
WHERE step = 'cold' AND NOT warmup AND arm IS NOT NULL
  AND (coalesce(local_hit_tokens, 0) > 0 OR coalesce(external_hit_tokens, 0) > 0)
UNION ALL
SELECT b.run_id, b.block_id, 'declared' AS source, d.reason, d.seq
FROM kv_declared d JOIN kv_blocks b
  ON (d.scope = 'block' AND b.block_id = d.target) OR (d.scope = 'run' AND b.run_id = d.target)""",
    ),
    # Measured requests of performance blocks, with whether their block (or they) are excluded.
    (
        "kv_measured",
        """
SELECT r.*,
       r.block_id IN (SELECT block_id FROM kv_excluded_blocks)
       OR r.request_id IN (SELECT target FROM kv_declared WHERE scope = 'request') AS excluded,
       row_number() OVER (PARTITION BY r.run_id, r.pair, r.arm, r.workload, r.step, r.nominal_tokens,
                          r.max_tokens, r.placement, r.chain, r.session, r."window", r.turn
                          ORDER BY r.seq) AS ordinal
FROM kv_requests r WHERE r.arm IS NOT NULL AND NOT r.warmup""",
    ),
    # ON matched to OFF: same run, block pair, workload, step, size, output length (max_tokens),
    # placement, chain/session/window, turn (and ordinal, for repeats of one key). A block pair
    # with an excluded block has no comparison: all its rows are 'excluded', including requests
    # whose partner the excluded block never sent.
    (
        "kv_pairs",
        """
WITH ons AS (SELECT * FROM kv_measured WHERE arm = 'ON'),
     offs AS (SELECT * FROM kv_measured WHERE arm = 'OFF'),
     joined AS (
SELECT coalesce(ons.run_id, offs.run_id) AS run_id, coalesce(ons.pair, offs.pair) AS pair,
       coalesce(ons.workload, offs.workload) AS workload, coalesce(ons.step, offs.step) AS step,
       coalesce(ons.chain, offs.chain) AS chain, coalesce(ons.session, offs.session) AS session,
       coalesce(ons."window", offs."window") AS "window", coalesce(ons.turn, offs.turn) AS turn,
       coalesce(ons.nominal_tokens, offs.nominal_tokens) AS nominal_tokens,
       coalesce(ons.max_tokens, offs.max_tokens) AS max_tokens,
       ons.block_id AS on_block, offs.block_id AS off_block,
       ons.request_id AS on_request, offs.request_id AS off_request,
       ons.ttft_s AS on_ttft, offs.ttft_s AS off_ttft,
       ons.decode_rate AS on_decode, offs.decode_rate AS off_decode,
       ons.payload_sha256 = offs.payload_sha256 AS payload_match, ons.gpu = offs.gpu AS gpu_match,
       coalesce(ons.excluded, false) OR coalesce(offs.excluded, false) AS side_excluded,
       CASE WHEN offs.request_id IS NULL THEN 'unpaired-on'
            WHEN ons.request_id IS NULL THEN 'unpaired-off'
            WHEN ons.payload_sha256 IS DISTINCT FROM offs.payload_sha256 THEN 'payload-mismatch'
            WHEN ons.gpu IS DISTINCT FROM offs.gpu THEN 'gpu-mismatch'
            ELSE 'matched' END AS pair_status,
       coalesce(ons.seq, offs.seq) AS seq
FROM ons FULL OUTER JOIN offs
  ON ons.run_id = offs.run_id AND ons.pair = offs.pair AND ons.workload = offs.workload
 AND ons.step = offs.step AND ons.ordinal = offs.ordinal
 AND ons.nominal_tokens IS NOT DISTINCT FROM offs.nominal_tokens
 AND ons.max_tokens IS NOT DISTINCT FROM offs.max_tokens
 AND ons.placement IS NOT DISTINCT FROM offs.placement AND ons.chain IS NOT DISTINCT FROM offs.chain
 AND ons.session IS NOT DISTINCT FROM offs.session
 AND ons."window" IS NOT DISTINCT FROM offs."window" AND ons.turn IS NOT DISTINCT FROM offs.turn),
     excluded_pairs AS (SELECT DISTINCT b.run_id, b.pair FROM kv_blocks b
                        JOIN kv_excluded_blocks x ON x.block_id = b.block_id)
SELECT j.* EXCLUDE (side_excluded, pair_status),
       j.side_excluded OR x.pair IS NOT NULL AS excluded,
       CASE WHEN j.side_excluded OR x.pair IS NOT NULL THEN 'excluded' ELSE j.pair_status END AS status
FROM joined j LEFT JOIN excluded_pairs x ON x.run_id = j.run_id AND x.pair = j.pair""",
    ),
    # Table 3's units: micro requests by locality (cold, first local reuse, cross-replica).
    (
        "kv_ttft",
        """
SELECT run_id, block_id, pair, arm, request_id, nominal_tokens, step AS locality, chain, ttft_s, seq
FROM kv_measured WHERE workload = 'micro' AND step IN ('cold', 'local1', 'cross') AND NOT excluded
  AND ttft_s IS NOT NULL""",
    ),
    (
        "kv_ttft_pairs",
        """
SELECT run_id, pair, nominal_tokens, step AS locality, chain, on_ttft, off_ttft,
       100 * (on_ttft / off_ttft - 1) AS change_pct, seq
FROM kv_pairs WHERE status = 'matched' AND workload = 'micro' AND step IN ('cold', 'local1', 'cross')
  AND on_ttft IS NOT NULL AND off_ttft > 0""",
    ),
    (
        "kv_sessions",
        f"""
SELECT s.run_id, s.block_id, b.pair, b.arm, s.session, s.placement, s.nominal_tokens, s.turns, s.wall_s,
       CAST(s.requests AS VARCHAR[]) AS requests, s.seq,
       s.block_id IN (SELECT block_id FROM kv_excluded_blocks) AS excluded
FROM ({
            _extract(
                "session.finished",
                {
                    "session": "VARCHAR",
                    "placement": "VARCHAR",
                    "nominal_tokens": "BIGINT",
                    "turns": "BIGINT",
                    "wall_s": "DOUBLE",
                    "requests": "JSON",
                },
            )
        }) s
JOIN kv_blocks b USING (block_id)""",
    ),
    (
        "kv_session_pairs",
        """
SELECT o.run_id, o.pair, o.placement, o.nominal_tokens, o.session, o.wall_s AS on_wall, f.wall_s AS off_wall,
       100 * (o.wall_s / f.wall_s - 1) AS change_pct, o.seq
FROM kv_sessions o JOIN kv_sessions f
  ON o.run_id = f.run_id AND o.pair = f.pair AND o.session = f.session AND o.placement = f.placement
 AND o.nominal_tokens IS NOT DISTINCT FROM f.nominal_tokens
WHERE o.arm = 'ON' AND f.arm = 'OFF' AND NOT o.excluded AND NOT f.excluded AND o.wall_s IS NOT NULL
  AND f.wall_s > 0""",
    ),
    (
        "kv_decode_pairs",
        """
SELECT run_id, pair, nominal_tokens, step, max_tokens, chain, on_decode, off_decode,
       100 * (on_decode / off_decode - 1) AS change_pct, seq
FROM kv_pairs WHERE status = 'matched' AND workload = 'generation' AND on_decode IS NOT NULL
  AND off_decode > 0""",
    ),
    (
        "kv_windows",
        f"""
SELECT w.run_id, w.block_id, b.pair, b.arm, w."window", w.placement, w.sessions, w.requests, w.output_tokens,
       w.wall_s, w.output_tokens / nullif(w.wall_s, 0) AS tokens_per_s, w.seq,
       w.block_id IN (SELECT block_id FROM kv_excluded_blocks) AS excluded
FROM ({
            _extract(
                "window.finished",
                {
                    "window": "VARCHAR",
                    "placement": "VARCHAR",
                    "sessions": "BIGINT",
                    "requests": "BIGINT",
                    "output_tokens": "BIGINT",
                    "wall_s": "DOUBLE",
                },
            )
        }) w
JOIN kv_blocks b USING (block_id)""",
    ),
    (
        "kv_window_pairs",
        """
SELECT o.run_id, o.pair, o.placement, o.sessions, o."window", o.tokens_per_s AS on_tps,
       f.tokens_per_s AS off_tps, 100 * (o.tokens_per_s / f.tokens_per_s - 1) AS change_pct, o.seq
FROM kv_windows o JOIN kv_windows f
  ON o.run_id = f.run_id AND o.pair = f.pair AND o."window" = f."window" AND o.placement = f.placement
 AND o.sessions = f.sessions
WHERE o.arm = 'ON' AND f.arm = 'OFF' AND NOT o.excluded AND NOT f.excluded AND o.tokens_per_s IS NOT NULL
  AND f.tokens_per_s > 0""",
    ),
    # The service regression: validation runs by the ON config digest they validate.
    (
        "kv_validation",
        """
SELECT r.run_id, r.validated_config AS config_sha256, r.finish_status, r.seq,
       count(a.seq) AS assertions, count(a.seq) FILTER (WHERE a.passed) AS passed,
       r.finish_status = 'completed' AND count(a.seq) > 0 AND bool_and(coalesce(a.passed, false)) AS ok
FROM kv_runs r LEFT JOIN kv_assertions a USING (run_id)
WHERE r.experiment = 'validation'
GROUP BY r.run_id, r.validated_config, r.finish_status, r.seq""",
    ),
    (
        "kv_probe_copy",
        f"""
SELECT run_id, method, direction, delay_cycles > 0 AS delayed, count(*) AS checks,
       count(*) FILTER (WHERE passed) AS passed, min(seq) AS seq
FROM ({
            _extract(
                "probe.copy",
                {"method": "VARCHAR", "direction": "VARCHAR", "delay_cycles": "BIGINT", "passed": "BOOLEAN"},
            )
        })
GROUP BY run_id, method, direction, delay_cycles > 0""",
    ),
    (
        "kv_probe_pinned",
        f"""
SELECT run_id, seq, bytes_requested, is_pinned, seconds, alloc_conf, rounded_up, error
FROM ({
            _extract(
                "probe.pinned_alloc",
                {
                    "bytes_requested": "BIGINT",
                    "is_pinned": "BOOLEAN",
                    "seconds": "DOUBLE",
                    "alloc_conf": "VARCHAR",
                    "rounded_up": "BOOLEAN",
                    "error": "VARCHAR",
                },
            )
        })""",
    ),
    # Performance configs: the ON blocks' deployment config digests and transfer paths.
    (
        "kv_on_configs",
        """
SELECT DISTINCT b.run_id, l.config_sha256, coalesce(l.transfer_path, 'unknown') AS transfer_path
FROM kv_blocks b JOIN kv_launches l ON l.block_id = b.block_id WHERE b.arm = 'ON'""",
    ),
]

ORDERED_METHODS = ("wait_then_fallback", "memcpy_async_current_stream", "same_stream_tensor_copy")


def create_views(con: duckdb.DuckDBPyConnection, until_seq: int | None = None) -> None:
    """Materialise every view as a TEMP table on ``con`` (in-memory DuckDB; the ledger is untouched).

    Tables, not views: each report and audit query would otherwise re-parse
    every event's JSON; materialised once, the whole report is a few scans.
    """
    # As of one event: attestation checks re-derive at the attested head.
    bound = "" if until_seq is None else f" WHERE seq <= {int(until_seq)}"
    for name in EXTRACTIONS:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {_source_name(name)}{bound}")
    for name, sql in VIEWS:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS {sql.strip()}")


def with_clause(query: str) -> str:
    """``query`` prefixed by every extraction and view as a CTE: pasteable into ``ledger sql``."""
    ctes = ",\n".join(f"{name} AS ({sql.strip()})" for name, sql in [*EXTRACTIONS.items(), *VIEWS])
    return f"WITH {ctes}\n{query}"


# Queries an analyst pastes (after ``with_clause``) to get the report's numbers by hand.
EXAMPLES: list[tuple[str, str]] = [
    ("Table 3 medians (TTFT by size × locality × arm)",
     "SELECT run_id, nominal_tokens, locality, arm, median(ttft_s) AS median_ttft_s, count(*) AS n\n"
     "FROM kv_ttft GROUP BY ALL ORDER BY ALL"),
    ("Table 3 paired change (mean of 100 × (ON/OFF − 1) over matched chains)",
     "SELECT run_id, nominal_tokens, locality, avg(change_pct) AS mean_change_pct, count(*) AS units,\n"
     "       count(DISTINCT pair) AS block_pairs\nFROM kv_ttft_pairs GROUP BY ALL ORDER BY ALL"),
    ("Table 4 (session wall time by size × routing, paired change)",
     "SELECT run_id, nominal_tokens, placement, median(on_wall) AS on_median,\n"
     "       median(off_wall) AS off_median, avg(change_pct) AS mean_change_pct, count(*) AS units\n"
     "FROM kv_session_pairs GROUP BY ALL ORDER BY ALL"),
    ("Decode rate, forced-length generation",
     "SELECT run_id, nominal_tokens, step, max_tokens, avg(change_pct) AS mean_change_pct,\n"
     "       count(*) AS units\n"
     "FROM kv_decode_pairs GROUP BY ALL ORDER BY ALL"),
    ("Concurrency windows, output tokens/s",
     "SELECT run_id, sessions, placement, avg(change_pct) AS mean_change_pct, count(*) AS units\n"
     "FROM kv_window_pairs GROUP BY ALL ORDER BY ALL"),
    ("Accounting: measured requests and pairs",
     "SELECT (SELECT count(*) FROM kv_measured WHERE NOT excluded) AS measured,\n"
     "       (SELECT count(*) FROM kv_pairs WHERE status IN ('matched', 'payload-mismatch', 'gpu-mismatch'))"
     " AS pairs,\n"
     "       (SELECT count(*) FROM kv_pairs WHERE status = 'matched') AS matched_pairs"),
    ("Everything not cleanly paired (never dropped silently)",
     "SELECT status, run_id, pair, workload, step, chain, session, \"window\", turn,\n"
     "       on_request, off_request\n"
     "FROM kv_pairs WHERE status <> 'matched' ORDER BY seq"),
    ("Excluded blocks and why",
     "SELECT run_id, block_id, source, reason FROM kv_excluded_blocks ORDER BY seq"),
]


def views_markdown() -> str:
    """reports/VIEWS.md, generated so it never drifts from the SQL the report runs."""
    lines = [
        "# Report views (generated by `python -m reports.docs`; do not edit)",
        "",
        "Every number in `ledger report` comes from these views. `ledger report` materialises them as",
        "temporary tables in an in-memory DuckDB over the ledger's Parquet snapshot (nothing is written",
        "to the ledger). To get the same numbers by hand, put every view below in front of a query as a",
        "`WITH` block and run it with `ledger sql` (`reports._views.with_clause(query)` builds that text;",
        "see the last section). Medians and means",
        "here are computed by DuckDB; the report computes them in Python from the same rows with exact",
        "summation and rounds to 6 decimals, so the two agree to that precision.",
        "",
        "Pairing key: run, block pair, workload, step, nominal size, output length (`max_tokens`),",
        "placement, chain / session / window, turn, and an ordinal for repeats of one key. Session and",
        "window labels must be the same in both arms (they name positions in the plan, not blocks).",
        "Payload and GPU are compared after matching:",
        "a difference is `payload-mismatch` / `gpu-mismatch`, never a silent drop.",
        "",
        "## Example queries",
        "",
    ]
    for title, query in EXAMPLES:
        lines += [f"### {title}", "", "```sql", query, "```", ""]
    lines += ["## Extractions", "",
              "Each kind the views read, with typed data fields. `ledger report` keeps them as projections",
              "next to the snapshot's segments (each event's JSON is parsed once); in `ledger sql` they are",
              "plain CTEs over `events`.", ""]
    for name, sql in EXTRACTIONS.items():
        lines += [f"### `{name}`", "", "```sql", sql, "```", ""]
    lines += ["## The views", ""]
    for name, sql in VIEWS:
        lines += [f"### `{name}`", "", "```sql", sql.strip(), "```", ""]
    lines += ["## Pasteable prefix", "",
              "`ledger sql \"$(python -c 'from reports._views import with_clause; "
              "print(with_clause(\\\"SELECT * FROM kv_ttft_pairs\\\"))')\"`", ""]
    return "\n".join(lines)
