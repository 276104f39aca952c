"""The SQL views behind every report table and audit check.

Each view reads the extractions (one per kind: rows of the ledger's
``events`` with explicit field types, so it works whatever kinds a ledger
happens to hold) or earlier views here. A report reads the extractions as
projections kept beside the snapshot's segments, so the JSON of an event is
parsed once; :func:`with_clause` renders extractions and views as one
``WITH`` so the same SQL can be pasted into ``ledger sql``; reports/VIEWS.md is
generated from :data:`EXTRACTIONS` and :data:`VIEWS`. Views are materialised as
tables in an in-memory DuckDB: nothing is written to the ledger.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Collection
from typing import Any

import duckdb
import pyarrow as pa

from ledger import view_name
from ledger._snapshot import arrow_read_as, relation_read_as
from ledger._typed import entries_sql

# Each kind the views read, as rows with typed data fields: ``kv_x_<kind>`` → SQL over
# ``events``. A report reads them as projections kept per snapshot segment (see
# ledger.Analytics), so each event's JSON is parsed once, when its segment is written.
EXTRACTIONS: dict[str, str] = {}


def _extract(kind: str, fields: dict[str, Any]) -> str:
    """Rows of one kind with typed data fields (one JSON parse per row, done by the projection)."""
    name = "kv_x_" + view_name(kind)
    structure = json.dumps(fields, separators=(",", ":"))
    sql = (
        f"SELECT seq, run_id, block_id, unnest(json_transform(data, '{structure}')) "
        f"FROM events WHERE kind = '{kind}'"
    )
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
    "probe": "VARCHAR",
    "payload_sha256": "VARCHAR",
    "namespace": "VARCHAR",
    "nominal_tokens": "BIGINT",
    "params": {"max_tokens": "BIGINT"},
    "fixture_id": "VARCHAR",
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
    "cached_tokens": "BIGINT",
    "text_sha256": "VARCHAR",
    "output_text_prefix": "VARCHAR",
    "ttft_method": "VARCHAR",
}
_HITS_FIELDS = {
    "request_id": "VARCHAR",
    "window": "VARCHAR",
    "replica": "VARCHAR",
    "prefix_queries": "BIGINT",
    "local_hit_tokens": "BIGINT",
    "external_hit_tokens": "BIGINT",
    "prompt_tokens": "BIGINT",
    "counter_reset": "BOOLEAN",
    "lmcache_requested_tokens": "BIGINT",
    "lmcache_hit_tokens": "BIGINT",
}

_BLOCK_STARTED_FIELDS = {
    "index": "BIGINT",
    "arm": "VARCHAR",
    "pair": "BIGINT",
    "order": "JSON",
    "gpu_swap": "BOOLEAN",
    "config_sha256": "VARCHAR",
    "restarted": "BOOLEAN",
}
_BLOCK_FINISHED_FIELDS = {"status": "VARCHAR", "error": "VARCHAR"}

# (name, SQL) in dependency order. Names are prefixed kv_ so they never shadow ledger views.
VIEWS: list[tuple[str, str]] = [
    (
        "kv_runs",
        f"""
SELECT r.run_id, r.seq, r.experiment, r.params->>'target' AS target,
       r.params->>'config_sha256' AS validated_config,
       coalesce(r.code->>'commit', r.code->>'git_commit') AS code_commit,
       r.packages, f.status AS finish_status, r.seed, coalesce(r.registers_plan, false) AS registers_plan,
       r.replay_of, coalesce(r.params->>'asked_lines', 'spot') AS asked_lines, r.host->>'cpu' AS host_cpu
FROM ({
            _extract(
                "run.started",
                {
                    "experiment": "VARCHAR",
                    "params": "JSON",
                    "code": "JSON",
                    "packages": "JSON",
                    "seed": "BIGINT",
                    "registers_plan": "BOOLEAN",
                    "replay_of": "VARCHAR",
                    "host": "JSON",
                },
            )
        }) r
LEFT JOIN (SELECT run_id, arg_max(status, seq) AS status
           FROM ({_extract("run.finished", {"status": "VARCHAR"})}) GROUP BY run_id) f USING (run_id)""",
    ),
    (
        "kv_blocks",
        f"""
SELECT b.run_id, b.block_id, b.seq, b."index" AS position, b.arm, b.pair, b."order", b.gpu_swap,
       b.config_sha256, b.restarted, f.status AS finish_status, f.error AS finish_error,
       -- An ON/OFF comparison by design: the recorded plan (order) holds both arms. needle_eval's
       -- single OFF block is not one, so its requests are never paired nor its order judged.
       b."order" IS NULL OR (json_contains(b."order", '"ON"') AND json_contains(b."order", '"OFF"'))
       AS paired
FROM ({_extract("block.started", _BLOCK_STARTED_FIELDS)}) b
LEFT JOIN (SELECT block_id, arg_max(status, seq) AS status, arg_max(error, seq) AS error
           FROM ({_extract("block.finished", _BLOCK_FINISHED_FIELDS)}) GROUP BY block_id) f USING (block_id)
-- Validation runs deploy an ON block too, but they are the service regression, not a comparison.
WHERE b.run_id NOT IN (SELECT run_id FROM kv_runs WHERE experiment = 'validation')""",
    ),
    # Each run's registered plan (plan.registered), what the audit holds the run to.
    (
        "kv_plans",
        f"""
SELECT seq, run_id, experiment, seed, "order", order_rule, requests_per_block, warmups_per_block, sizes,
       thresholds, plan_sha256
FROM ({
            _extract(
                "plan.registered",
                {
                    "experiment": "VARCHAR",
                    "seed": "BIGINT",
                    "order": "JSON",
                    "order_rule": "VARCHAR",
                    "requests_per_block": "JSON",
                    "warmups_per_block": "BIGINT",
                    "sizes": "JSON",
                    "thresholds": "JSON",
                    "plan_sha256": "VARCHAR",
                },
            )
        })""",
    ),
    # Each block's starting cache state (cache.inspected): prefix-cache reset, KV usage, and what the
    # shared tier held (stored objects, resident bytes: each where its service exposes it).
    (
        "kv_block_states",
        f"""
SELECT s.seq, s.run_id, s.block_id, b.position, b.arm, s.reset_ok, s.kv_cache_usage, s.lmcache_stored_objects,
       s.lmcache_metric, s.lmcache_stored_bytes, s.lmcache_bytes_metric,
       json_array_length(s.replicas) AS replicas
FROM ({
            _extract(
                "cache.inspected",
                {
                    "replicas": "JSON",
                    "reset_ok": "BOOLEAN",
                    "kv_cache_usage": "DOUBLE",
                    "lmcache_stored_objects": "BIGINT",
                    "lmcache_metric": "VARCHAR",
                    "lmcache_stored_bytes": "BIGINT",
                    "lmcache_bytes_metric": "VARCHAR",
                },
            )
        }) s
LEFT JOIN kv_blocks b USING (block_id)""",
    ),
    # Every block of every run (validation's too), as it ran: compared with the registered plan.
    (
        "kv_run_blocks",
        f"""
SELECT b.run_id, b.block_id, b.seq, b."index" AS position, b.arm, f.status AS finish_status
FROM ({_extract("block.started", _BLOCK_STARTED_FIELDS)}) b
LEFT JOIN (SELECT block_id, arg_max(status, seq) AS status
           FROM ({_extract("block.finished", _BLOCK_FINISHED_FIELDS)}) GROUP BY block_id) f
  USING (block_id)""",
    ),
    (
        "kv_launches",
        f"""
