"""Shared click options, as decorators (sqlite-utils style)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ._backends import DEFAULT_URL

F = TypeVar("F", bound=Callable[..., Any])


def db_option(fn: F) -> F:
    """``--db URL``: the ledger database (env ``KVLEDGER_URL``, default ``sqlite:///ledger.db``)."""
    return click.option(
        "--db",
        "db_url",
        envvar="KVLEDGER_URL",
        default=DEFAULT_URL,
        show_default=True,
        metavar="URL",
        help="Ledger database URL (sqlite:///FILE or postgresql://...); env KVLEDGER_URL.",
    )(fn)


def json_option(fn: F) -> F:
    """``--json``: machine-readable output."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")(fn)


def run_option(fn: F) -> F:
    """``--run RUN_ID``: restrict to one run."""
    return click.option("--run", "run_id", metavar="RUN_ID", default=None, help="Only this run.")(fn)
