"""The audit: the findings of docs/design.md, derived from the ledger (severities in reports/AUDIT.md).

Each check is a small function returning findings. A blocking finding whose
block (or run) the researcher has explicitly excluded with
``exclusion.declared`` is downgraded to info: the exclusion is itself
recorded, shown as ``declared-exclusion``, and the excluded data never reach
a table.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ledger import Head

from ._gc import no_cycle_collection
from ._plan import plan_deviations, run_plans
from ._source import Source
from ._stack import METRIC_REGISTRY, incompatible, names_for
from ._validation import (
    BYTES,
    HELPERS,
    NOT_APPLICABLE,
    TOLERANCE_TEXT,
    config_helper_paths,
    config_pinned_sizes,
    coverage,
)
from ._views import scrape_deltas

BLOCKING, WARNING, INFO = "blocking", "warning", "info"
SEVERITY: dict[str, str] = {
    "chain-broken": BLOCKING,
    "snapshot-mismatch": BLOCKING,
    "run-incomplete": BLOCKING,
    "request-id-reused": BLOCKING,
    "block-id-reused": BLOCKING,
    "namespace-leak": BLOCKING,
    "unpaired-request": BLOCKING,
    "pair-payload-mismatch": BLOCKING,
    "pair-gpu-mismatch": BLOCKING,
    "warmup-in-measurement": BLOCKING,
    "assertion-failed": BLOCKING,
    "assertion-inconsistent": BLOCKING,
    "hits-inconsistent": BLOCKING,
    "assertion-not-independent": INFO,
    "off-arm-external-hits": BLOCKING,
    "missing-full-prefix-hit": BLOCKING,
    "counter-mismatch": BLOCKING,
    "external-hits-unfound": BLOCKING,
    "checkpoint-mismatch": BLOCKING,
    "checkpoint-unverified": BLOCKING,
    "provenance-missing": BLOCKING,
    "validation-missing": BLOCKING,
    "isolation-missing": BLOCKING,
    "state-corruption": BLOCKING,
    "numeric-tie": INFO,
    "divergence-inconclusive": WARNING,
    "pinned-rounding": BLOCKING,
    "helper-probe-failed": BLOCKING,
    "order-unbalanced": BLOCKING,
    "blocks-not-restarted": WARNING,
    "tier-warm-at-start": WARNING,
    "hash-seed-unset": BLOCKING,
    "ttft-method-mixed": WARNING,
    "plan-deviation": BLOCKING,
    "plan-unregistered": WARNING,
    "metrics-missing": BLOCKING,
    "known-incompatible-stack": BLOCKING,
    "declared-exclusion": INFO,
    "import-unpaired": BLOCKING,
    "import-no-hit-counters": BLOCKING,
    "import-unvalidated": BLOCKING,
}
_RANK = {BLOCKING: 0, WARNING: 1, INFO: 2}
SCOPE = "($run IS NULL OR run_id = $run)"


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    run_id: str | None
    block_id: str | None
    target: str | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity,
            "run_id": self.run_id,
            "block_id": self.block_id,
            "target": self.target,
            "detail": self.detail,
        }

    def sort_key(self) -> tuple[Any, ...]:
        return (
            _RANK[self.severity],
            self.code,
            self.run_id or "",
            self.block_id or "",
            self.target or "",
            self.detail,
        )


def finding(code: str, row: dict[str, Any], target: Any, detail: str) -> Finding:
    return Finding(
        code,
        SEVERITY[code],
        row.get("run_id"),
        row.get("block_id"),
        None if target is None else str(target),
        detail,
    )


Check = Callable[[Source, "str | None"], list[Finding]]


def chain_broken(src: Source, run: str | None) -> list[Finding]:
    result = src.verification()
    if result.ok:
        return []
    return [
        finding(
            "chain-broken",
            {},
            result.first_bad_seq,
            f"first bad seq {result.first_bad_seq}: {result.problem}",
        )
    ]


def snapshot_mismatch(src: Source, run: str | None) -> list[Finding]:
    """Snapshot files that failed their proof when the source opened (rebuilt before use)."""
    folder = src.analytics.snapshot.directory
    found = [
        finding(
            "snapshot-mismatch",
            {},
            m.file.relative_to(folder) if m.file.is_relative_to(folder) else m.file,
            f"{m.file}: {m.problem}; rebuilt from the ledger",
        )
        for m in src.snapshot_mismatches
    ]
    proof, verified = src.snapshot_proof, src.verification()
    if verified.ok and proof.head_seq > (verified.head_seq or 0):
        found.append(
            finding(
                "snapshot-mismatch",
                {},
                proof.head_seq,
                f"the snapshot holds seq {proof.head_seq}, past the verified head {verified.head_seq}",
            )
        )
    return found


def run_incomplete(src: Source, run: str | None) -> list[Finding]:
    """One finding per killed, failed or aborted run, with its unpaired requests counted inside
    (a run cut short leaves the partners of its last block pair unsent: one cause, one finding)."""
    rows = src.rows(
        f"""SELECT r.run_id, r.experiment, r.finish_status,
                               (SELECT count(*) FROM kv_pairs p WHERE p.run_id = r.run_id
                                  AND p.status LIKE 'unpaired-%') AS unpaired
                        FROM kv_runs r
                        WHERE (r.finish_status IS NULL OR r.finish_status IN ('aborted', 'failed'))
                          AND {SCOPE.replace("run_id", "r.run_id")}
                        ORDER BY r.seq""",
        {"run": run},
    )
    return [
        finding(
            "run-incomplete",
            r,
            r["run_id"],
            f"{r['experiment']} run "
            + ("has no run.finished" if r["finish_status"] is None else f"finished {r['finish_status']}")
            + (
                f"; {r['unpaired']} measured request(s) left without a partner in the other arm"
                if r["unpaired"]
                else ""
            ),
        )
        for r in rows
    ]


def _reused(src: Source, run: str | None, relation: str, key: str) -> list[dict[str, Any]]:
    """Each value of ``key`` that more than one event of ``relation`` carries (two seqs: not one
    row met twice by a join), once per run that recorded it, with how many events carry it, this
    run's count and every run's. Asked first whether any repeats: nearly always none does, and
    then nothing else is."""
    repeated = f"SELECT {key} FROM {relation} GROUP BY {key} HAVING min(seq) <> max(seq)"
    if not src.rows_once(f"{repeated} LIMIT 1"):
        return []
    return src.rows(
        f"""WITH e AS (SELECT DISTINCT seq, run_id, coalesce(run_id, '(no run)') AS run, {key}
                       FROM {relation} WHERE {key} IN ({repeated})),
                 reused AS (SELECT {key}, count(*) AS events, list(DISTINCT run ORDER BY run) AS runs
                            FROM e GROUP BY {key})
            SELECT e.run_id, e.{key}, any_value(r.events) AS events, any_value(r.runs) AS runs,
                   count(*) AS own, min(e.seq) AS seq
            FROM e JOIN reused r USING ({key})
            WHERE {SCOPE.replace("run_id", "e.run_id")}
            GROUP BY e.run_id, e.{key} ORDER BY seq""",
        {"run": run},
    )


def request_id_reused(src: Source, run: str | None) -> list[Finding]:
    """A request id that more than one request.sent carries among the rows the tables were derived
    from, once per run that sent it: every table joins a request's response, single-request hits
    and assertions by its id (kv_requests takes the first of each by seq), so such a request's
    figures may be another request's, of its own run or another. Request ids are made fresh for
    each request; a repeat comes of an imported or edited ledger."""
    return [
        finding(
            "request-id-reused",
            r,
            r["request_id"],
            f"{r['events']} request.sent carry this request id ({r['own']} of them this run's; runs: "
            f"{', '.join(r['runs'])}): a request's response, hits and assertions are joined by its id, "
            "so its figures may be another request's",
        )
        for r in _reused(src, run, "kv_requests", "request_id")
    ]


def block_id_reused(src: Source, run: str | None) -> list[Finding]:
    """A block id that more than one block.started carries (within a run or across runs), once per
    run that started it: a block's arm, pair and position, and so every request's, are joined by
    its id, so its requests would be counted once for each block of that id."""
    return [
        finding(
            "block-id-reused",
            r,
            r["block_id"],
            f"{r['events']} block.started carry this block id ({r['own']} of them this run's; runs: "
            f"{', '.join(r['runs'])}): a block's arm, pair and position are joined to its requests by "
            "its id, so they would be counted once for each block of the id",
        )
        for r in _reused(src, run, "kv_run_blocks", "block_id")
    ]


def _incomplete_runs(src: Source) -> set[str]:
    sql = "SELECT run_id FROM kv_runs WHERE finish_status IS NULL OR finish_status IN ('aborted', 'failed')"
    return {r["run_id"] for r in src.rows_once(sql)}


def namespace_leak(src: Source, run: str | None) -> list[Finding]:
    """Cold measured requests that reused anything: hit counters or the response's cached tokens."""
    rows = src.rows(
        f"""SELECT run_id, block_id, request_id, nominal_tokens, local_hit_tokens, external_hit_tokens,
                               cached_tokens
                        FROM kv_requests WHERE step = 'cold' AND NOT warmup AND arm IS NOT NULL
                          AND (coalesce(local_hit_tokens, 0) > 0 OR coalesce(external_hit_tokens, 0) > 0
                               OR coalesce(cached_tokens, 0) > 0)
                          AND {SCOPE} ORDER BY seq""",
        {"run": run},
    )
    return [
        finding(
            "namespace-leak",
            r,
            r["request_id"],
            f"cold {r['nominal_tokens']}-token request saw {r['local_hit_tokens'] or 0} local and "
            f"{r['external_hit_tokens'] or 0} external hit tokens"
            + (f" and {r['cached_tokens']} cached tokens" if r["cached_tokens"] else "")
            + "; whole block excluded",
        )
        for r in rows
    ]