SELECT run_id, block_id, seq, replica, config_sha256, transfer_path, target, model->>'revision' AS revision,
       arm, hash_seed, engine_version,
       -- The device the engine ran on: the GPU's model as the replica's process saw it, else the
       -- engine's device (cpu; the sim target names itself).
       coalesce(gpu->>'name', device) AS device_model,
       -- The LMCache a launch names: the vllm target's lmcache object, or flat fields.
       coalesce(lmcache_version, json_extract_string(lmcache, '$.version')) AS lmcache_version,
       coalesce(lmcache_allocator, json_extract_string(lmcache, '$.allocator.in_use')) AS lmcache_allocator,
       coalesce(lmcache_ops, TRY_CAST(json_extract_string(lmcache, '$.ops') AS BOOLEAN)) AS lmcache_ops,
       -- The device cache vllm:cache_config_info describes: GPU blocks × block size, tokens.
       TRY_CAST(cache_config->>'num_gpu_blocks' AS BIGINT) * TRY_CAST(cache_config->>'block_size' AS BIGINT)
       AS device_cache_tokens
FROM ({
            _extract(
                "deployment.launched",
                {
                    "replica": "VARCHAR",
                    "config_sha256": "VARCHAR",
                    "engine_version": "VARCHAR",
                    "transfer_path": "VARCHAR",
                    "target": "VARCHAR",
                    "model": "JSON",
                    "arm": "VARCHAR",
                    "hash_seed": "VARCHAR",
                    "lmcache_version": "VARCHAR",
                    "lmcache_allocator": "VARCHAR",
                    "lmcache_ops": "BOOLEAN",
                    "lmcache": "JSON",
                    "cache_config": "JSON",
                    "gpu": "JSON",
                    "device": "VARCHAR",
                },
            )
        })""",
    ),
    # The hardware each run's blocks ran on: the distinct device models of its launches, a CPU
    # engine's qualified by the host's CPU (kv_series pools replays only on equal hardware).
    (
        "kv_run_hardware",
        """
SELECT run_id, list(DISTINCT device ORDER BY device) FILTER (WHERE device IS NOT NULL) AS hardware
FROM (SELECT l.run_id,
             CASE WHEN l.device_model = 'cpu' THEN 'cpu: ' || coalesce(k.host_cpu, 'unrecorded')
                  ELSE l.device_model END AS device
      FROM kv_launches l JOIN kv_runs k USING (run_id) WHERE l.block_id IS NOT NULL)
GROUP BY run_id""",
    ),
    # What a replay must share with the run it replays to be pooled with it (kv_series), each run's:
    # its registered plan, the config it validated, the hardware its blocks ran on.
    (
        "kv_pooling_keys",
        """
SELECT k.run_id, k.seq, k.replay_of, k.validated_config AS config, p.plan, h.hardware
FROM kv_runs k LEFT JOIN (SELECT run_id, min(plan_sha256) AS plan FROM kv_plans GROUP BY run_id) p
USING (run_id) LEFT JOIN kv_run_hardware h USING (run_id)""",
    ),
    # Each replay beside the run it replays: which of the pooling keys they share (kv_series pools
    # them only where all three are; the report names a replay left out, and why).
    (
        "kv_replay_links",
        """
SELECT c.run_id, c.replay_of, c.seq,
       coalesce(c.plan = o.plan, false) AS same_plan,
       c.config IS NOT DISTINCT FROM o.config AS same_config,
       c.hardware IS NOT DISTINCT FROM o.hardware AS same_hardware,
       c.hardware, o.hardware AS original_hardware
FROM kv_pooling_keys c JOIN kv_pooling_keys o ON o.run_id = c.replay_of""",
    ),
    # Each run's series: a replay (run.started.replay_of) joins the series of the run it replayed when
    # both registered the same plan and validated the same config (the same requests against the
    # same configuration); any other run is a series of its own. ``unit`` numbers the series' block
    # pairs (run by run in the order they started, then pair), so that the pairs of a run and its
    # replays can be counted as one sample of block pairs (reports/_derive.py ttft_series_table,
    # `ledger report --pool-replays`). A replay pools with its original only on the same hardware:
    # the device models its blocks' replicas ran on (a CPU engine's by the host's CPU), since a
    # sample of pairs from two kinds of GPU estimates neither.
    (
        "kv_series",
        """
WITH RECURSIVE r AS (SELECT run_id, seq FROM kv_runs),
up(run_id, series, depth) AS (
    SELECT run_id, run_id, 0 FROM r
    UNION ALL
    SELECT u.run_id, l.replay_of, u.depth + 1
    FROM up u JOIN kv_replay_links l ON l.run_id = u.series
    WHERE l.same_plan AND l.same_config AND l.same_hardware AND u.depth < 64),
series AS (SELECT run_id, arg_max(series, depth) AS series FROM up GROUP BY run_id),
pairs AS (SELECT DISTINCT b.run_id, b.pair FROM kv_blocks b WHERE b.pair IS NOT NULL)
SELECT s.run_id, s.series, p.pair,
       CAST(dense_rank() OVER (PARTITION BY s.series ORDER BY r.seq, p.pair) - 1 AS BIGINT) AS unit
FROM series s JOIN r USING (run_id) LEFT JOIN pairs p USING (run_id)""",
    ),
    # Every hits.observed (single-request and window-level) with its block's arm (parsed once).
    (
        "kv_hits",
        f"""
SELECT h.seq, h.run_id, h.block_id, b.arm, h.request_id, h."window", h.replica, h.prefix_queries,
       h.local_hit_tokens, h.external_hit_tokens, h.prompt_tokens, h.counter_reset,
       h.lmcache_requested_tokens, h.lmcache_hit_tokens
FROM ({_extract("hits.observed", _HITS_FIELDS)}) h LEFT JOIN kv_blocks b USING (block_id)""",
    ),
    # Each request with its first response and first single-request hits (by seq). prompt_tokens
    # is the response's own count (the hits record's copy only when the response has none).
    (
        "kv_requests",
        f"""
