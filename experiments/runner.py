"""The runner: one experiment, one target, one run recorded in the ledger.

``run.started`` is appended before anything is sent and ``run.finished``
(``completed``, ``failed`` or ``aborted``) in a ``finally``: Ctrl-C or
SIGTERM cancel the run's task, an exception fails it, and either way the
record says so. A SIGKILLed run simply has no ``run.finished``: visibly
incomplete. Events are appended in atomic batches (see ``Sink``), so there
is never a half-written event, and a later run starts from a clean ledger.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors import code_version, host_inventory, package_versions
from ledger import Ledger, NewEvent, new_id

from ._context import Counters, RunContext, Sink, check_block_design
from ._loader import Experiment
from ._params import check_params
from .fixture_text import served_key
from .targets._base import Target
from .targets._registry import check_target_params, make_target, target_defaults

__all__ = ["DERIVED_PARAMS", "RunResult", "prepare_params", "run_experiment", "run_sync"]

_PACKAGES = (
    "kvledger",
    "httpx",
    "aiohttp",
    "sqlalchemy",
    "prometheus-client",
    "rich",
    "click",
    "orjson",
    "vllm",
    "lmcache",
    "torch",
)
DERIVED_PARAMS = ("target", "config_sha256")
"""Keys the runner adds to ``run.started.params`` (not settable; recomputed on replay)."""


@dataclass
class RunResult:
    """How a run ended; ``exit_code`` is 0 only for a clean, passing run."""

    run_id: str
    status: str
    error: str | None
    counters: Counters = field(default_factory=Counters)

    @property
    def exit_code(self) -> int:
        c = self.counters
        return 0 if self.status == "completed" and not c.failed_assertions and not c.failed_blocks else 1


def prepare_params(exp: Experiment, target: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """Resolved params (defaults + given, checked); raises ParamError/ValueError before any write."""
    params = check_params(exp.defaults, given, target_defaults(target))
    if params.get("namespace_tag", "absent") is None:
        # A fresh tag per run, recorded, so a replay reuses it and sends the same bytes.
        params["namespace_tag"] = "kvl" + secrets.token_hex(4)
    check_target_params(target, params)
    if "block_pairs" in params:
        check_block_design(params["block_pairs"], params.get("order"))
    exp.check(params)
    return params


def _started(
    exp: Experiment, params: dict[str, Any], seed: int, target: Target, replay_of: str | None
) -> dict[str, Any]:
    return {
        "experiment": exp.name,
        "script_sha256": exp.script_sha256,
        "source": exp.source,
        "path": exp.path,
        "params": {**params, "target": target.name, "config_sha256": target.config_sha256("ON")},
        "target": target.describe(),
        "seed": seed,
        "code": code_version(Path(__file__).resolve().parent),
        "packages": package_versions(_PACKAGES),
        "host": host_inventory(),
        "replay_of": replay_of,
        # This runner registers a plan before any block (plan.registered): the audit tells a run that
        # lost its plan from one recorded before plans were registered.
        "registers_plan": True,
    }


class _Progress:
    """Rich progress bars for blocks and requests (silent when disabled)."""

    def __init__(self, enabled: bool, planned: Mapping[str, int]) -> None:
        self.enabled = enabled
        self.planned = planned
        self._bar: Any = None

    @contextmanager
    def shown(self) -> Iterator[_Progress]:
        if not self.enabled:
            yield self
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=False,
        ) as bar:
            self._bar = bar
            blocks = self.planned.get("blocks")
            per_block = self.planned.get("requests_per_block", 0) + self.planned.get("warmups_per_block", 0)
            self._blocks = bar.add_task("blocks", total=blocks)
            self._requests = bar.add_task("requests", total=(per_block * blocks) if blocks else None)
            yield self
        self._bar = None

    def __call__(self, what: str, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._blocks if what == "block" else self._requests, n)


async def run_experiment(
    ledger: Ledger,
    exp: Experiment,
    params: dict[str, Any],
    *,
    target_name: str = "sim",
    seed: int | None = None,
    progress: bool = False,
    replay_of: str | None = None,
    replayed_thresholds: Mapping[str, Any] | None = None,
) -> RunResult:
    """Run ``exp`` with resolved ``params`` against a fresh target; record everything.
    ``replayed_thresholds``: a replay's, the thresholds its original registered (RunContext)."""
    seed = seed if seed is not None else (exp.default_seed if exp.default_seed is not None else 0)
    target = make_target(target_name, params)
    run_id = new_id()
    sink = Sink(ledger, run_id)
    counters = Counters()
    ledger.append(NewEvent("run.started", _started(exp, params, seed, target, replay_of), run_id=run_id))
    bars = _Progress(progress, exp.planned(params))
    ctx = RunContext(
        ledger=ledger,
        sink=sink,
        target=target,
        experiment=exp.name,
        params=params,
        seed=seed,
        counters=counters,
        progress=bars,
        planned=exp.planned(params),
        plan=exp.plan(params),
        replayed_thresholds=replayed_thresholds,
    )
    status: str = "aborted"
    error: str | None = "interrupted"
    try:
        await _prepare(ctx, run_id)
        with bars.shown():
            await exp.run(ctx)
        status = "failed" if counters.failed_blocks else "completed"
        error = f"failed blocks: {counters.failed_blocks}" if counters.failed_blocks else None
    except (asyncio.CancelledError, KeyboardInterrupt):
        status, error = "aborted", "interrupted (SIGINT/SIGTERM)"
    except Exception as exc:
        status, error = "failed", f"{type(exc).__name__}: {exc}"[:500]
    finally:
        await _close(ctx, target)
        sink.block_id = None
        sink.emit(
            "run.finished",
            {
                "status": status,
                "error": error,
                "measured": counters.measured,
                "warmups": counters.warmups,
                "assertions": counters.assertions,
                "failed_assertions": counters.failed_assertions,
                "failed_blocks": counters.failed_blocks,
                "probes": counters.probes,
            },
        )
        sink.flush()
    return RunResult(run_id, status, error, counters)