def pairing(src: Source, run: str | None) -> list[Finding]:
    rows = src.rows(
        f"""SELECT run_id, coalesce(on_block, off_block) AS block_id, on_block, off_block, on_request,
                               off_request, status, workload, step, chain, session, "window", turn,
                               payload_match, gpu_match
                        FROM kv_pairs WHERE status <> 'matched' AND status <> 'excluded' AND {SCOPE}
                        ORDER BY seq""",
        {"run": run},
    )
    out: list[Finding] = []
    incomplete = _incomplete_runs(src)
    for r in rows:
        where = ", ".join(
            f"{k} {r[k]}"
            for k in ("workload", "step", "chain", "session", "window", "turn")
            if r[k] is not None
        )
        if r["status"].startswith("unpaired"):
            if r["run_id"] in incomplete:
                continue  # counted in the run's run-incomplete finding
            arm, other = ("ON", "OFF") if r["status"] == "unpaired-on" else ("OFF", "ON")
            target = r["on_request"] or r["off_request"]
            out.append(
                finding("unpaired-request", r, target, f"{arm} request ({where}) has no {other} partner")
            )
            continue
        if not r["payload_match"]:
            out.append(
                finding(
                    "pair-payload-mismatch",
                    {**r, "block_id": r["on_block"]},
                    r["on_request"],
                    f"payload differs from OFF partner {r['off_request']} ({where})",
                )
            )
        if not r["gpu_match"]:
            out.append(
                finding(
                    "pair-gpu-mismatch",
                    {**r, "block_id": r["on_block"]},
                    r["on_request"],
                    f"target GPU differs from OFF partner {r['off_request']} ({where})",
                )
            )
    return out


def warmup_in_measurement(src: Source, run: str | None) -> list[Finding]:
    rows = src.rows(
        f"""SELECT s.run_id, s.block_id, s.session, r.request_id
                        FROM (SELECT *, unnest(requests) AS rid FROM kv_sessions) s
                        JOIN kv_requests r ON r.request_id = s.rid
                        WHERE r.warmup AND {SCOPE.replace("run_id", "s.run_id")} ORDER BY s.seq, r.seq""",
        {"run": run},
    )
    return [
        finding(
            "warmup-in-measurement",
            r,
            r["request_id"],
            f"warmup request counted in session {r['session']}'s measured wall time",
        )
        for r in rows
    ]


def _verdict(passed: bool | None) -> str:
    return "unknown" if passed is None else ("passed" if passed else "failed")


def assertion_failed(src: Source, run: str | None) -> list[Finding]:
    """Checks that fail: as recorded, or as recomputed from their observations (kv_rederived)."""
    src.rederive()
    rows = src.rows(
        f"""SELECT run_id, block_id, request_id, "window", "check", recorded_passed, recorded_expected,
                               recorded_observed, derived_passed, derived_expected, derived_observed
                        FROM kv_rederived_disputed
                        WHERE (NOT coalesce(recorded_passed, false) OR NOT coalesce(derived_passed, true))
                          AND {SCOPE} ORDER BY seq""",
        {"run": run},
    )
    out = []
    for r in rows:
        if not r["recorded_passed"]:
            detail = (
                f"{r['check']} failed: expected {r['recorded_expected']}, observed {r['recorded_observed']}"
            )
        else:
            detail = (
                f"{r['check']} fails on its observations: expected {r['derived_expected']}, observed "
                f"{r['derived_observed']} (recorded as passed)"
            )
        out.append(finding("assertion-failed", r, _assertion_target(r), detail))
    return out


def _assertion_target(r: dict[str, Any]) -> str:
    return r["request_id"] or f"window {r['window']}"


def assertion_inconsistent(src: Source, run: str | None) -> list[Finding]:
    """Recorded verdicts (or exact-value expectations) that their own observations contradict."""
    src.rederive()
    rows = src.rows(
        f"""SELECT run_id, block_id, request_id, "window", "check", recorded_passed, recorded_expected,
                               recorded_observed, derived_passed, derived_expected, derived_observed,
                               expectation_differs
                        FROM kv_rederived_disputed
                        WHERE derived_passed IS NOT NULL
                          AND (derived_passed <> coalesce(recorded_passed, false) OR expectation_differs)
                          AND {SCOPE} ORDER BY seq""",
        {"run": run},
    )
    return [
        finding(
            "assertion-inconsistent",
            r,
            _assertion_target(r),
            f"{r['check']} recorded {_verdict(r['recorded_passed'])} (expected {r['recorded_expected']}, "
            f"observed {r['recorded_observed']}); its observations give {_verdict(r['derived_passed'])} "
            f"(expected {r['derived_expected']}, observed {r['derived_observed']})"
            + (" — the recorded expectation is not its fixture's" if r["expectation_differs"] else ""),
        )
        for r in rows
    ]