SELECT q.seq, q.run_id, q.block_id, b.arm, b.pair, q.request_id, q.replica, CAST(q.gpu AS VARCHAR) AS gpu,
       q.workload, q.step, q.chain, q.session, q."window", q.turn, q.placement, q.warmup, q.probe,
       q.payload_sha256, q.namespace, q.nominal_tokens, q.params.max_tokens AS max_tokens, q.fixture_id,
       r.status, r.error, r.ttft_s, r.ttft_method, r.t_first, r.t_last, r.e2e_s, r.output_tokens,
       r.cached_tokens, r.text_sha256,
       coalesce(r.decode_rate, (r.output_tokens - 1) / nullif(r.t_last - r.t_first, 0)) AS decode_rate,
       coalesce(r.prompt_tokens, h.prompt_tokens) AS prompt_tokens,
       h.request_id IS NOT NULL AS has_hits, h.prefix_queries, h.local_hit_tokens, h.external_hit_tokens,
       h.counter_reset
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
       CAST(a.expected AS VARCHAR) AS expected, CAST(a.observed AS VARCHAR) AS observed,
       a."window", a.replica, a.chunk_size, a.reference_request_id
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
                    "window": "VARCHAR",
                    "replica": "VARCHAR",
                    "chunk_size": "BIGINT",
                    "reference_request_id": "VARCHAR",
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
    # local or external hit, or cached tokens in its response (namespace leak), a block that
    # finished failed or aborted, and declared exclusions (block or run scope). A block may be
    # listed once per source.
    (
        "kv_excluded_blocks",
        """
SELECT run_id, block_id, 'block-' || finish_status AS source,
       'block ' || finish_status || coalesce(': ' || finish_error, '') AS reason, seq
FROM kv_blocks WHERE finish_status IN ('failed', 'aborted')
UNION ALL
SELECT run_id, block_id, 'namespace-leak' AS source,
       'cold request ' || request_id || ' saw ' || coalesce(local_hit_tokens, 0) || ' local and '
       || coalesce(external_hit_tokens, 0) || ' external hit tokens'
       || coalesce(' (' || cached_tokens || ' cached tokens in its response)', '') AS reason, seq
FROM kv_requests
WHERE step = 'cold' AND NOT warmup AND arm IS NOT NULL
  AND (coalesce(local_hit_tokens, 0) > 0 OR coalesce(external_hit_tokens, 0) > 0
       OR coalesce(cached_tokens, 0) > 0)
UNION ALL
SELECT b.run_id, b.block_id, 'declared' AS source, d.reason, d.seq
FROM kv_declared d JOIN kv_blocks b
  ON (d.scope = 'block' AND b.block_id = d.target) OR (d.scope = 'run' AND b.run_id = d.target)""",
    ),
    # The ordinal of each measured request whose key repeats (the key's repeats numbered in seq
    # order; every other request's is 1, see kv_measured). Keys are nearly always unique, so the
    # window runs over the rows of repeated keys only (narrow), found by grouping one hash of the
    # twelve key columns: every repeated key's rows, and maybe a few unique keys' (a hash
    # collision), which the window numbers 1 as it partitions by the key itself.
    (
        "kv_measured_ordinals",
        """
WITH k AS (SELECT seq, hash(run_id, pair, arm, workload, step, nominal_tokens, max_tokens, placement, chain,
                           session, "window", turn) AS key_hash
           FROM kv_requests WHERE arm IS NOT NULL AND NOT warmup AND probe IS NULL)
SELECT seq, row_number() OVER (PARTITION BY run_id, pair, arm, workload, step, nominal_tokens, max_tokens,
                               placement, chain, session, "window", turn ORDER BY seq) AS ordinal
FROM kv_requests
WHERE seq IN (SELECT seq FROM k
              WHERE key_hash IN (SELECT key_hash FROM k GROUP BY key_hash HAVING count(*) > 1))""",
    ),
    # Measured requests of performance blocks, with whether their block (or they) are excluded.
    # Probes (the isolation certificate's and divergence triage's requests) are never measured.
    # Not materialised (see create_views): a copy of nearly every row of kv_requests, each reader
    # of which reads a few of its columns.
    (
        "kv_measured",
        """
SELECT r.*,
       r.block_id IN (SELECT block_id FROM kv_excluded_blocks)
       OR r.request_id IN (SELECT target FROM kv_declared WHERE scope = 'request') AS excluded,
       coalesce(o.ordinal, 1) AS ordinal
FROM kv_requests r LEFT JOIN kv_measured_ordinals o ON o.seq = r.seq
WHERE r.arm IS NOT NULL AND NOT r.warmup AND r.probe IS NULL""",
    ),
    # ON matched to OFF: same run, block pair, workload, step, size, output length (max_tokens),
    # placement, chain/session/window, turn (and ordinal, for repeats of one key). A block pair
    # with an excluded block has no comparison: all its rows are 'excluded', including requests
    # whose partner the excluded block never sent.
    (
        "kv_pairs",
        """
WITH paired_blocks AS (SELECT block_id FROM kv_blocks WHERE paired),
     -- Each side reads the measured rows' columns it joins on and reports, no more (a CTE of all
     -- forty columns, read by both sides, was materialised whole).
     ons AS (SELECT seq, run_id, pair, workload, step, chain, session, "window", turn, nominal_tokens,
                    max_tokens, placement, ordinal, block_id, request_id, ttft_s, decode_rate,
                    payload_sha256, gpu, excluded
             FROM kv_measured WHERE arm = 'ON' AND block_id IN (SELECT block_id FROM paired_blocks)),
     offs AS (SELECT seq, run_id, pair, workload, step, chain, session, "window", turn, nominal_tokens,
                     max_tokens, placement, ordinal, block_id, request_id, ttft_s, decode_rate,
                     payload_sha256, gpu, excluded
              FROM kv_measured WHERE arm = 'OFF' AND block_id IN (SELECT block_id FROM paired_blocks)),
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
SELECT run_id, block_id, pair, arm, request_id, nominal_tokens, step AS locality, chain, ttft_s,
       ttft_method, seq
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
    # Isolation certificates: one per ON config and run (the runner's, before it measures), with
    # the probes it names (the audit re-derives each from their observations) and the tiers it
    # recorded of each.
    (
        "kv_isolation",
        f"""
SELECT seq, run_id, block_id, config_sha256, passed, CAST(problems AS VARCHAR) AS problems,
       repeat_hit_tokens, other_salt_hit_tokens, prime_request_id, repeat_request_id,
       CAST("repeat" AS VARCHAR) AS "repeat", CAST(other_salt AS VARCHAR) AS other_salt
FROM ({
            _extract(
                "isolation.certified",
                {
                    "config_sha256": "VARCHAR",
                    "passed": "BOOLEAN",
                    "problems": "JSON",
                    "repeat_hit_tokens": "BIGINT",
                    "other_salt_hit_tokens": "BIGINT",
                    "prime_request_id": "VARCHAR",
                    "repeat_request_id": "VARCHAR",
                    "repeat": "JSON",
                    "other_salt": "JSON",
                },
            )
        })""",
    ),
    # Triaged divergences, classified again from the re-sends' recorded text digests and the
    # recorded margin: state-corruption when the re-sends agree with each other and not with the
    # divergent answer; numeric-tie when the margin is under tie_margin and cold answers disagree
    # (the re-sends, or the forced cold and the cold reference); else inconclusive.
    (
        "kv_divergences",
        f"""
WITH t AS ({
            _extract(
                "divergence.triaged",
                {
                    "request_id": "VARCHAR",
                    "trigger": "VARCHAR",
                    "reference_request_id": "VARCHAR",
                    "cold_request_id": "VARCHAR",
                    "repeat_request_id": "VARCHAR",
                    "first_divergent_token": "BIGINT",
                    "margin": "DOUBLE",
                    "tie_margin": "DOUBLE",
                    "classification": "VARCHAR",
                },
            )
        }),
     r AS (SELECT request_id, text_sha256, status = 200 AND error IS NULL AS ok FROM kv_requests),
     j AS (
SELECT t.*, coalesce(c.ok AND p.ok, false) AS resends_ok, c.text_sha256 = p.text_sha256 AS resends_agree,
       c.text_sha256 = d.text_sha256 AS resends_match_divergent,
       c.text_sha256 IS DISTINCT FROM p.text_sha256
       OR (t.reference_request_id IS NOT NULL AND c.text_sha256 IS DISTINCT FROM f.text_sha256)
       AS cold_disagree
FROM t LEFT JOIN r d ON d.request_id = t.request_id
LEFT JOIN r c ON c.request_id = t.cold_request_id
LEFT JOIN r p ON p.request_id = t.repeat_request_id
LEFT JOIN r f ON f.request_id = t.reference_request_id)
SELECT j.seq, j.run_id, j.block_id, j.request_id, j.trigger, j.reference_request_id, j.cold_request_id,
       j.repeat_request_id, j.first_divergent_token, j.margin, j.tie_margin, j.resends_ok,
       coalesce(j.resends_agree, false) AS resends_agree,
       coalesce(j.resends_match_divergent, false) AS resends_match_divergent,
       j.classification AS recorded_class,
       CASE WHEN NOT j.resends_ok THEN 'inconclusive'
            WHEN j.resends_agree AND NOT j.resends_match_divergent THEN 'state-corruption'
            WHEN j.margin < j.tie_margin AND j.cold_disagree THEN 'numeric-tie'
            ELSE 'inconclusive' END AS derived_class
FROM j""",
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
       -- A check passes on its observation (no byte differed), its recorded verdict only
       -- cross-checked: one that says passed over mismatching bytes is counted failed.
       count(*) FILTER (WHERE passed AND mismatching_bytes = 0) AS passed, min(seq) AS seq
FROM ({
            _extract(
                "probe.copy",
                {
                    "method": "VARCHAR",
                    "direction": "VARCHAR",
                    "delay_cycles": "BIGINT",
                    "mismatching_bytes": "BIGINT",
                    "passed": "BOOLEAN",
                },
            )
        })
GROUP BY run_id, method, direction, delay_cycles > 0""",
    ),
    (
        "kv_probe_pinned",
        f"""
SELECT run_id, seq, bytes_requested, bytes_reserved, is_pinned, seconds, alloc_conf, rounded_up, error,
       failed_at
FROM ({
            _extract(
                "probe.pinned_alloc",
                {
                    "bytes_requested": "BIGINT",
                    "bytes_reserved": "BIGINT",
                    "is_pinned": "BOOLEAN",
                    "seconds": "DOUBLE",
                    "alloc_conf": "VARCHAR",
                    "rounded_up": "BOOLEAN",
                    "error": "VARCHAR",
                    "failed_at": "VARCHAR",
                },
            )
        })""",
    ),
    # LMCache helper checks (probe.helper), one row per path cell: a check that raised is
    # errored, neither passed nor failed.
    (
        "kv_probe_helper",
        f"""
SELECT run_id, lmcache_version, allocator, with_ops, copy, transfer_path, direction,
       delay_cycles > 0 AS delayed, bytes, count(*) AS checks,
       -- A check passes on its observations (no byte differed, none landed bad, no error), its
       -- recorded verdict only cross-checked: one that says passed over bad bytes is failed.
       count(*) FILTER (WHERE ok) AS passed,
       count(*) FILTER (WHERE NOT ok AND error IS NULL) AS failed,
       count(*) FILTER (WHERE error IS NOT NULL) AS errored,
       min(first_bad_offset) AS first_bad_offset, max(mismatching_bytes) AS max_mismatching_bytes,
       list(DISTINCT gpu->>'uuid' ORDER BY gpu->>'uuid') FILTER (WHERE gpu->>'uuid' IS NOT NULL) AS gpus,
       min(seq) AS seq
FROM (SELECT *, coalesce(passed AND error IS NULL AND mismatching_bytes = 0
                          AND coalesce(copy_landed_bad_bytes, 0) = 0, false) AS ok
      FROM ({
            _extract(
                "probe.helper",
                {
                    "allocator": "VARCHAR",
                    "copy": "VARCHAR",
                    "with_ops": "BOOLEAN",
                    "direction": "VARCHAR",
                    "bytes": "BIGINT",
                    "delay_cycles": "BIGINT",
                    "passed": "BOOLEAN",
                    "mismatching_bytes": "BIGINT",
                    "first_bad_offset": "BIGINT",
                    "copy_landed_bad_bytes": "BIGINT",
                    "error": "VARCHAR",
                    "transfer_path": "VARCHAR",
                    "lmcache_version": "VARCHAR",
                    "gpu": "JSON",
                },
            )
        }))
GROUP BY ALL""",
    ),
    # LMCache's local CPU pool (probe.pinned), one row per size and setting.
    (
        "kv_probe_pool",
        f"""
SELECT run_id, seq, lmcache_version, with_ops, transfer_path, CAST(setting AS VARCHAR) AS setting,
       bytes_requested, bytes_reserved, is_pinned, seconds, alloc_conf, error, failed_at
FROM ({
            _extract(
                "probe.pinned",
                {
                    "setting": "JSON",
                    "bytes_requested": "BIGINT",
                    "bytes_reserved": "BIGINT",
                    "is_pinned": "BOOLEAN",
                    "seconds": "DOUBLE",
                    "alloc_conf": "VARCHAR",
                    "with_ops": "BOOLEAN",
                    "error": "VARCHAR",
                    "failed_at": "VARCHAR",
                    "transfer_path": "VARCHAR",
                    "lmcache_version": "VARCHAR",
                },
            )
        })""",
    ),
    # Performance configs: the ON blocks' deployment config digests, transfer paths and the LMCache
    # (version, allocator, compiled ops) their launches name; GPU probes cover a config by these.
    (
        "kv_on_configs",
        """
SELECT DISTINCT b.run_id, l.config_sha256, coalesce(l.transfer_path, 'unknown') AS transfer_path,
       l.lmcache_version, l.lmcache_allocator, l.lmcache_ops
FROM kv_blocks b JOIN kv_launches l ON l.block_id = b.block_id WHERE b.arm = 'ON'""",
    ),
    # Other tools' result files (ledger import --from TOOL), one row per file: its provenance and
    # what its requests recorded; the audit reads what such results lack from here.
    (
        "kv_imports",
        f"""
SELECT i.seq, i.run_id, i.tool, i.tool_version, i.file_name, i.file_sha256, i.requests,
       count(q.request_index) AS recorded_requests, count(q.ttft_s) AS with_ttft,
       count(q.cached_tokens) AS with_cached_tokens, count(q.error) AS errors
FROM ({
            _extract(
                "import.recorded",
                {
                    "tool": "VARCHAR",
                    "tool_version": "VARCHAR",
                    "file_name": "VARCHAR",
                    "file_sha256": "VARCHAR",
                    "requests": "BIGINT",
                },
            )
        }) i
LEFT JOIN (SELECT run_id, "index" AS request_index, ttft_s, cached_tokens, error
           FROM ({
            _extract(
                "import.request",
                {"index": "BIGINT", "ttft_s": "DOUBLE", "cached_tokens": "BIGINT", "error": "VARCHAR"},
            )
        })) q USING (run_id)
GROUP BY ALL""",
    ),
]

