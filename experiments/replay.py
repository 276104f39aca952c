"""Replay: re-execute a recorded run from its recorded source, params and seed.

The script is loaded from ``run.started.source`` (not the file as it is now),
with the recorded params (the namespace tag included, so namespaces and hence
request bodies are the same bytes) and seed, into a new run whose
``run.started.replay_of`` names the original. Requests are compared by their
``request_key`` (block index and the experiment's own key), which is stable
even where concurrent windows reorder the emission. The replay must also
register the same plan (``plan.registered``'s ``plan_sha256``): its exact-value checks hold to
the limit its original registered, not to the model card as it is now.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ledger import Ledger, NewEvent, ReplayError

from ._loader import load_source
from ._params import CLIENT_PARAMS
from .runner import DERIVED_PARAMS, RunResult, prepare_params, run_sync
from .targets._registry import target_defaults

__all__ = ["Comparison", "ReplayError", "compare_runs", "print_comparison", "replay"]


@dataclass
class Comparison:
    """Per request key: the original and the replayed payload SHA-256."""

    original_run: str
    replay_run: str
    rows: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    result: RunResult | None = None
    plans: tuple[str | None, str | None] = (None, None)
    """The two runs' registered plan digests (None: the run registered no plan)."""

    @property
    def matched(self) -> int:
        return sum(a is not None and a == b for _, a, b in self.rows)

    @property
    def plan_matched(self) -> bool:
        return self.plans[0] is not None and self.plans[0] == self.plans[1]

    @property
    def all_matched(self) -> bool:
        return bool(self.rows) and self.matched == len(self.rows) and self.plan_matched


def _payloads(ledger: Ledger, run_id: str) -> dict[str, str]:
    return {
        e.data.get("request_key") or e.data["request_id"]: e.data["payload_sha256"]
        for e in ledger.events(run_id=run_id, kind="request.sent")
    }


def _registered_plan(ledger: Ledger, run_id: str) -> Mapping[str, Any] | None:
    """``run_id``'s ``plan.registered`` data (None: it registered no plan)."""
    plan = next(iter(ledger.events(run_id=run_id, kind="plan.registered")), None)
    return None if plan is None else plan.data


def _plan_digest(ledger: Ledger, run_id: str) -> str | None:
    plan = _registered_plan(ledger, run_id)
    return None if plan is None else str(plan["plan_sha256"])


def _plan_thresholds(ledger: Ledger, run_id: str) -> Mapping[str, Any] | None:
    """The thresholds ``run_id`` registered (None: it registered no plan). A replay holds its
    checks to them, not to the model card as it is now: a card's limit grows with its evidence,
    and the replay re-executes the registered plan as it re-executes the recorded source."""
    plan = _registered_plan(ledger, run_id)
    return None if plan is None else dict(plan.get("thresholds") or {})


def compare_runs(ledger: Ledger, original: str, replayed: str) -> Comparison:
    """Payload digests of two runs, matched by request key, and their registered plans."""
    a, b = _payloads(ledger, original), _payloads(ledger, replayed)
    rows = [(key, a.get(key), b.get(key)) for key in sorted(set(a) | set(b))]
    plans = (_plan_digest(ledger, original), _plan_digest(ledger, replayed))
    return Comparison(original, replayed, rows, plans=plans)


def _recorded(ledger: Ledger, run_id: str) -> Mapping[str, Any]:
    started = next(iter(ledger.events(run_id=run_id, kind="run.started")), None)
    if started is None:
        raise ReplayError(f"no run {run_id} in the ledger")
    if not started.data.get("source"):
        raise ReplayError(f"run {run_id} did not record its script source")
    return started.data


def replay(
    ledger: Ledger,
    run_id: str,
    *,
    target: str | None = None,
    progress: bool = False,
    target_options: Mapping[str, Any] | None = None,
) -> Comparison:
    """Re-run ``run_id`` and compare payload digests request by request. ``target_options``
    changes options of the target, never the experiment's params (the requests stay the same):
    e.g. the sim's ``sim_device``, a replay on other hardware."""
    data = _recorded(ledger, run_id)
    recorded = dict(data["params"])
    target_name = target or recorded.get("target", "sim")
    exp = load_source(data["source"], name=data["experiment"], path=data.get("path"))
    given = {k: v for k, v in recorded.items() if k not in DERIVED_PARAMS}
    if target_name != recorded.get("target", "sim"):
        # Another target: keep the experiment's params, drop the old target's options.
        known = set(exp.defaults) | set(target_defaults(target_name))
        given = {k: v for k, v in given.items() if k in known}
    options = dict(target_options or {})
    # The client's options (asked_lines, ttft_method) shape or date the requests: not changeable.
    changeable = set(target_defaults(target_name)) - set(CLIENT_PARAMS) - set(exp.defaults)
    not_target = sorted(set(options) - changeable)
    if not_target:
        raise ReplayError(f"not options of the {target_name} target: {', '.join(not_target)}")
    params = prepare_params(exp, target_name, {**given, **options})
    result = run_sync(
        ledger,
        exp,
        params,
        target_name=target_name,
        seed=data.get("seed"),
        progress=progress,
        replay_of=run_id,
        replayed_thresholds=_plan_thresholds(ledger, run_id),
    )
    comparison = compare_runs(ledger, run_id, result.run_id)
    comparison.result = result
    ledger.append(
        NewEvent(
            "note.added",
            {
                "text": f"replay of {run_id}: {comparison.matched}/{len(comparison.rows)} "
                "payload digests matched; registered plan "
                + ("the same" if comparison.plan_matched else "differs or is missing"),
                "replay_of": run_id,
                "matched": comparison.matched,
                "requests": len(comparison.rows),
                "all_matched": comparison.all_matched,
                "plan_matched": comparison.plan_matched,
                "plans": list(comparison.plans),
                "mismatched": [k for k, x, y in comparison.rows if x is None or x != y][:100],
            },
            run_id=result.run_id,
        )
    )
    return comparison


def print_comparison(c: Comparison) -> None:
    """Per request: key, match, digests (rich table), then the verdict."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"replay {c.replay_run} of {c.original_run}")
    for column in ("request", "matched", "original", "replay"):
        table.add_column(column)
    for key, a, b in c.rows:
        ok = a is not None and a == b
        table.add_row(key, "[green]yes[/green]" if ok else "[red]NO[/red]", (a or "-")[:16], (b or "-")[:16])
    console.print(table)
    original, replayed = (p[:16] if p else "none" for p in c.plans)
    console.print(
        f"registered plan: {original} / {replayed}: " + ("same" if c.plan_matched else "[red]DIFFERS[/red]")
    )
    verdict = "all matched" if c.all_matched else "MISMATCH"
    console.print(f"{c.matched}/{len(c.rows)} payload digests matched: {verdict}")