def hits_inconsistent(src: Source, run: str | None) -> list[Finding]:
    """hits.observed deltas that the window's own scrapes (metrics.scraped) do not give."""
    src.rederive()
    rows = src.rows(
        f"""SELECT run_id, block_id, scope, replica, scraped, tier_scraped, prefix_queries,
                               local_hit_tokens, external_hit_tokens, counter_reset,
                               lmcache_requested_tokens, lmcache_hit_tokens, scraped_prefix_queries,
                               scraped_local_hit_tokens, scraped_external_hit_tokens, scraped_counter_reset,
                               scraped_lmcache_requested_tokens, scraped_lmcache_hit_tokens
                        FROM kv_hits_inconsistent WHERE {SCOPE} ORDER BY seq""",
        {"run": run},
    )

    def values(r: dict[str, Any], prefix: str) -> str:
        # LMCache's lookups are named only where they differ (most windows have none to name).
        tier = " (the shared tier's)" if prefix and r["tier_scraped"] else ""
        lmcache = (
            f", LMCache lookups requested {r[prefix + 'lmcache_requested_tokens']}, "
            f"hit {r[prefix + 'lmcache_hit_tokens']}{tier}"
            if (r["lmcache_requested_tokens"], r["lmcache_hit_tokens"])
            != (r["scraped_lmcache_requested_tokens"], r["scraped_lmcache_hit_tokens"])
            else ""
        )
        return (
            f"prefix queries {r[prefix + 'prefix_queries']}, local {r[prefix + 'local_hit_tokens']}, "
            f"external {r[prefix + 'external_hit_tokens']}"
            + (", counter reset" if r[prefix + "counter_reset"] else "")
            + lmcache
        )

    return [
        finding(
            "hits-inconsistent",
            r,
            r["scope"],
            f"replica {r['replica']}: hits.observed records {values(r, '')}; "
            + (
                f"its metrics.scraped before/after give {values(r, 'scraped_')}"
                if r["scraped"]
                else "no metrics.scraped before/after stands behind it"
            ),
        )
        for r in rows
    ]


def assertion_not_independent(src: Source, run: str | None) -> list[Finding]:
    rows = src.rows(
        f"""SELECT run_id, count(*) AS n, count(*) FILTER (WHERE NOT independent) AS dependent
                        FROM kv_assertions WHERE "check" = 'exact_values' AND {SCOPE}
                        GROUP BY run_id HAVING count(*) FILTER (WHERE NOT independent) > 0
                        ORDER BY run_id""",
        {"run": run},
    )
    return [
        finding(
            "assertion-not-independent",
            r,
            r["run_id"],
            f"{r['dependent']} of {r['n']} exact-value checks had the expected values in their own "
            "history; they do not independently verify distant-prefix recovery",
        )
        for r in rows
    ]


def off_arm_external_hits(src: Source, run: str | None) -> list[Finding]:
    rows = src.rows(
        f"""SELECT run_id, block_id, coalesce(request_id, 'window ' || "window") AS what,
                               external_hit_tokens FROM kv_hits
                        WHERE arm = 'OFF' AND coalesce(external_hit_tokens, 0) > 0 AND {SCOPE}
                        ORDER BY seq""",
        {"run": run},
    )
    return [
        finding(
            "off-arm-external-hits",
            r,
            r["what"],
            f"OFF block observed {r['external_hit_tokens']} external hit tokens",
        )
        for r in rows
    ]


def missing_full_prefix_hit(src: Source, run: str | None) -> list[Finding]:
    """ON micro cross-replica steps whose hit counters do not cover the shareable prefix.

    From observations: the response's prompt tokens P, the window's local (L) and external (E)
    hit deltas, and the connector's chunk C as its check recorded it (configuration, not an
    outcome): shareable S = floor((P - 1) / C) * C, full when L + E >= S and (E > 0 or L >= S).
    Without a recorded chunk only E > 0 can be required.
    """
    rows = src.rows(
        f"""WITH c AS (SELECT request_id, max(chunk_size) AS chunk_size FROM kv_assertions
                                      WHERE "check" = 'full_prefix_hit' GROUP BY request_id),
                             m AS (SELECT m.*, c.chunk_size,
                                          CASE WHEN m.prompt_tokens IS NULL OR c.chunk_size IS NULL THEN NULL
                                               WHEN m.prompt_tokens < 1 OR c.chunk_size < 1 THEN 0
                                               ELSE (m.prompt_tokens - 1) // c.chunk_size * c.chunk_size
                                          END AS shareable
                                   FROM kv_measured m LEFT JOIN c USING (request_id)
                                   WHERE m.arm = 'ON' AND m.step = 'cross' AND m.workload = 'micro')
                        SELECT run_id, block_id, request_id, prompt_tokens, chunk_size, shareable,
                               local_hit_tokens, external_hit_tokens FROM m
                        WHERE CASE WHEN shareable IS NULL THEN coalesce(external_hit_tokens, 0) = 0
                                   ELSE NOT coalesce(local_hit_tokens + external_hit_tokens >= shareable
                                                     AND (external_hit_tokens > 0
                                                          OR local_hit_tokens >= shareable), false) END
                          AND {SCOPE} ORDER BY seq""",
        {"run": run},
    )
    return [
        finding(
            "missing-full-prefix-hit",
            r,
            r["request_id"],
            f"cross-replica step hit {_count(r['external_hit_tokens'])} external "
            f"(+{_count(r['local_hit_tokens'])} local) tokens of a shareable prefix of "
            + (
                f"{r['shareable']} ({r['prompt_tokens']} prompt tokens, chunk {r['chunk_size']})"
                if r["shareable"] is not None
                else "unknown size (no chunk recorded)"
            ),
        )
        for r in rows
    ]


def _count(value: Any) -> str:
    return "unknown" if value is None else str(value)


def external_hits_unfound(src: Source, run: str | None) -> list[Finding]:
    """Windows where the replicas' external hit tokens (what vLLM reports loading through the
    connector, summed over the window's replicas) exceed what the shared tier's own lookups
    found in the same window (LMCache's lookup-hit counter, the delta of the tier's own scrapes):
    the connector can load only what a lookup found, so one of the two accounts is wrong. Only
    where the run scraped the tier for the window (collectors/_metrics.py); the hits are held to
    their own scrapes by hits-inconsistent."""
    src.rederive()  # kv_tier_deltas
    if not src.rows("SELECT 1 AS tier FROM kv_tier_deltas LIMIT 1"):
        return []  # no tier scraped anywhere: nothing to compare
    rows = src.rows(
        f"""WITH t AS (SELECT * FROM kv_tier_deltas),
                 h AS (SELECT run_id, block_id, coalesce(request_id, 'window ' || "window") AS scope,
                              sum(external_hit_tokens) AS external_hit_tokens, min(seq) AS seq,
                              list(DISTINCT replica ORDER BY replica) AS replicas
                       FROM kv_hits WHERE {SCOPE} GROUP BY ALL)
            SELECT h.run_id, h.block_id, h.scope, h.external_hit_tokens, h.replicas,
                   t.lmcache_hit_tokens
            FROM h JOIN t ON t.run_id IS NOT DISTINCT FROM h.run_id
             AND t.block_id IS NOT DISTINCT FROM h.block_id AND t.scope = h.scope
            WHERE t.lmcache_hit_tokens IS NOT NULL AND h.external_hit_tokens > t.lmcache_hit_tokens
            ORDER BY h.seq""",
        {"run": run},
    )
    return [
        finding(
            "external-hits-unfound",
            r,
            r["scope"],
            f"replica(s) {', '.join(map(str, r['replicas']))}: {r['external_hit_tokens']} external hit "
            f"tokens loaded through the connector, but the shared tier's own lookups found "
            f"{r['lmcache_hit_tokens']} (its metrics.scraped before/after)",
        )
        for r in rows
    ]