# The counters behind hit deltas (collectors/_metrics.py's names): a window's delta is summed
# over each counter's label sets; a series that went down restarted and counts its after value.
COUNTERS: dict[str, str] = {
    "prefix_queries": "vllm:prefix_cache_queries_total",
    "local_hit_tokens": "vllm:prefix_cache_hits_total",
    "external_queries": "vllm:external_prefix_cache_queries_total",
    "external_hit_tokens": "vllm:external_prefix_cache_hits_total",
    "lmcache_requested_tokens": "lmcache_mp_lookup_requested_tokens_total",
    "lmcache_hit_tokens": "lmcache_mp_lookup_hit_tokens_total",
}


def _counter_samples() -> str:
    """The hit-counter samples of every scrape, one row per series (the rest of a scrape is
    not read): ``kv_x_counter_samples``, kept as a projection like the other extractions."""
    # One row per sample of a counter (ledger/_typed.py entries_sql): the scrape (seq), the counter
    # (name), the series' labels past the metric's name (series: '' for none) and the value. The
    # native read fills it as it reads the scrapes (their JSON never parsed by DuckDB); the SQL is
    # what DuckDB runs where it cannot, and what `ledger sql` pastes.
    EXTRACTIONS["kv_x_counter_samples"] = entries_sql(
        "metrics.scraped", "samples", {metric: counter for counter, metric in COUNTERS.items()}
    )
    return "SELECT seq, name AS counter, series, value FROM kv_x_counter_samples"


