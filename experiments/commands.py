"""``ledger run`` and ``ledger replay``: experiments from the command line.

Exit status: 0 when the run completed and every assertion passed; 1 when an
assertion failed, a block failed or the run did not complete; 2 on bad usage
(unknown experiment or param, a bad value), in which case nothing is written.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ledger import EXIT_CHECK_FAILED, EXIT_OK, LedgerError, ParamError, TargetError
from ledger.cli_options import db_option

from ._loader import load
from ._params import parse_params
from .targets._registry import TARGETS

__all__ = ["replay_command", "run_command"]


def _summary(result: Any) -> None:
    c = result.counters
    colour = "green" if result.exit_code == 0 else "red"
    click.secho(
        f"run {result.run_id}: {result.status}{'' if not result.error else ' (' + result.error + ')'}",
        fg=colour,
        err=True,
    )
    click.echo(
        f"  measured {c.measured}, warmups {c.warmups}, assertions {c.assertions} "
        f"({c.failed_assertions} failed), failed blocks {c.failed_blocks or 'none'}",
        err=True,
    )


@click.command("run")
@click.argument("experiment")
@click.option(
    "--target",
    type=click.Choice(TARGETS),
    default="sim",
    show_default=True,
    help="Deployment to run against.",
)
@click.option(
    "--param",
    "-p",
    "params",
    multiple=True,
    metavar="NAME=VALUE",
    help="Override a param (JSON literal, else string); repeatable.",
)
@click.option("--seed", type=int, default=None, help="Run seed (default: the experiment's SEED).")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@db_option
def run_command(
    experiment: str, target: str, params: tuple[str, ...], seed: int | None, no_progress: bool, db_url: str
) -> None:
    """Run a replayable experiment and record it in the ledger.

    EXPERIMENT is a built-in (screening, validation) or a path to a Python file
    of the experiment form (see experiments/README.md). Every shape is a
    --param; sim faults are --param sim_fault=SPEC, the sim's speed
    --param time_scale=X.

    \b
    Example:
      ledger run validation
      ledger run screening --param sizes='[8000,32000]' --param block_pairs=4
      ledger run screening --param fault=namespace-leak
      ledger run validation --param sim_fault=corrupt-transfer   # must fail: exit 1
      ledger run ./my_experiment.py --param n=3
    """
    from ledger import open_ledger

    from .runner import prepare_params, run_sync

    try:
        exp = load(experiment)
        resolved = prepare_params(exp, target, parse_params(params))
    except LedgerError:
        raise
    except ValueError as exc:  # an experiment's own check of its params
        raise ParamError(str(exc)) from exc
    ledger = open_ledger(db_url)
    try:
        result = run_sync(
            ledger,
            exp,
            resolved,
            target_name=target,
            seed=seed,
            progress=not no_progress and sys.stderr.isatty(),
        )
    except TargetError as exc:  # the target could not be made (engines, model): nothing was recorded
        raise TargetError(f"target {target}: {exc}") from exc
    finally:
        ledger.close()
    _summary(result)
    sys.exit(result.exit_code)


@click.command("replay")
@click.argument("run_id")
@click.option(
    "--target",
    type=click.Choice(TARGETS),
    default=None,
    help="Target to replay against (default: the recorded one).",
)
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@db_option
def replay_command(run_id: str, target: str | None, no_progress: bool, db_url: str) -> None:
    """Re-run a recorded run from its recorded script source, params and seed.

    The replay is a new run (its run.started names replay_of); every request
    is compared with the original by its request key, and the command says
    per request whether the payload SHA-256 matched, and whether the replay
    registered the original's plan. Its exact-value checks hold to the limit
    the original registered, though the model card may have grown since.
    Exit 0 only if every payload and the plan matched.

    \b
    Example:
      ledger replay 0190f3a2-7c1e-7d3a-9b1e-2f4c5d6e7f80
    """
    from ledger import open_ledger

    from .replay import print_comparison, replay

    ledger = open_ledger(db_url)
    try:
        comparison = replay(ledger, run_id, target=target, progress=not no_progress and sys.stderr.isatty())
    finally:
        ledger.close()
    print_comparison(comparison)
    sys.exit(EXIT_OK if comparison.all_matched else EXIT_CHECK_FAILED)