def counter_mismatch(src: Source, run: str | None) -> list[Finding]:
    """Single-request windows (complete responses) whose counter deltas disagree with the response:
    prefix queries ≠ prompt tokens, local + external hits ≠ cached tokens (when reported), or a
    counter that went down during the window."""
    rows = src.rows(
        f"""SELECT run_id, block_id, request_id, prefix_queries, prompt_tokens, cached_tokens,
                               local_hit_tokens + coalesce(external_hit_tokens, 0) AS hit_tokens,
                               coalesce(counter_reset, false) AS counter_reset FROM kv_requests
                        WHERE has_hits AND prompt_tokens IS NOT NULL AND status = 200 AND error IS NULL
                          AND (prefix_queries IS DISTINCT FROM prompt_tokens
                               OR (cached_tokens IS NOT NULL
                                   AND local_hit_tokens + coalesce(external_hit_tokens, 0) IS DISTINCT FROM
                                       cached_tokens)
                               OR coalesce(counter_reset, false))
                          AND {SCOPE} ORDER BY seq""",
        {"run": run},
    )
    out = []
    for r in rows:
        problems = []
        if r["prefix_queries"] != r["prompt_tokens"]:
            problems.append(
                f"prefix-query increment {_count(r['prefix_queries'])} ≠ prompt tokens {r['prompt_tokens']}"
            )
        if r["cached_tokens"] is not None and r["hit_tokens"] != r["cached_tokens"]:
            problems.append(f"hit increments {_count(r['hit_tokens'])} ≠ cached tokens {r['cached_tokens']}")
        if r["counter_reset"]:
            problems.append("a counter went down during the window (restart)")
        out.append(finding("counter-mismatch", r, r["request_id"], "; ".join(problems)))
    return out


_MANIFEST_HELP = (
    "supply a manifest: on a trusted copy run `ledger checkpoint manifest DIR > MANIFEST.json` "
    "(JSON {file: sha256}; sha256sum output also works), then `ledger checkpoint audit DIR --manifest "
    "MANIFEST.json` (vllm target: --param manifest=MANIFEST.json), or audit a Hugging Face cache "
    "snapshot (hub/models--ORG--NAME/snapshots/REV)"
)


def _checkpoint_rows(src: Source, run: str | None) -> list[dict[str, Any]]:
    """Each ``checkpoint.audited`` with its files compared again here, not read from ``matched``."""
    rows = src.rows(
        f"SELECT run_id, path, revision, matched, stable, files, missing FROM kv_checkpoints "
        f"WHERE {SCOPE} ORDER BY seq",
        {"run": run},
    )
    for r in rows:
        files = [f for f in json.loads(r["files"] or "[]") if isinstance(f, dict)]
        bad, unreferenced = [], []
        for f in files:
            name = f.get("name", "?")
            if f.get("expected_sha256"):
                if f.get("sha256") != f["expected_sha256"]:
                    bad.append(f"{name} (SHA-256)")
            elif f.get("expected_git_sha1"):
                if f.get("git_sha1") != f["expected_git_sha1"]:
                    bad.append(f"{name} (git blob SHA-1)")
            else:
                unreferenced.append(name)
        r["bad"], r["unreferenced"] = sorted(bad), sorted(unreferenced)
        r["missing"] = sorted(json.loads(r["missing"] or "[]"))
        r["unverified"] = not r["missing"] and len(unreferenced) == len(files)
    return rows


def checkpoint_mismatch(src: Source, run: str | None) -> list[Finding]:
    out = []
    for r in _checkpoint_rows(src, run):
        problems = []
        if r["bad"]:
            problems.append("differs for " + ", ".join(r["bad"]))
        if r["missing"]:
            problems.append("missing " + ", ".join(r["missing"]))
        if r["unreferenced"] and not r["unverified"]:
            problems.append("not in the reference: " + ", ".join(r["unreferenced"]))
        if not problems and r["matched"] is False:
            problems.append("recorded matched: false")
        if problems:
            out.append(
                finding(
                    "checkpoint-mismatch", r, r["path"], f"revision {r['revision']}: " + "; ".join(problems)
                )
            )
        if r["stable"] is False:
            out.append(finding("checkpoint-mismatch", r, r["path"], "files changed while being read"))
    return out


def checkpoint_unverified(src: Source, run: str | None) -> list[Finding]:
    return [
        finding(
            "checkpoint-unverified",
            r,
            r["path"],
            f"revision {r['revision']}: {len(r['unreferenced'])} file(s) with no reference to check "
            f"against (no manifest, not a Hugging Face cache snapshot); {_MANIFEST_HELP}",
        )
        for r in _checkpoint_rows(src, run)
        if r["unverified"]
    ]


def provenance_missing(src: Source, run: str | None) -> list[Finding]:
    rows = src.rows(
        f"""
        SELECT r.run_id, r.experiment, r.code_commit, CAST(r.packages AS VARCHAR) AS packages,
               (SELECT count(*) FROM kv_launches l WHERE l.run_id = r.run_id) AS launches,
               coalesce(r.target = 'vllm', false)
                 OR EXISTS (SELECT 1 FROM kv_launches l
                            WHERE l.run_id = r.run_id AND l.target = 'vllm') AS vllm,
               EXISTS (SELECT 1 FROM kv_checkpoints c WHERE c.run_id = r.run_id
                       OR c.revision IN (SELECT revision FROM kv_launches l
                                         WHERE l.run_id = r.run_id)) AS audited
        FROM kv_runs r WHERE {SCOPE.replace("run_id", "r.run_id")} ORDER BY r.seq""",
        {"run": run},
    )
    out = []
    for r in rows:
        missing = []
        if not r["code_commit"]:
            missing.append("code version")
        if r["packages"] in (None, "{}", "null"):
            missing.append("package versions")
        probe = str(r["experiment"]).startswith("probe.")
        if not probe and not r["launches"]:
            missing.append("launch records")
        if not probe and r["vllm"] and not r["audited"]:
            missing.append("checkpoint audit")
        if missing:
            out.append(finding("provenance-missing", r, r["run_id"], "run lacks " + ", ".join(missing)))
    return out


def validation_missing(src: Source, run: str | None) -> list[Finding]:
    """ON configs without every validation layer their path needs. A validation run passes its
    config only where its checks' observations pass them too: one with a check recorded as passed
    that its observations fail (kv_rederived) passes nothing, so that a run's own audit does not
    publish on it (that validation run's assertion-inconsistent is its own finding)."""
    src.rederive()
    # Ledger-wide, asked once per source (audit_runs audits several runs from one).
    contradicted = {
        str(r["run_id"])
        for r in src.rows_once(
            """SELECT DISTINCT d.run_id FROM kv_rederived_disputed d JOIN kv_validation v USING (run_id)
               WHERE d.recorded_passed AND NOT coalesce(d.derived_passed, true)"""
        )
    }
    *_, scope = coverage(src, run, per_run=True, contradicted=contradicted)
    out = []
    for cfg in scope["configs"]:
        if cfg["passed"]:
            continue
        missing = [
            name
            + (f" ({cfg['notes'][name]})" if name in cfg["notes"] else "")
            + (" (failed)" if cfg["layers"][name] == "failed" else "")
            for name in cfg["missing"]
        ]
        out.append(
            finding(
                "validation-missing",
                {"run_id": cfg["runs"][0]},
                cfg["config_sha256"],
                f"ON config ({'/'.join(cfg['transfer_paths'])} path) has performance results "
                f"but no passing {', '.join(missing)}",
            )
        )
    return out