def scrape_deltas(windows: str, only: str | None = None, salt: str | None = None) -> str:
    """The counter deltas of the scrape windows that ``windows`` selects (rows of
    kv_scrape_windows), recomputed from each window's two scrapes' samples: NULL when a scrape is
    missing or failed, or neither scrape has the counter; a series that went down restarted and
    counts its after value (collectors/_metrics.py). kv_scrape_deltas is every window's; the audit
    asks a few windows' one counter alone (the isolation probes' LMCache lookups): with ``only``
    (a counter of :data:`COUNTERS`) the samples are that counter's of the windows' own scrapes,
    picked before their text columns are read, and every other counter's delta is NULL. ``salt``
    (with ``only``): a column of ``windows`` holding each window's cache salt; the result then
    has ``salt_hit_tokens``, the delta of that counter's series labelled with the salt (NULL
    where no series is), as experiments/_isolation.py's ``salt_hit_tokens`` reads them."""
    samples = _counter_samples()
    if only is not None:
        if only not in COUNTERS:
            raise ValueError(f"no counter {only!r}: one of {sorted(COUNTERS)}")
        scrapes = "SELECT before_seq FROM win UNION ALL SELECT after_seq FROM win"
        samples += f" WHERE name = '{only}' AND seq IN ({scrapes})"
    elif salt is not None:
        raise ValueError("a salt's delta is of one counter: give only= too")
    per_salt = salt_join = salt_d = salt_out = ""
    if salt is not None:
        salted = f"""contains(s.series, '="' || w.{salt} || '"')"""
        per_salt = f""", CAST(round(sum(s.increase) FILTER (WHERE {salted})) AS BIGINT) AS salt_delta,
                        count(*) FILTER (WHERE {salted}) AS salt_series"""
        salt_join = " JOIN win w ON w.before_seq = s.wid"
        salt_d = f""",
                  max(CASE WHEN salt_series > 0 THEN salt_delta END) FILTER (WHERE counter = '{only}')
                    AS salt_hit_tokens"""
        salt_out = "\n       CASE WHEN w.complete THEN d.salt_hit_tokens END AS salt_hit_tokens,"
    return f"""
WITH win AS ({windows}),
     c AS ({samples}),
     b AS (SELECT w.before_seq AS wid, c.counter, c.series, c.value FROM win w
           JOIN c ON c.seq = w.before_seq),
     a AS (SELECT w.before_seq AS wid, c.counter, c.series, c.value FROM win w
           JOIN c ON c.seq = w.after_seq),
     s AS (SELECT coalesce(b.wid, a.wid) AS wid, coalesce(b.counter, a.counter) AS counter,
                  coalesce(b.series, a.series) AS series,
                  CASE WHEN a.value IS NULL THEN 0 WHEN b.value IS NULL OR a.value < b.value THEN a.value
                       ELSE a.value - b.value END AS increase,
                  a.value IS NULL OR coalesce(a.value < b.value, false) AS reset
           FROM b FULL JOIN a ON a.wid = b.wid AND a.counter = b.counter AND a.series = b.series),
     d AS (SELECT wid, max(delta) FILTER (WHERE counter = 'prefix_queries') AS prefix_queries,
                  max(delta) FILTER (WHERE counter = 'local_hit_tokens') AS local_hit_tokens,
                  max(delta) FILTER (WHERE counter = 'external_hit_tokens') AS external_hit_tokens,
                  max(delta) FILTER (WHERE counter = 'lmcache_requested_tokens') AS lmcache_requested_tokens,
                  max(delta) FILTER (WHERE counter = 'lmcache_hit_tokens') AS lmcache_hit_tokens,
                  bool_or(reset) AS reset{salt_d}
           FROM (SELECT s.wid, s.counter, CAST(round(sum(s.increase)) AS BIGINT) AS delta,
                        bool_or(s.reset) AS reset{per_salt}
                 FROM s{salt_join} GROUP BY s.wid, s.counter) GROUP BY wid)
SELECT w.run_id, w.block_id, w.request_id, w."window", w.replica, w.scope, w.before_seq, w.after_seq,
       w.complete, CASE WHEN w.complete THEN d.prefix_queries END AS prefix_queries,
       CASE WHEN w.complete THEN d.local_hit_tokens END AS local_hit_tokens,
       CASE WHEN w.complete THEN d.external_hit_tokens END AS external_hit_tokens,
       CASE WHEN w.complete THEN d.lmcache_requested_tokens END AS lmcache_requested_tokens,
       CASE WHEN w.complete THEN d.lmcache_hit_tokens END AS lmcache_hit_tokens,{salt_out}
       w.complete AND coalesce(d.reset, false) AS counter_reset
FROM (SELECT *, befores = 1 AND afters = 1 AND NOT failed AS complete FROM win) w
LEFT JOIN d ON d.wid = w.before_seq"""


