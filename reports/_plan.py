"""Pre-registration: each run held to the plan it registered before its first request.

``plan.registered`` fixes the block order (and the rule and seed behind it),
the measured requests per block by workload and step, the warmups, the sizes
and the thresholds the checks use. :func:`plan_findings` compares what
happened with it and names every difference (``plan-deviation``). A run that
has blocks but no plan is a deviation when its runner registers plans
(``run.started.registers_plan``), and ``plan-unregistered`` (a warning) when
it was recorded before plans were registered: its order and counts are then
judged only by what its blocks recorded (``order-unbalanced``, pairing).
Probe requests (the isolation certificate, divergence triage: ``request.sent.probe``)
are never measured and depend on what the run finds, so no plan counts them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from ._stats import MIN_PAIRS_FOR_TEST

__all__ = ["plan_deviations", "run_plans"]

SCOPE = "($run IS NULL OR run_id = $run)"
Deviation = tuple[str | None, str, str]
"""(block_id, target, detail)."""


def _load(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def run_plans(src: Any, run: str | None) -> list[dict[str, Any]]:
    """Runs with blocks in scope, each with its registered plans (seq order) and first request."""
    runs = src.rows(
        f"""SELECT r.run_id, r.experiment, r.seed, r.registers_plan, r.finish_status,
                   (SELECT min(q.seq) FROM kv_requests q WHERE q.run_id = r.run_id) AS first_request_seq
            FROM kv_runs r WHERE EXISTS (SELECT 1 FROM kv_run_blocks b WHERE b.run_id = r.run_id)
              AND {SCOPE.replace("run_id", "r.run_id")} ORDER BY r.seq""",
        {"run": run},
    )
    plans: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in src.rows(f"SELECT * FROM kv_plans WHERE {SCOPE} ORDER BY seq", {"run": run}):
        for key in ("order", "requests_per_block", "sizes", "thresholds"):
            p[key] = _load(p[key])
        plans[p["run_id"]].append(p)
    for r in runs:
        r["plans"] = plans.get(r["run_id"], [])
    return runs


def _counts(src: Any, run_id: str) -> dict[str, dict[tuple[str, str, bool], int]]:
    counts: dict[str, dict[tuple[str, str, bool], int]] = defaultdict(dict)
    for r in src.rows(
        """SELECT block_id, workload, step, warmup, count(*) AS n FROM kv_requests
           WHERE run_id = $run AND probe IS NULL GROUP BY ALL""",
        {"run": run_id},
    ):
        counts[r["block_id"]][(str(r["workload"]), str(r["step"]), bool(r["warmup"]))] = int(r["n"])
    return counts


def _block_counts(plan: dict[str, Any], sent: dict[tuple[str, str, bool], int]) -> list[str]:
    """Differences between one block's requests and the plan's, by workload and step."""
    registered: dict[str, dict[str, int]] = plan["requests_per_block"] or {}
    measured = {(w, s): n for (w, s, warm), n in sent.items() if not warm}
    out = []
    if set(registered) == {"*"}:  # only a total was registered
        want, got = int(registered["*"]["*"]), sum(measured.values())
        if want != got:
            out.append(f"{got} measured requests sent, {want} registered")
    elif registered:
        keys = {(w, s) for w, steps in registered.items() for s in steps} | set(measured)
        for w, s in sorted(keys):
            want, got = int(registered.get(w, {}).get(s, 0)), measured.get((w, s), 0)
            if want != got:
                out.append(f"{w}/{s}: {got} sent, {want} registered")
    warmups = sum(n for (_, _, warm), n in sent.items() if warm)
    if warmups != plan["warmups_per_block"]:
        out.append(f"{warmups} warmups sent, {plan['warmups_per_block']} registered")
    return out


def _sizes(src: Any, run_id: str, plan: dict[str, Any]) -> list[str]:
    """Each registered workload's nominal sizes against those its requests had."""
    ran: dict[str, set[int]] = defaultdict(set)
    for r in src.rows(
        """SELECT DISTINCT CASE WHEN q.warmup THEN 'warmup' ELSE q.workload END AS workload, q.nominal_tokens
           FROM kv_requests q JOIN kv_run_blocks b USING (block_id)
           WHERE q.run_id = $run AND b.finish_status = 'completed' AND q.nominal_tokens IS NOT NULL
             AND q.probe IS NULL""",
        {"run": run_id},
    ):
        ran[str(r["workload"])].add(int(r["nominal_tokens"]))
    out = []
    for workload, sizes in sorted((plan["sizes"] or {}).items()):
        want = sorted(int(x) for x in sizes)
        got = sorted(ran.get(workload, set()))
        if got and got != want:
            out.append(f"{workload} sizes ran {got}, registered {want}")
    return out