def _isolation_rederived(src: Source) -> dict[int, list[str]]:
    """Each isolation certificate whose run's observations the source holds, re-derived from its
    own run's probes (seq → the conditions that fail; empty: it passes), by
    experiments/_isolation.py's rules over what the ledger holds of each probe it names: its
    request.sent (``probe`` isolation), its first response and its hits.observed (kv_requests).
    LMCache's lookup hit tokens, all of them and those of the probe's own salt, are the deltas of
    the probe's own scrapes (:func:`_probe_lookups`); every other tier is the probe's response and
    hits record. The replicas to cover are the block's launches. Once per source: a run's own
    certificate and those that certify another run's configs (reports/_source.py run_scope) are
    read from it."""
    return src.once("isolation_rederived", lambda: _rederive_isolation(src))


_Lookups = dict[tuple[str, str], tuple[int | None, int | None]]

# Every isolation certificate, asked once per source by its re-derivation and by isolation-missing.
_CERTIFICATES = """SELECT seq, run_id, block_id, config_sha256, passed, problems, prime_request_id,
                          repeat_request_id, other_salt
                   FROM kv_isolation ORDER BY seq"""


def _probe_lookups(src: Source) -> _Lookups:
    """Each isolation probe's LMCache hit tokens, as the runner takes them (collectors/_metrics.py,
    experiments/_isolation.py): the lookup counter's delta, and that of its series labelled with
    the probe's own cache salt (its request.sent's namespace), over the shared tier's scrapes
    around the probe where the run scraped a tier for it, else the probe's replica's own (an
    in-process connector exposes them there); None where a scrape failed or no scrape has the
    counter (or the salt's series). The probes' windows alone are computed."""
    src.rederive()  # kv_scrape_windows
    windows = """SELECT w.*, q.namespace FROM kv_scrape_windows w
                 JOIN (SELECT run_id, request_id, namespace FROM kv_requests WHERE probe = 'isolation') q
                 USING (run_id, request_id)"""
    tier: _Lookups = {}
    own: _Lookups = {}
    for r in src.rows(scrape_deltas(windows, only="lmcache_hit_tokens", salt="namespace")):
        found = tier if r["replica"] == "tier" else own
        found[(r["run_id"], r["request_id"])] = (r["lmcache_hit_tokens"], r["salt_hit_tokens"])
    return {**own, **tier}


def _rederive_isolation(src: Source) -> dict[int, list[str]]:
    held = None if src.scope is None else src.scope.runs
    certs = [c for c in src.rows_once(_CERTIFICATES) if held is None or c["run_id"] in held]
    if not certs:
        return {}
    probes = {
        (r["run_id"], r["request_id"]): r
        for r in src.rows(
            """SELECT run_id, request_id, replica, status, error, cached_tokens, has_hits,
                      local_hit_tokens, external_hit_tokens
               FROM kv_requests WHERE probe = 'isolation'"""
        )
    }
    replicas = {
        r["block_id"]: set(r["replicas"])
        for r in src.rows_once(
            "SELECT block_id, list(DISTINCT replica) AS replicas FROM kv_launches "
            "WHERE block_id IS NOT NULL AND replica IS NOT NULL GROUP BY block_id"
        )
    }
    lookups = _probe_lookups(src)
    out: dict[int, list[str]] = {}
    for c in certs:
        problems: list[str] = []

        def probe(request_id: Any, what: str, run_id: Any = c["run_id"], found: list[str] = problems) -> Any:
            row = probes.get((run_id, request_id)) if isinstance(request_id, str) else None
            if row is None:
                found.append(f"the {what} is no isolation probe of this run's")
            elif row["status"] != 200 or row["error"] is not None:
                found.append(f"the {what} failed: status {row['status']}, error {row['error']}")
            return row

        probe(c["prime_request_id"], "prime under salt A")
        repeat = probe(c["repeat_request_id"], "repeat under salt A")
        if repeat is not None:
            hits = repeat["has_hits"]
            reused = (
                repeat["local_hit_tokens"] if hits else None,
                repeat["external_hit_tokens"] if hits else None,
                repeat["cached_tokens"],
                lookups.get((repeat["run_id"], repeat["request_id"]), (None, None))[0],
            )
            if not any(reused):
                problems.append("the repeat under salt A hit nothing on any tier")
        others = json.loads(c["other_salt"] or "null") or []
        covered: set[str] = set()
        for other in others:
            row = probe(other.get("request_id"), f"probe under salt B on replica {other.get('replica')}")
            if row is None:
                continue
            replica, hits = str(row["replica"]), row["has_hits"]
            lmcache = lookups.get((row["run_id"], row["request_id"]), (None, None))
            covered.add(replica)
            tiers = {
                "local hit tokens": row["local_hit_tokens"] if hits else None,
                "external hit tokens": row["external_hit_tokens"] if hits else None,
                "cached tokens": row["cached_tokens"],
                "LMCache lookup hit tokens": lmcache[0],
                "LMCache hit tokens of its salt": lmcache[1],
            }
            problems += [
                f"replica {replica} under salt B saw {value} {tier}" for tier, value in tiers.items() if value
            ]
            problems += [
                f"replica {replica} under salt B: {tier} not read"
                for tier in ("local hit tokens", "external hit tokens")
                if tiers[tier] is None
            ]
        uncovered = sorted(replicas.get(c["block_id"], set()) - covered)
        if not others or uncovered:
            problems.append(
                "no probe under salt B" + (f" on replica {', '.join(uncovered)}" if uncovered else "")
            )
        out[int(c["seq"])] = problems
    return out


def isolation_missing(src: Source, run: str | None) -> list[Finding]:
    """ON configs with performance results and no certificate that passes re-derived
    (_isolation_rederived), whose own run's certificate failed (its problems named), or whose own
    run's certificate is recorded as passed while its probes' observations fail it. A run with no
    certificate of its own for a config is certified by the config's latest certificate recorded
    as passed, re-derived from that run's probes (the source holds them: reports/_source.py
    run_scope)."""
    derived = _isolation_rederived(src)
    rows = src.rows(
        f"""SELECT DISTINCT run_id, config_sha256 FROM kv_on_configs WHERE {SCOPE}
            ORDER BY run_id, config_sha256""",
        {"run": run},
    )
    passed: dict[str, list[dict[str, Any]]] = {}
    failed: dict[tuple[str, str], list[Any]] = {}  # (config, run) → its last failed certificate's problems
    for c in src.rows_once(_CERTIFICATES):
        if c["passed"]:
            passed.setdefault(c["config_sha256"], []).append(c)
        else:
            failed[(c["config_sha256"], c["run_id"])] = json.loads(c["problems"] or "null") or []
    out = []
    for r in rows:
        recorded = passed.get(r["config_sha256"], [])
        own = [c for c in recorded if c["run_id"] == r["run_id"]]
        contradicted = [p for c in own for p in derived.get(int(c["seq"]), [])]
        # A run with no certificate of its own for the config: the config's latest certificate
        # recorded as passed (another run's) certifies it once its own probes pass it again; one
        # whose run's observations the source does not hold is not re-derived, and proves nothing.
        certifier = recorded[-1] if recorded and not own else None
        passing = certifier is not None and derived.get(int(certifier["seq"])) == []
        own_failed = failed.get((r["config_sha256"], r["run_id"]))
        if own_failed is not None:
            problems = "; ".join(str(p) for p in own_failed) or "no problem recorded"
            detail = f"ON config's isolation certificate failed in this run: {problems}"
        elif contradicted:
            detail = (
                "ON config's isolation certificate is recorded as passed, but its own probes' observations "
                f"fail it: {'; '.join(dict.fromkeys(contradicted))}"
            )
        elif own or passing:
            continue
        elif certifier is not None:
            seq = int(certifier["seq"])
            failing = "; ".join(derived[seq]) if seq in derived else "its run's probes were not read"
            detail = (
                "ON config has no isolation certificate of its own in this run, and the config's latest "
                f"recorded as passed (run {certifier['run_id']}'s, seq {seq}) is failed by its own probes' "
                f"observations: {failing}"
            )
        else:
            detail = (
                "ON config has performance results but no isolation certificate (a repeat under one "
                "cache_salt that hits, the same payload under another that hits nothing on any tier)"
            )
        out.append(finding("isolation-missing", r, r["config_sha256"], detail))
    return out


