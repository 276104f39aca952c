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

from collections import defaultdict
from functools import cached_property
from typing import Any

import orjson

from ._stats import MIN_PAIRS_FOR_TEST

__all__ = ["plan_deviations", "run_plans"]

SCOPE = "($run IS NULL OR run_id = $run)"
Deviation = tuple[str | None, str, str]
"""(block_id, target, detail)."""


def _load(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, str) else value


def run_plans(src: Any, run: str | None) -> list[dict[str, Any]]:
    """Runs with blocks in scope, each with its registered plans (seq order) and first request:
    read once per source and run (two checks read them; neither changes them)."""
    return list(src.once(f"run_plans:{run}", lambda: _run_plans(src, run)))


def _run_plans(src: Any, run: str | None) -> list[dict[str, Any]]:
    runs = src.rows(
        f"""SELECT r.run_id, r.experiment, r.seed, r.registers_plan, r.finish_status,
                   (SELECT min(q.seq) FROM kv_requests q WHERE q.run_id = r.run_id) AS first_request_seq
            FROM kv_runs r WHERE EXISTS (SELECT 1 FROM kv_run_blocks b WHERE b.run_id = r.run_id)
              AND {SCOPE.replace("run_id", "r.run_id")} ORDER BY r.seq""",
        {"run": run},
    )
    scope = getattr(src, "scope", None)
    if run is None and scope is not None:
        # A source of some runs' observations, read about every run it holds (reports/_stream.py,
        # which keeps each run's findings from the source of its group): the runs of other groups
        # are not judged here, where their requests are not.
        runs = [r for r in runs if r["run_id"] in scope.runs]
    plans: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in src.rows(f"SELECT * FROM kv_plans WHERE {SCOPE} ORDER BY seq", {"run": run}):
        for key in ("order", "requests_per_block", "sizes", "thresholds"):
            p[key] = _load(p[key])
        plans[p["run_id"]].append(p)
    for r in runs:
        r["plans"] = plans.get(r["run_id"], [])
    return runs


class _Observed:
    """What every run did, as the plan checks compare it, read once per source by grouped
    queries: one query per run scanned the ledger's requests once per run (quadratic in runs)."""

    def __init__(self, src: Any) -> None:
        self.src = src

    def blocks(self, run_id: str) -> list[dict[str, Any]]:
        return self._blocks.get(run_id, [])

    def counts(self, run_id: str) -> dict[str, dict[tuple[str, str, bool], int]]:
        return self._counts.get(run_id, {})

    def sizes(self, run_id: str) -> dict[str, set[int]]:
        return self._sizes.get(run_id, {})

    def chunk_sizes(self, run_id: str) -> set[int]:
        return self._chunks.get(run_id, set())

    def ttft_methods(self, run_id: str) -> set[str]:
        return self._methods.get(run_id, set())

    @cached_property
    def _blocks(self) -> dict[str, list[dict[str, Any]]]:
        blocks: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for b in self.src.rows(
            "SELECT run_id, block_id, position, arm, finish_status FROM kv_run_blocks ORDER BY seq"
        ):
            blocks[b.pop("run_id")].append(b)
        return blocks

    @cached_property
    def _counts(self) -> dict[str, dict[str, dict[tuple[str, str, bool], int]]]:
        counts: dict[str, dict[str, dict[tuple[str, str, bool], int]]] = defaultdict(
            lambda: defaultdict(dict)
        )
        for run, block, workload, step, warmup, n in self.src.tuples(
            """SELECT run_id, block_id, workload, step, warmup, count(*) AS n FROM kv_requests
               WHERE probe IS NULL GROUP BY ALL"""
        ):
            counts[run][block][(str(workload), str(step), bool(warmup))] = int(n)
        return counts

    @cached_property
    def _sizes(self) -> dict[str, dict[str, set[int]]]:
        sizes: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        for run, workload, tokens in self.src.tuples(
            """SELECT DISTINCT q.run_id, CASE WHEN q.warmup THEN 'warmup' ELSE q.workload END AS workload,
                      q.nominal_tokens
               FROM kv_requests q JOIN kv_run_blocks b USING (block_id)
               WHERE b.finish_status = 'completed' AND q.nominal_tokens IS NOT NULL AND q.probe IS NULL"""
        ):
            sizes[run][str(workload)].add(int(tokens))
        return sizes

    @cached_property
    def _chunks(self) -> dict[str, set[int]]:
        chunks: dict[str, set[int]] = defaultdict(set)
        for run, chunk in self.src.tuples(
            """SELECT DISTINCT run_id, chunk_size FROM kv_assertions
               WHERE "check" = 'full_prefix_hit' AND chunk_size IS NOT NULL"""
        ):
            chunks[run].add(int(chunk))
        return chunks

    @cached_property
    def _methods(self) -> dict[str, set[str]]:
        methods: dict[str, set[str]] = defaultdict(set)
        for run, method in self.src.tuples(
            "SELECT DISTINCT run_id, ttft_method FROM kv_requests WHERE ttft_method IS NOT NULL"
        ):
            methods[run].add(str(method))
        return methods


def _observed(src: Any) -> _Observed:
    """The source's :class:`_Observed` (the source's tables do not change under it)."""
    observed: _Observed = src.once("plan-observed", lambda: _Observed(src))
    return observed


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
    ran = _observed(src).sizes(run_id)
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
        used = _observed(src).chunk_sizes(run_id)
        if used - {t["chunk_size"]}:
            out.append(f"full_prefix_hit checked with chunk {sorted(used)}, registered {t['chunk_size']}")
    if "min_block_pairs_for_inference" in t and t["min_block_pairs_for_inference"] != MIN_PAIRS_FOR_TEST:
        out.append(
            f"the report computes intervals from {MIN_PAIRS_FOR_TEST} block pairs, "
            f"registered {t['min_block_pairs_for_inference']}"
        )
    if t.get("ttft_method"):
        used_methods = _observed(src).ttft_methods(run_id)
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
    blocks = _observed(src).blocks(run_id)
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
    counts = _observed(src).counts(run_id)
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