# The audit's re-derivations (created on demand, by the audit only): each check recomputed from
# the raw observations (scrapes, responses, requests, fixtures) to cross-check recorded verdicts.
AUDIT_VIEWS: list[tuple[str, str]] = [
    # Each metric window: its before and after scrapes (one each, neither failed, for a delta).
    (
        "kv_scrape_windows",
        f"""
SELECT run_id, block_id, request_id, "window", replica, coalesce(request_id, 'window ' || "window") AS scope,
       count(*) FILTER (WHERE phase = 'before') AS befores, count(*) FILTER (WHERE phase = 'after') AS afters,
       min(seq) FILTER (WHERE phase = 'before') AS before_seq,
       max(seq) FILTER (WHERE phase = 'after') AS after_seq,
       bool_or(error IS NOT NULL) AS failed
FROM ({
            _extract(
                "metrics.scraped",
                {
                    "replica": "VARCHAR",
                    "phase": "VARCHAR",
                    "request_id": "VARCHAR",
                    "window": "VARCHAR",
                    "error": "VARCHAR",
                },
            )
        })
GROUP BY ALL""",
    ),
    # Counter deltas of each window, recomputed from its two scrapes' samples (NULL when a scrape
    # is missing or failed, or neither scrape has the counter), as collectors/_metrics.py defines them.
    ("kv_scrape_deltas", scrape_deltas("SELECT * FROM kv_scrape_windows")),
    # The shared tier's windows alone (replica 'tier': the LMCache service scraped around every
    # window of an ON block) with their deltas, computed once for the checks that read LMCache's
    # own account: hits.observed's LMCache fields, and the external hits its lookups must cover.
    ("kv_tier_deltas", scrape_deltas("SELECT * FROM kv_scrape_windows WHERE replica = 'tier'")),
    # Every hits.observed beside the deltas its window's scrapes give (inconsistent: they differ,
    # or no scrape window stands behind it). A window is its run's: the envelope's block_id is
    # optional, and two runs' blockless windows of one name are not one window. LMCache's lookup
    # counters are the shared tier's where the run scraped one around the window (every replica's
    # record of the window carries the tier's whole delta), else the replica's own (an in-process
    # connector exposes them there); none at all where the replica's own scrapes fail, as
    # collectors/_metrics.py's Scraper gives them.
    (
        "kv_hits_rederived",
        """
WITH r AS (
SELECT h.seq, h.run_id, h.block_id, h.arm, h.request_id, h."window", h.replica,
       coalesce(h.request_id, 'window ' || h."window") AS scope,
       h.prefix_queries, h.local_hit_tokens, h.external_hit_tokens,
       coalesce(h.counter_reset, false) AS counter_reset,
       h.lmcache_requested_tokens, h.lmcache_hit_tokens,
       w.scope IS NOT NULL AS scraped, w.prefix_queries AS scraped_prefix_queries,
       w.local_hit_tokens AS scraped_local_hit_tokens, w.external_hit_tokens AS scraped_external_hit_tokens,
       coalesce(w.counter_reset, false) AS scraped_counter_reset,
       t.scope IS NOT NULL AS tier_scraped,
       CASE WHEN NOT coalesce(w.complete, false) THEN NULL
            WHEN t.scope IS NOT NULL THEN t.lmcache_requested_tokens
            ELSE w.lmcache_requested_tokens END AS scraped_lmcache_requested_tokens,
       CASE WHEN NOT coalesce(w.complete, false) THEN NULL
            WHEN t.scope IS NOT NULL THEN t.lmcache_hit_tokens
            ELSE w.lmcache_hit_tokens END AS scraped_lmcache_hit_tokens
FROM kv_hits h LEFT JOIN kv_scrape_deltas w
  ON w.run_id IS NOT DISTINCT FROM h.run_id AND w.block_id IS NOT DISTINCT FROM h.block_id
 AND w.replica = h.replica AND w.scope = coalesce(h.request_id, 'window ' || h."window")
LEFT JOIN kv_tier_deltas t
  ON t.run_id IS NOT DISTINCT FROM h.run_id AND t.block_id IS NOT DISTINCT FROM h.block_id
 AND t.scope = coalesce(h.request_id, 'window ' || h."window"))
SELECT *, prefix_queries IS DISTINCT FROM scraped_prefix_queries
          OR local_hit_tokens IS DISTINCT FROM scraped_local_hit_tokens
          OR external_hit_tokens IS DISTINCT FROM scraped_external_hit_tokens
          OR counter_reset <> scraped_counter_reset
          OR lmcache_requested_tokens IS DISTINCT FROM scraped_lmcache_requested_tokens
          OR lmcache_hit_tokens IS DISTINCT FROM scraped_lmcache_hit_tokens AS inconsistent
FROM r""",
    ),
    # The inconsistent rows of kv_hits_rederived, the only ones the audit reads (materialised: a
    # copy of every hits record's twenty columns cost more than comparing them).
    ("kv_hits_inconsistent", "SELECT * FROM kv_hits_rederived WHERE inconsistent"),
    # Every assertion.evaluated of a known check beside its verdict recomputed from observations:
    # the request's first response and single-request hits, its request.sent, its fixture's
    # expected values (fixture.created), and for text checks the response digests. expected and
    # observed are JSON text; the rules are collectors/_assertions.py's, written again in SQL.
    (
        "kv_rederived",
        f"""
WITH fx AS (SELECT fixture_id, CAST(expected AS VARCHAR) AS expected
            FROM ({_extract("fixture.created", {"fixture_id": "VARCHAR", "expected": "JSON"})}) f
            WHERE seq IN (SELECT min(seq) FROM kv_x_fixture_created GROUP BY fixture_id)),
     -- The whole answer is stored when its prefix has the answer's digest: then its JSON object
     -- is read from the text itself, else from the recorded observed values.
     resp AS (SELECT request_id,
                     CASE WHEN sha256(output_text_prefix) = text_sha256 AND json_valid(output_text_prefix)
                               AND json_type(output_text_prefix) = 'OBJECT' THEN output_text_prefix END
                       AS answer_text
              FROM kv_x_response_received
              -- The first response of each request an exact_values check names: the requests are
              -- picked before the first responses are found and their digests taken (a few
              -- thousand of the responses, not every one).
              WHERE seq IN (SELECT min(seq) FROM kv_x_response_received
                            WHERE request_id IN (SELECT request_id FROM kv_assertions
                                                 WHERE "check" = 'exact_values')
                            GROUP BY request_id)),
     a AS (SELECT a.seq, a.run_id, a.block_id, a.request_id, a."check", a."window", a.replica, a.chunk_size,
                  a.reference_request_id, a.passed, a.expected, a.observed, q.status, q.error,
                  q.status = 200 AND q.error IS NULL AS ok, q.output_tokens, q.max_tokens, q.prompt_tokens,
                  q.cached_tokens, q.text_sha256, q.prefix_queries, q.local_hit_tokens AS loc,
                  q.external_hit_tokens AS ext, q.counter_reset, fx.expected AS fixture_expected,
                  t.answer_text
           FROM kv_assertions a LEFT JOIN kv_requests q USING (request_id)
           LEFT JOIN fx ON fx.fixture_id = q.fixture_id LEFT JOIN resp t ON t.request_id = a.request_id),
     -- Each expected name against the answer's value: JSON-equal, or an integer written as a string
     -- (a CASE, so the string test runs only for the values that are not JSON-equal). Compared once
     -- per distinct expectation and answer (checks repeat the same few fixtures and answers).
     docs AS (SELECT DISTINCT fixture_expected, coalesce(answer_text, observed) AS doc
              FROM a WHERE "check" = 'exact_values'),
     pairs AS (SELECT d.fixture_expected, d.doc, e.key, e.value AS want, e.type AS want_type,
                      json_extract(d.doc, '$."' || replace(e.key, '"', '\\"') || '"') AS got
               FROM docs d, json_each(d.fixture_expected) e),
     exact AS (SELECT fixture_expected, doc,
                      bool_and(CASE WHEN CAST(got AS VARCHAR) = CAST(want AS VARCHAR) THEN true
                                    WHEN want_type IN ('BIGINT', 'UBIGINT') AND json_type(got) = 'VARCHAR'
                                    THEN coalesce(TRY_CAST(nullif(regexp_extract(got ->> '$',
                                                                  '^\\s*(-?[0-9]+)\\s*$', 1), '') AS HUGEINT)
                                                  = CAST(want AS HUGEINT), false)
                                    ELSE false END) AS same
               FROM pairs GROUP BY fixture_expected, doc),
     ref AS (SELECT r.request_id, r.status = 200 AND r.error IS NULL AS ok, r.text_sha256 FROM kv_requests r),
     win AS (SELECT block_id, "window", replica, external_hit_tokens FROM kv_hits WHERE request_id IS NULL),
     derived AS (
SELECT a.*, CASE WHEN a.prompt_tokens IS NULL OR a.chunk_size IS NULL THEN NULL
                 WHEN a.prompt_tokens < 1 OR a.chunk_size < 1 THEN 0
                 ELSE (a.prompt_tokens - 1) // a.chunk_size * a.chunk_size END AS shareable,
       x.same, ref.ok AS ref_ok,
       ref.text_sha256 AS ref_text_sha256,
       CASE WHEN a.request_id IS NULL THEN w.external_hit_tokens ELSE a.ext END AS off_ext
FROM a LEFT JOIN exact x ON a."check" = 'exact_values'
                         AND x.fixture_expected IS NOT DISTINCT FROM a.fixture_expected
                         AND x.doc IS NOT DISTINCT FROM coalesce(a.answer_text, a.observed)
LEFT JOIN ref ON ref.request_id = a.reference_request_id
LEFT JOIN win w ON a.request_id IS NULL AND w.block_id = a.block_id AND w."window" = a."window"
               AND w.replica = a.replica)
SELECT seq, run_id, block_id, request_id, "check", "window", passed AS recorded_passed,
       expected AS recorded_expected, observed AS recorded_observed,
       CASE "check"
         WHEN 'stream_complete' THEN coalesce(ok, false)
         WHEN 'exact_values' THEN coalesce(ok, false) AND fixture_expected IS NOT NULL
                                  AND (answer_text IS NOT NULL OR coalesce(observed, 'null') <> 'null')
                                  AND coalesce(same, true)
         WHEN 'output_length' THEN coalesce(output_tokens = max_tokens, false)
         WHEN 'zero_hits' THEN coalesce(loc = 0 AND ext = 0, false) AND coalesce(cached_tokens = 0, true)
         WHEN 'full_prefix_hit' THEN coalesce(loc + ext >= shareable AND (ext > 0 OR loc >= shareable), false)
         WHEN 'matches_cold_reference' THEN coalesce(ok AND ref_ok AND text_sha256 = ref_text_sha256, false)
         WHEN 'no_external_hits_off' THEN coalesce(off_ext = 0, false)
         WHEN 'counters_match' THEN coalesce(prefix_queries = prompt_tokens, false)
                                    AND coalesce(loc + coalesce(ext, 0) = cached_tokens,
                                                 cached_tokens IS NULL)
                                    AND NOT coalesce(counter_reset, false)
         WHEN 'salt_control' THEN coalesce(loc + coalesce(ext, 0) = 0 AND ok, false)
       END AS derived_passed,
       "check" = 'exact_values' AND fixture_expected IS DISTINCT FROM expected AS expectation_differs,
       status, error, output_tokens, max_tokens, prompt_tokens, cached_tokens, prefix_queries, loc, ext,
       shareable, off_ext, text_sha256, ref_text_sha256, fixture_expected, answer_text
FROM derived""",
    ),
    # kv_rederived with its recomputed expected and observed values as JSON text (a view: the audit
    # reads it for the rows it reports).
    (
        "kv_rederived_shown",
        """
SELECT *,
       CASE "check"
         WHEN 'stream_complete' THEN '{"error":null,"status":200}'
         WHEN 'exact_values' THEN fixture_expected
         WHEN 'output_length' THEN CAST(max_tokens AS VARCHAR)
         WHEN 'zero_hits' THEN '{"cached_tokens":0,"external_hit_tokens":0,"local_hit_tokens":0}'
         WHEN 'full_prefix_hit' THEN CAST(shareable AS VARCHAR)
         WHEN 'matches_cold_reference' THEN to_json(ref_text_sha256)::VARCHAR
         WHEN 'no_external_hits_off' THEN '0'
         WHEN 'counters_match' THEN json_object('hit_tokens', cached_tokens,
                                                'prefix_queries', prompt_tokens)::VARCHAR
         WHEN 'salt_control' THEN '0'
       END AS derived_expected,
       CASE "check"
         WHEN 'stream_complete' THEN json_object('error', error, 'status', status)::VARCHAR
         WHEN 'exact_values' THEN coalesce(answer_text, recorded_observed, 'null')
         WHEN 'output_length' THEN CAST(output_tokens AS VARCHAR)
         WHEN 'zero_hits' THEN json_object('cached_tokens', cached_tokens, 'external_hit_tokens', ext,
                                           'local_hit_tokens', loc)::VARCHAR
         WHEN 'full_prefix_hit' THEN CAST(ext AS VARCHAR)
         WHEN 'matches_cold_reference' THEN to_json(text_sha256)::VARCHAR
         WHEN 'no_external_hits_off' THEN CAST(off_ext AS VARCHAR)
         WHEN 'counters_match' THEN json_object('hit_tokens', loc + coalesce(ext, 0),
                                                'prefix_queries', prefix_queries)::VARCHAR
         WHEN 'salt_control' THEN CAST(loc + coalesce(ext, 0) AS VARCHAR)
       END AS derived_observed
FROM kv_rederived""",
    ),
    # The rows of kv_rederived_shown the audit reports (materialised): a check that failed as
    # recorded or on its observations, a recorded verdict its observations contradict, or an
    # exact_values check whose recorded expectation is not its fixture's. Only these rows are
    # copied and only they get the JSON text of kv_rederived_shown (the filter is applied first).
    (
        "kv_rederived_disputed",
        """
SELECT * FROM kv_rederived_shown
WHERE NOT coalesce(recorded_passed, false) OR NOT coalesce(derived_passed, true)
   OR (derived_passed IS NOT NULL AND expectation_differs)""",
    ),
]