async def _prepare(ctx: RunContext, run_id: str) -> None:
    """The target's run-level records before any block: which checkpoint the run uses
    (``checkpoint.audited``), and a note when exact-value checks do not apply."""
    sink = ctx.sink
    for record in await ctx.target.prepare_run(run_id):
        sink.emit_run(record.kind, record.data)
    if not ctx.answers_meaningful:
        sink.emit_run(
            "note.added",
            {
                "text": "exact_values checks not applicable: the served model's answers are not meaningful "
                "(random weights); correctness is checked against cold references instead",
                "topic": "answers_meaningful",
                "answers_meaningful": False,
            },
        )
    elif ctx.meaningful_up_to_tokens is not None:
        card = ctx.target.model_card or {}
        below = ", ".join(f"{n}: {a:.1%}" for n, a in card.get("unserved", {}).items())
        threshold = f"{card.get('threshold', 0.99):.0%}"
        if ctx.meaningful_up_to_tokens != ctx.card_exact_values_limit:
            now = ctx.card_exact_values_limit
            why = (
                f"gave it when the replayed run registered its plan (it gives "
                f"{'every size' if now is None else now} now); the replay holds to the same checks"
            )
        elif ctx.asked_lines != "spot":
            what = "every value line" if ctx.asked_lines == "every" else "dense value lines"
            why = (
                f"cites {ctx.asked_lines}-line evaluations at {threshold} or more "
                f"up to {ctx.meaningful_up_to_tokens} tokens"
                if served_key(ctx.asked_lines) in card
                else f"cites no evaluation that asked {what}"
            )
        elif below:
            why = f"declares accuracy below {threshold} there ({below})"
        else:
            # A card may serve every size it measured: then nothing above it was shown to reach
            # the threshold, which is as much a reason as a size measured below it.
            why = f"shows no size above it measured at {threshold} or more (none was measured)"
        sink.emit_run(
            "note.added",
            {
                "text": f"exact_values checks not applicable to prompts over {ctx.meaningful_up_to_tokens} "
                f"tokens: the served model's card {why}",
                "topic": "answers_meaningful",
                "answers_meaningful": True,
                "meaningful_up_to_tokens": ctx.meaningful_up_to_tokens,
                "card": card,
            },
        )
    sink.flush()


async def _close(ctx: RunContext, target: Target) -> None:
    # Shielded: a second Ctrl-C must not leave the sim process behind.
    try:
        await asyncio.shield(ctx.aclose())
        await asyncio.shield(target.close())
    except (asyncio.CancelledError, Exception):
        pass


def run_sync(ledger: Ledger, exp: Experiment, params: dict[str, Any], **kwargs: Any) -> RunResult:
    """:func:`run_experiment` on a fresh event loop, with SIGINT/SIGTERM cancelling it cleanly."""

    async def main() -> RunResult:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await _uncancel(run_experiment(ledger, exp, params, **kwargs))
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    return asyncio.run(main())


async def _uncancel(coro: Any) -> RunResult:
    """Await the run; a cancel of the outer task reaches it and is turned into ``aborted``."""
    result: RunResult = await coro
    task = asyncio.current_task()
    if task is not None:
        while task.uncancel():
            pass
    return result