_DIVERGENCE_CODES = {
    "state-corruption": "state-corruption",
    "numeric-tie": "numeric-tie",
    "inconclusive": "divergence-inconclusive",
}


def divergences(src: Source, run: str | None) -> list[Finding]:
    """Each triaged divergence under its class, as derived again from the recorded re-sends."""
    rows = src.rows(
        f"""SELECT run_id, block_id, request_id, trigger, first_divergent_token, margin, tie_margin,
                   resends_ok, resends_agree, resends_match_divergent, recorded_class, derived_class
            FROM kv_divergences WHERE {SCOPE} ORDER BY seq""",
        {"run": run},
    )
    out = []
    for r in rows:
        margin = "unknown" if r["margin"] is None else f"{r['margin']:.3g}"
        where = "unknown" if r["first_divergent_token"] is None else str(r["first_divergent_token"])
        resends = (
            "a re-send failed"
            if not r["resends_ok"]
            else ("the cold re-sends agree" if r["resends_agree"] else "the cold re-sends disagree")
            + (" with each other and with the divergent answer" if r["resends_match_divergent"] else "")
        )
        detail = (
            f"{r['trigger']} divergence: first divergent token {where}, top-2 margin {margin} "
            f"(tie below {r['tie_margin']:g}); {resends}"
        )
        if r["recorded_class"] != r["derived_class"]:
            detail += f" (recorded as {r['recorded_class']})"
        out.append(finding(_DIVERGENCE_CODES[r["derived_class"]], r, r["request_id"], detail))
    return out


def pinned_rounding(src: Source, run: str | None) -> list[Finding]:
    """Pinned allocations whose reserved bytes exceed the tolerance, with no recorded setting fixing it.

    Tied to configs, as the layer is: where GPU ON configs are in the ledger, only the sizes that
    judge one of them (the pool of its LMCache version and ops state, else torch's); in a ledger
    of probes alone, every size probed."""
    _, _, pinned, _, scope = coverage(src, None)
    gpu = [c for c in scope["configs"] if c["layers"][BYTES] != NOT_APPLICABLE]
    judging = {id(s) for c in gpu for s in config_pinned_sizes(c, pinned["sizes"])}
    out = []
    for s in pinned["sizes"]:
        if s["passed"] or (run is not None and run not in s["runs"]) or (gpu and id(s) not in judging):
            continue
        reserved = s["bytes_reserved"]
        ratio = f" ({reserved / s['bytes_requested']:.2f}x)" if reserved else ""
        state = "pinned" if s["is_pinned"] else "not pinned"
        tried = ", ".join(s["tried"]) or "none"
        refused = f"; refused by torch: {', '.join(s['refused'])}" if s["refused"] else ""
        error = f"; error: {s['error']}" if s["error"] else ""
        out.append(
            finding(
                "pinned-rounding",
                {"run_id": s["run_id"]},
                f"{s['bytes_requested']} bytes",
                f"{s['series']}: requested {s['bytes_requested']} bytes, reserved {reserved} bytes{ratio}, "
                f"{state}; beyond {TOLERANCE_TEXT} and no recorded setting brings it within "
                f"(tried: {tried}){refused}{error}",
            )
        )
    return out


def helper_probe_failed(src: Source, run: str | None) -> list[Finding]:
    """ON configs on LMCache's lazy allocator whose helper path failed a byte check."""
    _, helpers, _, _, scope = coverage(src, run, per_run=True)
    out = []
    for cfg in scope["configs"]:
        if cfg["lmcache_allocator"] != "lazy" or cfg["layers"].get(HELPERS) != "failed":
            continue
        failed = [p for p in config_helper_paths(cfg, helpers["paths"]) if p["failed"]]
        parts = [
            f"{p['direction']} {'delayed' if p['delayed'] else 'undelayed'} "
            f"{'with' if p['with_ops'] else 'without'} compiled ops via {p['copy']}: "
            f"{p['failed']} of {p['checks']} failed"
            for p in failed
        ]
        offsets = [p["first_bad_offset"] for p in failed if p["first_bad_offset"] is not None]
        first = min(offsets, default=None)
        out.append(
            finding(
                "helper-probe-failed",
                {"run_id": cfg["runs"][0]},
                cfg["config_sha256"],
                f"lazy allocator on LMCache {cfg['lmcache_version']}: "
                + "; ".join(parts)
                + (f"; first bad byte at offset {first}" if first is not None else ""),
            )
        )
    return out


def order_unbalanced(src: Source, run: str | None) -> list[Finding]:
    rows = src.rows(
        f"""SELECT run_id, list(arm ORDER BY position, seq) AS arms, list(pair ORDER BY position, seq)
                          AS pairs, CAST(arg_min("order", position) AS VARCHAR) AS recorded
                        FROM kv_blocks WHERE paired AND {SCOPE} GROUP BY run_id ORDER BY run_id""",
        {"run": run},
    )
    out = []
    for r in rows:
        problem = _order_problem(list(r["arms"]), list(r["pairs"]), r["recorded"])
        if problem:
            out.append(finding("order-unbalanced", r, "–".join(r["arms"]), problem))
    return out


def _order_problem(arms: list[str], pairs: list[int], recorded: str | None) -> str | None:
    """Balanced: equal ON/OFF counts, one of each per pair, equal mean position (no linear drift confound)."""
    on = [i for i, a in enumerate(arms) if a == "ON"]
    off = [i for i, a in enumerate(arms) if a == "OFF"]
    if recorded and recorded != "null" and json.loads(recorded) != arms:
        return f"blocks ran as {'–'.join(arms)} but the run recorded order {recorded}"
    if len(on) != len(off):
        return f"{len(on)} ON and {len(off)} OFF blocks"
    by_pair: dict[int, list[str]] = {}
    for arm, pair in zip(arms, pairs, strict=True):
        by_pair.setdefault(pair, []).append(arm)
    if any(sorted(v) != ["OFF", "ON"] for v in by_pair.values()):
        return "a block pair does not hold exactly one ON and one OFF block"
    if sum(on) != sum(off):
        return (
            f"order {'–'.join(arms)} confounds arm with time (mean positions differ; use e.g. OFF–ON–ON–OFF)"
        )
    return None


def blocks_not_restarted(src: Source, run: str | None) -> list[Finding]:
    """Blocks that did not start on a fresh deployment (attach mode): arms share caches and counters."""
    rows = src.rows(
        f"""SELECT run_id, block_id, arm, position FROM kv_blocks
                        WHERE restarted = false AND {SCOPE} ORDER BY seq""",
        {"run": run},
    )
    return [
        finding(
            "blocks-not-restarted",
            r,
            r["block_id"],
            f"{r['arm']} block {r['position']} ran on a deployment that was not restarted for it "
            "(attach mode): caches and counters carry over, so arms are not independent",
        )
        for r in rows
    ]