ORDERED_METHODS = ("wait_then_fallback", "memcpy_async_current_stream", "same_stream_tensor_copy")


# Views left as views: each a filtered copy of a table already materialised (or of a projection),
# whose readers each read a few of its columns (a copy of kv_requests' rows cost its build and its
# memory; a copy of the assertions' projection cost 0.13 to 0.17 s at 1M events, about what all its
# readers together pay to read the projection through the view).
VIEWS_NOT_MATERIALISED = {"kv_measured", "kv_assertions"}


# The views held as Arrow tables where create_views is given a hold: those with a row per request,
# pair of requests or session, whose DuckDB table costs more per row than Arrow's round trip (at 1M
# events kv_requests 0.42 against 0.24 s, kv_pairs 0.22 against 0.15 s). The others, a row per
# block, run, window or config, are DuckDB tables: for a few thousand rows the round trip (bind,
# export, registration, type check) cost 1 to 5 ms more than the copy, for every source and group.
VIEWS_HELD = frozenset({"kv_requests", "kv_hits", "kv_pairs", "kv_ttft", "kv_ttft_pairs", "kv_sessions"})


# The most requests whose views are held as Arrow tables (about 2M events of a screening's ledger:
# kv_requests at 1M events, 204k requests, is 118 MB as Arrow).
HELD_VIEW_REQUESTS_MAX = 500_000


def create_views(
    con: duckdb.DuckDBPyConnection,
    until_seq: int | None = None,
    hold: Callable[[str, pa.Table], None] | None = None,
) -> None:
    """Materialise every view as a table on ``con`` (an in-memory DuckDB; the ledger is untouched).

    Tables, not views: each report and audit query would otherwise re-parse
    every event's JSON; materialised once, the whole report is a few scans.
    Plain (not TEMP) objects of the in-memory database, so that another cursor
    of it sees them: the audit's re-derivations are built on one beside the report.

    ``hold``: where given, the rows of each view of :data:`VIEWS_HELD` are made as an Arrow
    table and handed to it to serve (registered on ``con`` and on each cursor made after,
    :meth:`ledger.Analytics.hold_view`) in place of a table, where DuckDB reads it back with the
    same columns and types. DuckDB's own table costs its sink a string copy, a UTF-8 check and a
    distinct-count sample per value: ``kv_requests`` at 1M events 0.29 s as a table, 0.21 s as
    Arrow.
    """
    # As of one event: attestation checks re-derive at the attested head.
    bound = "" if until_seq is None else f" WHERE seq <= {int(until_seq)}"
    for name in EXTRACTIONS:
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM {_source_name(name)}{bound}")
    if hold is not None:
        # Held outside DuckDB's memory limit: only where they are small enough (as the projections
        # are held only up to ledger/_analytics.py _HELD_ROWS_MAX rows); past that DuckDB's tables,
        # which it moves to disk past its limit.
        ((requests,),) = con.execute("SELECT count(*) FROM kv_x_request_sent").fetchall()
        hold = hold if int(requests) <= HELD_VIEW_REQUESTS_MAX else None
    for name, sql in VIEWS:
        if name in VIEWS_NOT_MATERIALISED:
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql.strip()}")
            continue
        table = _as_arrow(con, sql) if hold is not None and name in VIEWS_HELD else None
        if hold is not None and table is not None:
            hold(name, table)
        else:
            con.execute(f"CREATE OR REPLACE TABLE {name} AS {sql.strip()}")


