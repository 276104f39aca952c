"""Shared click options, as decorators (sqlite-utils style)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from ._backends import DEFAULT_URL

F = TypeVar("F", bound=Callable[..., Any])

# Where the root group keeps a ``ledger --db URL COMMAND`` URL for the command it runs.
ROOT_DB_KEY = "kvledger.root_db_url"


def _db_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """The command's own ``--db`` first, then the root group's, then ``$KVLEDGER_URL``, then the default."""
    root_url = ctx.meta.get(ROOT_DB_KEY)
    if root_url is None:
        return value
    if ctx.get_parameter_source(str(param.name)) is ParameterSource.COMMANDLINE:
        if value != root_url:
            raise click.BadParameter(
                f"given twice with different URLs (before the command: {root_url!r}); give it once",
                ctx=ctx,
                param=param,
            )
        return value
    return str(root_url)


def db_option(fn: F) -> F:
    """``--db URL``: the ledger database (env ``KVLEDGER_URL``, default ``sqlite:///ledger.db``).

    ``ledger --db URL COMMAND`` works as well: the root group's URL stands in
    for a command's own ``--db`` when that is not given.
    """
    return click.option(
        "--db",
        "db_url",
        envvar="KVLEDGER_URL",
        default=DEFAULT_URL,
        show_default=True,
        metavar="URL",
        callback=_db_url,
        help="Ledger database URL (sqlite:///FILE or postgresql://...); env KVLEDGER_URL.",
    )(fn)


def json_option(fn: F) -> F:
    """``--json``: machine-readable output."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")(fn)


def run_option(fn: F) -> F:
    """``--run RUN_ID``: restrict to one run."""
    return click.option("--run", "run_id", metavar="RUN_ID", default=None, help="Only this run.")(fn)


def runs_option(fn: F) -> F:
    """``--run RUN_ID``, repeatable: restrict to these runs (none given: the whole ledger)."""
    return click.option(
        "--run",
        "run_ids",
        metavar="RUN_ID",
        multiple=True,
        help="Only this run; repeat for several (the ledger is verified once for all of them).",
    )(fn)


def events_per_group_option(fn: F) -> F:
    """``--events-per-group N``: derive the whole ledger group of runs by group of runs."""
    return click.option(
        "--events-per-group",
        "events_per_group",
        type=click.IntRange(min=1),
        metavar="N",
        default=None,
        help="Derive the whole ledger's tables group of runs by group of runs, about N events a group "
        "(the same output; memory bounded by one group's tables). Default: past 2,000,000 events, "
        "at most 1,600,000 a group.",
    )(fn)
