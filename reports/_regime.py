"""The regime of each result: does the workload's working set fit in one replica's device cache?

The device cache is what ``vllm:cache_config_info`` says each replica holds:
``num_gpu_blocks`` × ``block_size`` tokens (recorded in
``deployment.launched.cache_config``; the sim exposes the same labels). The
working set of a cell is the most prompt tokens one replica must keep at once
for its reuses: per chain, session or request its longest prompt, summed over
the sessions of a concurrent window on the same replica. Where it fits, every
local reuse already hits the replica's own prefix cache, so a shared tier
cannot improve local reuse: it can only serve a request routed to another
replica. The label stands beside the local-reuse baseline (the first local
reuse's TTFT, OFF), so a reader sees what the shared tier competes with.
"""

from __future__ import annotations

from typing import Any

from ._source import Source

__all__ = ["EXCEEDS", "FITS", "regime"]

FITS, EXCEEDS, UNKNOWN = "fits-in-device-cache", "exceeds-device-cache", "device-cache-unknown"
SCOPE = "($run IS NULL OR run_id = $run)"


def regime(src: Source, run: str | None) -> list[dict[str, Any]]:
    """One row per run × workload × nominal size of the measured requests."""
    rows = src.rows(
        f"""
        WITH units AS (
            SELECT run_id, block_id, workload, nominal_tokens, "window", replica,
                   coalesce(session, chain, request_id) AS unit, max(prompt_tokens) AS tokens
            FROM kv_measured WHERE NOT excluded AND prompt_tokens IS NOT NULL AND {SCOPE}
            GROUP BY ALL),
             live AS (
            SELECT run_id, block_id, workload, nominal_tokens, coalesce("window", unit) AS grp, replica,
                   sum(tokens) AS tokens
            FROM units GROUP BY ALL),
             device AS (
            SELECT run_id, min(device_cache_tokens) AS device_cache_tokens FROM kv_launches
            WHERE device_cache_tokens IS NOT NULL GROUP BY run_id),
             baseline AS (
            SELECT run_id, nominal_tokens, arm, median(ttft_s) AS local_reuse_ttft_s
            FROM kv_ttft WHERE locality = 'local1' GROUP BY ALL)
        SELECT l.run_id, l.workload, l.nominal_tokens, CAST(max(l.tokens) AS BIGINT) AS working_set_tokens,
               d.device_cache_tokens,
               any_value(b_off.local_reuse_ttft_s) AS off_local_reuse_ttft_s,
               any_value(b_on.local_reuse_ttft_s) AS on_local_reuse_ttft_s
        FROM live l LEFT JOIN device d USING (run_id)
        LEFT JOIN baseline b_off ON b_off.run_id = l.run_id AND b_off.nominal_tokens = l.nominal_tokens
             AND b_off.arm = 'OFF' AND l.workload = 'micro'
        LEFT JOIN baseline b_on ON b_on.run_id = l.run_id AND b_on.nominal_tokens = l.nominal_tokens
             AND b_on.arm = 'ON' AND l.workload = 'micro'
        GROUP BY l.run_id, l.workload, l.nominal_tokens, d.device_cache_tokens
        ORDER BY l.run_id, l.workload, l.nominal_tokens""",
        {"run": run},
    )
    for r in rows:
        device, working = r["device_cache_tokens"], r["working_set_tokens"]
        if device is None:
            r["regime"] = UNKNOWN
            r["statement"] = "no vllm:cache_config_info recorded: whether a shared tier can help is unknown"
        elif working <= device:
            r["regime"] = FITS
            r["statement"] = (
                "the working set fits in each replica's device cache: local reuse already hits the "
                "replica's own prefix cache, so a shared tier cannot help local reuse here; it can only "
                "serve requests routed to another replica"
            )
        else:
            r["regime"] = EXCEEDS
            r["statement"] = (
                "the working set exceeds a replica's device cache: the device cache evicts part of it, "
                "which a shared tier can serve"
            )
    return rows