def _as_arrow(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table | None:
    """The rows of ``sql`` as Arrow, or None where DuckDB would read them back with other column
    names or types than the query's own (told by binding it, not running it): a JSON column, which
    comes back VARCHAR, is refused before the query runs; any other difference once it has run
    (the caller then builds a table of it)."""
    relation = con.sql(sql.strip())
    own = relation_read_as(relation)
    if any(_JSON_TYPE.search(kind) for _, kind in own):
        return None
    table = relation.to_arrow_table()
    return table if arrow_read_as(con, table) == own else None


_JSON_TYPE = re.compile(r"\bJSON\b")


def release_extractions(con: duckdb.DuckDBPyConnection, held: Collection[str] = ()) -> list[str]:
    """Drop the projection tables that only the views read, once :func:`create_views` has run:
    where the projections are tables derived from the database's rows (held in memory), those
    of the kinds the views copy whole (requests, assertions, hits...) are otherwise kept to the
    end beside their copies, and push the re-derivations' tables past DuckDB's memory limit.
    The extractions the audit's re-derivations read stay; projections served from snapshot
    files are views and stay too. ``held``: projections served as Arrow tables registered on
    ``con``; those dropped are the caller's to release. The names dropped (their ``kv_x_`` views
    go with them)."""
    read_after = _extractions_read_after_views()
    tables = {row[0] for row in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    dropped = []
    for name in EXTRACTIONS:
        source = _source_name(name)
        if (source in tables or source in held) and name not in read_after:
            con.execute(f"DROP VIEW IF EXISTS {name}")
            if source in tables:
                con.execute(f"DROP TABLE {source}")
            dropped.append(source)
    return dropped


@functools.cache
def _extractions_read_after_views() -> frozenset[str]:
    """The extractions read once the views are made: by the re-derivations, and by the views left
    as views (told once per process: the SQL is the code's own)."""
    sql = " ".join(
        [*(sql for _, sql in AUDIT_VIEWS), *(sql for name, sql in VIEWS if name in VIEWS_NOT_MATERIALISED)]
    )
    return frozenset(name for name in EXTRACTIONS if re.search(rf"\b{name}\b", sql))


# Views: each re-derivation of every row is read by the audit only through the materialised
# subset of rows it reports (kv_hits_inconsistent, kv_rederived_disputed); kept as views for readers.
_AUDIT_VIEWS_NOT_MATERIALISED = (
    "kv_scrape_deltas",
    "kv_hits_rederived",
    "kv_rederived",
    "kv_rederived_shown",
)


def create_audit_views(con: duckdb.DuckDBPyConnection, skip_built: bool = False) -> None:
    """Build the audit's re-derivations (after :func:`create_views`, on the same bound): the
    re-derivations of every row stay views, and the rows the audit reports of them are
    materialised (``kv_hits_inconsistent``, ``kv_rederived_disputed``), each computed once.
    ``skip_built``: keep those a build cut off by an error had made (each is made whole or not
    at all)."""
    built: set[str] = set()
    if skip_built:
        names = "SELECT table_name FROM duckdb_tables() UNION ALL SELECT view_name FROM duckdb_views()"
        built = {str(row[0]) for row in con.execute(names).fetchall()}
    for name, sql in AUDIT_VIEWS:
        if name in built:
            continue
        kind = "VIEW" if name in _AUDIT_VIEWS_NOT_MATERIALISED else "TABLE"
        con.execute(f"CREATE OR REPLACE {kind} {name} AS {sql.strip()}")


def with_clause(query: str) -> str:
    """``query`` prefixed by every extraction and view as a CTE: pasteable into ``ledger sql``."""
    views = [*EXTRACTIONS.items(), *VIEWS, *AUDIT_VIEWS]
    ctes = ",\n".join(f"{name} AS ({sql.strip()})" for name, sql in views)
    return f"WITH {ctes}\n{query}"


# Queries an analyst pastes (after ``with_clause``) to get the report's numbers by hand.
EXAMPLES: list[tuple[str, str]] = [
    (
        "Table 3 medians (TTFT by size × locality × arm)",
        "SELECT run_id, nominal_tokens, locality, arm, median(ttft_s) AS median_ttft_s, count(*) AS n\n"
        "FROM kv_ttft GROUP BY ALL ORDER BY ALL",
    ),
    (
        "Table 3 paired change (mean of 100 × (ON/OFF − 1) over matched chains)",
        "SELECT run_id, nominal_tokens, locality, avg(change_pct) AS mean_change_pct, count(*) AS units,\n"
        "       count(DISTINCT pair) AS block_pairs\nFROM kv_ttft_pairs GROUP BY ALL ORDER BY ALL",
    ),
    (
        "Table 4 (session wall time by size × routing, paired change)",
        "SELECT run_id, nominal_tokens, placement, median(on_wall) AS on_median,\n"
        "       median(off_wall) AS off_median, avg(change_pct) AS mean_change_pct, count(*) AS units\n"
        "FROM kv_session_pairs GROUP BY ALL ORDER BY ALL",
    ),
    (
        "Decode rate, forced-length generation",
        "SELECT run_id, nominal_tokens, step, max_tokens, avg(change_pct) AS mean_change_pct,\n"
        "       count(*) AS units\n"
        "FROM kv_decode_pairs GROUP BY ALL ORDER BY ALL",
    ),
    (
        "Concurrency windows, output tokens/s",
        "SELECT run_id, sessions, placement, avg(change_pct) AS mean_change_pct, count(*) AS units\n"
        "FROM kv_window_pairs GROUP BY ALL ORDER BY ALL",
    ),
    (
        "Accounting: measured requests and pairs",
        "SELECT (SELECT count(*) FROM kv_measured WHERE NOT excluded) AS measured,\n"
        "       (SELECT count(*) FROM kv_pairs WHERE status IN ('matched', 'payload-mismatch', "
        "'gpu-mismatch'))"
        " AS pairs,\n"
        "       (SELECT count(*) FROM kv_pairs WHERE status = 'matched') AS matched_pairs",
    ),
    (
        "Everything not cleanly paired (never dropped silently)",
        'SELECT status, run_id, pair, workload, step, chain, session, "window", turn,\n'
        "       on_request, off_request\n"
        "FROM kv_pairs WHERE status <> 'matched' ORDER BY seq",
    ),
    (
        "Excluded blocks and why",
        "SELECT run_id, block_id, source, reason FROM kv_excluded_blocks ORDER BY seq",
    ),
]


def views_markdown() -> str:
    """reports/VIEWS.md, generated so it never drifts from the SQL the report runs."""
    lines = [
        "# Report views (generated by `python -m reports.docs`; do not edit)",
        "",
        "Every number in `ledger report` comes from these views. `ledger report` materialises them as",
        "tables in an in-memory DuckDB of its own over the ledger's Parquet snapshot (nothing is written",
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
    lines += [
        "## Extractions",
        "",
        "Each kind the views read, with typed data fields. `ledger report` keeps them as projections",
        "next to the snapshot's segments (each event's JSON is parsed once); in `ledger sql` they are",
        "plain CTEs over `events`.",
        "",
    ]
    for name, sql in EXTRACTIONS.items():
        lines += [f"### `{name}`", "", "```sql", sql, "```", ""]
    lines += ["## The views", ""]
    for name, sql in VIEWS:
        lines += [f"### `{name}`", "", "```sql", sql.strip(), "```", ""]
    lines += [
        "## The audit's re-derivations",
        "",
        "Built by `ledger audit` only (reports/AUDIT.md): each hit delta recomputed from its two",
        "scrapes, and each recorded assertion's verdict recomputed from the observations, beside",
        "what was recorded. The re-derivations of every row are views; the audit materialises",
        "only the rows it reports of them (`kv_hits_inconsistent`, `kv_rederived_disputed`).",
        "",
    ]
    for name, sql in AUDIT_VIEWS:
        lines += [f"### `{name}`", "", "```sql", sql.strip(), "```", ""]
    lines += [
        "## Pasteable prefix",
        "",
        "`ledger sql \"$(python -c 'from reports._views import with_clause; "
        'print(with_clause(\\"SELECT * FROM kv_ttft_pairs\\"))\')"`',
        "",
    ]
    return "\n".join(lines)