def tier_warm_at_start(src: Source, run: str | None) -> list[Finding]:
    """Blocks whose shared tier already held data before their first request (cache.inspected:
    its stored objects or resident bytes above zero): what an earlier block stored can be served
    in this one, so the block's start is not the cold state its design assumes."""
    rows = src.rows(
        f"""SELECT run_id, block_id, arm, position, lmcache_stored_objects, lmcache_metric,
                   lmcache_stored_bytes, lmcache_bytes_metric
            FROM kv_block_states
            WHERE (lmcache_stored_objects > 0 OR lmcache_stored_bytes > 0) AND {SCOPE} ORDER BY seq""",
        {"run": run},
    )

    def held(r: dict[str, Any]) -> str:
        parts = [
            f"{r[value]:,} ({r[metric]})"
            for value, metric in (
                ("lmcache_stored_objects", "lmcache_metric"),
                ("lmcache_stored_bytes", "lmcache_bytes_metric"),
            )
            if r[value]
        ]
        return " and ".join(parts)

    return [
        finding(
            "tier-warm-at-start",
            r,
            r["block_id"],
            f"{r['arm']} block {r['position']}: the shared tier held {held(r)} before the block's first "
            "request: what earlier blocks stored can be served in this one",
        )
        for r in rows
    ]


def hash_seed_unset(src: Source, run: str | None) -> list[Finding]:
    """ON configs whose replicas lack one common recorded PYTHONHASHSEED: they may share nothing."""
    rows = src.rows(
        f"""SELECT run_id, config_sha256, min(block_id) AS block_id,
                   list(coalesce(hash_seed, '(unset)') ORDER BY seq) AS seeds
            FROM kv_launches WHERE arm = 'ON' AND {SCOPE}
            GROUP BY run_id, config_sha256 ORDER BY run_id, config_sha256""",
        {"run": run},
    )
    out = []
    for r in rows:
        seeds = [str(s) for s in r["seeds"]]
        if "(unset)" in seeds or len(set(seeds)) > 1:
            out.append(
                finding(
                    "hash-seed-unset",
                    r,
                    r["config_sha256"],
                    f"ON replicas launched with PYTHONHASHSEED {', '.join(sorted(set(seeds)))}: "
                    "replicas hashing chunks with different seeds share nothing, silently",
                )
            )
    return out


def ttft_method_mixed(src: Source, run: str | None) -> list[Finding]:
    """TTFT figures of one table dated by different transports/clocks (``response.received.ttft_method``)."""
    by_run: dict[str, dict[str, int]] = {}
    for r in src.rows(
        f"""SELECT run_id, coalesce(ttft_method, 'unrecorded') AS method, count(*) AS n
                          FROM kv_ttft WHERE {SCOPE} GROUP BY ALL ORDER BY run_id, method""",
        {"run": run},
    ):
        by_run.setdefault(r["run_id"], {})[r["method"]] = r["n"]
    out = [
        finding(
            "ttft-method-mixed",
            {"run_id": rid},
            rid,
            "TTFT observations dated by "
            + ", ".join(f"{m} ({n})" for m, n in methods.items())
            + ": ON/OFF medians may compare different clocks",
        )
        for rid, methods in by_run.items()
        if len(methods) > 1
    ]
    uniform: dict[str, list[str]] = {}
    for rid, methods in by_run.items():
        if len(methods) == 1:
            uniform.setdefault(next(iter(methods)), []).append(rid)
    if len(uniform) > 1:
        out.append(
            finding(
                "ttft-method-mixed",
                {},
                "runs",
                "the TTFT table's runs were dated by different "
                "methods: "
                + "; ".join(f"{m}: {', '.join(r[:8] for r in rids)}" for m, rids in sorted(uniform.items())),
            )
        )
    return out


def plan_deviation(src: Source, run: str | None) -> list[Finding]:
    """What a run did that its registered plan did not say (reports/_plan.py), and runs of a
    plan-registering runner that registered none."""
    out = []
    for r in run_plans(src, run):
        if not r["plans"] and r["registers_plan"]:
            out.append(
                finding("plan-deviation", r, r["run_id"], "no plan.registered before the first request")
            )
        for block_id, target, detail in plan_deviations(src, r):
            out.append(finding("plan-deviation", {**r, "block_id": block_id}, target, detail))
    return out


def plan_unregistered(src: Source, run: str | None) -> list[Finding]:
    """Runs recorded before runs registered plans: nothing fixed their plan before the first request."""
    return [
        finding(
            "plan-unregistered",
            r,
            r["run_id"],
            f"{r['experiment']} run predates pre-registration (no plan.registered, a runner that did not "
            "register plans): its order and counts are judged only by what its blocks recorded",
        )
        for r in run_plans(src, run)
        if not r["plans"] and not r["registers_plan"]
    ]


def metrics_missing(src: Source, run: str | None) -> list[Finding]:
    """Hit counters the metric registry requires of the replica's engine version that a window's
    scrapes lacked (both scrapes taken, neither failed): recorded as null, which every table would
    read as zero. One finding per replica of a block and set of missing counters."""
    src.rederive()
    rows = src.rows(
        f"""SELECT h.run_id, h.block_id, h.replica, h.prefix_queries IS NULL AS prefix_queries,
                   h.local_hit_tokens IS NULL AS local_hit_tokens,
                   h.external_hit_tokens IS NULL AS external_hit_tokens,
                   any_value(l.engine_version) AS engine_version, count(DISTINCT h.seq) AS windows
            FROM kv_hits h
            JOIN kv_scrape_windows w ON w.run_id IS NOT DISTINCT FROM h.run_id
             AND w.block_id IS NOT DISTINCT FROM h.block_id AND w.replica = h.replica
             AND w.request_id IS NOT DISTINCT FROM h.request_id AND w."window" IS NOT DISTINCT FROM h."window"
            LEFT JOIN kv_launches l ON l.block_id = h.block_id AND l.replica = h.replica
            WHERE NOT w.failed AND w.befores > 0 AND w.afters > 0
              AND (h.prefix_queries IS NULL OR h.local_hit_tokens IS NULL OR h.external_hit_tokens IS NULL)
              AND {SCOPE.replace("run_id", "h.run_id")}
            GROUP BY ALL ORDER BY h.run_id, min(h.seq)""",
        {"run": run},
    )
    grouped: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        entry = names_for("vllm", r["engine_version"]) or METRIC_REGISTRY[-1]
        missing = tuple(entry.series[k] for k in sorted(entry.required) if r[k])
        if missing:
            key = (r["run_id"], r["block_id"], r["replica"], missing)
            grouped.setdefault(key, {**r, "missing": missing, "windows": 0})["windows"] += r["windows"]
    return [
        finding(
            "metrics-missing",
            g,
            f"replica {g['replica']}",
            f"{', '.join(g['missing'])} missing from {g['windows']} window(s)' scrapes (vLLM "
            f"{g['engine_version'] or 'version unrecorded'} exposes it): its hit deltas are unknown, "
            "not zero",
        )
        for g in grouped.values()
    ]