def _thresholds(src: Any, run_id: str, plan: dict[str, Any]) -> list[str]:
    """The thresholds the run's checks and this report used, against those registered."""
    t = plan["thresholds"] or {}
    out = []
    if "chunk_size" in t:
        used = {
            int(r["chunk_size"])
            for r in src.rows(
                """SELECT DISTINCT chunk_size FROM kv_assertions
                   WHERE run_id = $run AND "check" = 'full_prefix_hit' AND chunk_size IS NOT NULL""",
                {"run": run_id},
            )
        }
        if used - {t["chunk_size"]}:
            out.append(f"full_prefix_hit checked with chunk {sorted(used)}, registered {t['chunk_size']}")
    if "min_block_pairs_for_inference" in t and t["min_block_pairs_for_inference"] != MIN_PAIRS_FOR_TEST:
        out.append(
            f"the report computes intervals from {MIN_PAIRS_FOR_TEST} block pairs, "
            f"registered {t['min_block_pairs_for_inference']}"
        )
    if t.get("ttft_method"):
        used_methods = {
            str(r["ttft_method"])
            for r in src.rows(
                """SELECT DISTINCT ttft_method FROM kv_requests
                   WHERE run_id = $run AND ttft_method IS NOT NULL""",
                {"run": run_id},
            )
        }
        if used_methods - {t["ttft_method"]}:
            out.append(f"TTFT dated by {sorted(used_methods)}, registered {t['ttft_method']}")
    return out


def plan_deviations(src: Any, r: dict[str, Any]) -> list[Deviation]:
    """Every difference between run ``r`` (a :func:`run_plans` row) and its registered plan."""
    plans = r["plans"]
    if not plans:
        return []
    out: list[Deviation] = []
    run_id = r["run_id"]
    if len(plans) > 1:
        digests = ", ".join(p["plan_sha256"][:12] for p in plans)
        out.append((None, run_id, f"{len(plans)} plans registered ({digests}); the first is held"))
    plan = plans[0]
    if r["first_request_seq"] is not None and plan["seq"] > r["first_request_seq"]:
        out.append((None, run_id, "plan registered after the run's first request"))
    if plan["seed"] != r["seed"]:
        out.append((None, run_id, f"plan registered seed {plan['seed']}, the run used {r['seed']}"))
    order: list[str] = list(plan["order"] or [])
    blocks = src.rows(
        "SELECT block_id, position, arm, finish_status FROM kv_run_blocks WHERE run_id = $run ORDER BY seq",
        {"run": run_id},
    )
    for b in blocks:
        pos = b["position"]
        if pos is None or not 0 <= pos < len(order):
            out.append((b["block_id"], f"block {pos}", f"{b['arm']} block {pos} is not in the plan {order}"))
        elif order[pos] != b["arm"]:
            out.append(
                (b["block_id"], f"block {pos}", f"block {pos} ran {b['arm']}, registered {order[pos]}")
            )
    if r["finish_status"] == "completed" and len(blocks) != len(order):
        out.append((None, run_id, f"{len(blocks)} blocks ran, {len(order)} registered ({'–'.join(order)})"))
    counts = _counts(src, run_id)
    for b in blocks:
        if b["finish_status"] != "completed":
            continue  # a failed or aborted block is excluded and reported on its own
        differences = _block_counts(plan, counts.get(b["block_id"], {}))
        if differences:
            out.append(
                (b["block_id"], f"block {b['position']}", f"{b['arm']} block: " + "; ".join(differences))
            )
    out += [(None, run_id, d) for d in _sizes(src, run_id, plan)]
    out += [(None, run_id, d) for d in _thresholds(src, run_id, plan)]
    return out