def known_incompatible_stack(src: Source, run: str | None) -> list[Finding]:
    """ON configurations launched on an engine and LMCache version pair known to disagree on KV layout."""
    rows = src.rows(
        f"""SELECT run_id, config_sha256, min(block_id) AS block_id, engine_version, lmcache_version
            FROM kv_launches WHERE arm = 'ON' AND {SCOPE} GROUP BY ALL ORDER BY run_id, config_sha256""",
        {"run": run},
    )
    out = []
    for r in rows:
        bad = incompatible("vllm", r["engine_version"], r["lmcache_version"])
        if bad is not None:
            out.append(
                finding(
                    "known-incompatible-stack",
                    r,
                    r["config_sha256"],
                    f"vLLM {r['engine_version']} with LMCache {r['lmcache_version']}: {bad.reason}",
                )
            )
    return out


def declared_exclusion(src: Source, run: str | None) -> list[Finding]:
    rows = src.rows(
        f"""SELECT run_id, event_block AS block_id, scope, target, reason FROM kv_declared
                        WHERE {SCOPE} ORDER BY seq""",
        {"run": run},
    )
    return [
        finding("declared-exclusion", r, r["target"], f"{r['scope']} excluded: {r['reason']}") for r in rows
    ]


def imported_results(src: Source, run: str | None) -> list[Finding]:
    """What another tool's result file (ledger import --from) lacks that a kvledger run records."""
    rows = src.rows(f"SELECT * FROM kv_imports WHERE {SCOPE} ORDER BY seq", {"run": run})
    out = []
    for r in rows:
        version = r["tool_version"] or "(version not recorded)"
        what = f"{r['tool']} {version} results {r['file_name']} ({r['recorded_requests']} requests)"
        out.append(
            finding(
                "import-unpaired",
                r,
                r["file_name"],
                f"{what}: no ON/OFF blocks, so no request has a partner with sharing off; "
                "its figures compare nothing",
            )
        )
        # A tool's file holds no scrapes of the engines' counters; at most the responses' own
        # cached-token totals, which do not tell a local hit from a cross-replica one.
        counted = r["with_cached_tokens"]
        lack = (
            f"only the responses' cached-token totals ({counted} of {r['recorded_requests']} requests), "
            "not split into local and cross-replica hits nor checked against the engines' counters"
            if counted
            else "no hit counters or cached-token counts"
        )
        out.append(
            finding(
                "import-no-hit-counters",
                r,
                r["file_name"],
                f"{what}: {lack}; whether any prefix was reused, locally or across replicas, is unknown",
            )
        )
        out.append(
            finding(
                "import-unvalidated",
                r,
                r["file_name"],
                f"{what}: no answer checked against expected values and no validation layer; "
                "a fast but wrong cache looks the same as a right one",
            )
        )
    return out


CHECKS: tuple[Check, ...] = (
    chain_broken,
    snapshot_mismatch,
    run_incomplete,
    request_id_reused,
    block_id_reused,
    namespace_leak,
    pairing,
    warmup_in_measurement,
    assertion_failed,
    assertion_inconsistent,
    hits_inconsistent,
    assertion_not_independent,
    off_arm_external_hits,
    missing_full_prefix_hit,
    counter_mismatch,
    external_hits_unfound,
    checkpoint_mismatch,
    checkpoint_unverified,
    provenance_missing,
    validation_missing,
    isolation_missing,
    divergences,
    pinned_rounding,
    helper_probe_failed,
    order_unbalanced,
    blocks_not_restarted,
    tier_warm_at_start,
    hash_seed_unset,
    ttft_method_mixed,
    plan_deviation,
    plan_unregistered,
    metrics_missing,
    known_incompatible_stack,
    declared_exclusion,
    imported_results,
)


def _acknowledged(src: Source) -> tuple[set[str], set[str]]:
    """Blocks and runs the researcher excluded explicitly."""
    rows = src.rows("SELECT scope, target FROM kv_declared")
    blocks = {r["target"] for r in rows if r["scope"] == "block"}
    runs = {r["target"] for r in rows if r["scope"] == "run"}
    return blocks, runs


# Findings about the ledger or a configuration, not about data an exclusion could set aside.
_NOT_DOWNGRADED = ("chain-broken", "snapshot-mismatch", "validation-missing", "isolation-missing")


def _downgrade(f: Finding, blocks: set[str], runs: set[str]) -> Finding:
    if f.severity != BLOCKING or f.code in _NOT_DOWNGRADED:
        return f
    if (f.block_id and f.block_id in blocks) or (f.run_id and f.run_id in runs):
        return Finding(
            f.code, INFO, f.run_id, f.block_id, f.target, f.detail + " (acknowledged: declared exclusion)"
        )
    return f


# The checks that read the re-derivations (Source.rederive): run after the others, so that the
# others' queries and Python overlap the re-derivations' build where it is still going on beside.
_AFTER_REDERIVED = (
    assertion_failed,
    assertion_inconsistent,
    hits_inconsistent,
    external_hits_unfound,
    isolation_missing,
    metrics_missing,
    validation_missing,
)
_IN_ORDER = (*(c for c in CHECKS if c not in _AFTER_REDERIVED), *_AFTER_REDERIVED)


def audit(src: Source, run: str | None = None) -> list[Finding]:
    """Every finding, sorted deterministically (blocking first)."""
    src.require(run)
    return audit_of_source(src, run)


def audit_of_source(src: Source, run: str | None = None) -> list[Finding]:
    """:func:`audit` of what ``src`` holds (with ``run`` None: every run it holds, where it may
    hold only some runs' observations; reports/_stream.py keeps each run's findings from the
    source that holds that run whole)."""
    with no_cycle_collection():
        blocks, runs = _acknowledged(src)
        found = [_downgrade(f, blocks, runs) for check in _IN_ORDER for f in check(src, run)]
        return sorted(found, key=Finding.sort_key)


EXAMPLES = 3


def grouped(findings: list[dict[str, Any]], examples: int = EXAMPLES) -> list[dict[str, Any]]:
    """Findings grouped by severity and code, in order: ``{severity, code, count, examples}``,
    with the first ``examples`` instances (the terminal view; ``--json`` keeps every one)."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for f in findings:
        group = groups.setdefault(
            (str(f["severity"]), str(f["code"])),
            {"severity": f["severity"], "code": f["code"], "count": 0, "examples": []},
        )
        group["count"] += 1
        if len(group["examples"]) < examples:
            group["examples"].append(f)
    return list(groups.values())


def audit_json(src: Source, run: str | None = None) -> dict[str, Any]:
    """The ``ledger audit --json`` object."""
    return audit_object(audit(src, run), src.head)


def audit_object(findings: list[Finding], head: Head | None) -> dict[str, Any]:
    """The ``ledger audit --json`` object of ``findings`` derived at ``head``."""
    return {"findings": [f.as_dict() for f in findings], "head": head.chain if head else None}


def audit_runs(src: Source, runs: list[str]) -> list[Finding]:
    """The findings of each run's audit (:func:`audit`), from one source, as one list: a finding
    that several runs' audits give alike (one about the ledger, such as ``chain-broken``) once,
    sorted as :func:`audit` sorts. No runs: the whole ledger's audit."""
    if not runs:
        return audit(src)
    found = dict.fromkeys(f for run in runs for f in audit(src, run))
    return sorted(found, key=Finding.sort_key)


def audit_runs_json(src: Source, runs: list[str]) -> dict[str, Any]:
    """The ``ledger audit --json`` object of :func:`audit_runs` (that of :func:`audit_json` for
    none or one run)."""
    return audit_object(audit_runs(src, runs), src.head)
