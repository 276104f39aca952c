"""The ``ledger`` command: the composition root.

Each package contributes its own click commands in ``<package>/commands.py``;
they are imported only when invoked, so the store never imports what sits above it.
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import Any

import click
from sqlalchemy.exc import DBAPIError

from ._errors import EXIT_BAD_INPUT, LedgerError
from .cli_options import ROOT_DB_KEY

_CREDENTIALS = re.compile(r"(://[^:/@\s]*:)[^@\s]+@")

# command name → ("module:attribute", short help); imported on first use only.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("ledger._commands:init_command", "Create or upgrade the ledger schema."),
    "import": ("ledger._commands:import_command", "Import JSON Lines envelopes atomically."),
    "export": ("ledger._commands:export_command", "Export JSON Lines and/or Parquet."),
    "events": ("ledger._commands:events_command", "List events, filtered by run and kind."),
    "verify": ("ledger._commands:verify_command", "Recompute digests and the hash chain."),
    "compact": ("ledger._commands:compact_command", "Rewrite an SQLite ledger's file with 16 KiB pages."),
    "sql": ("ledger._commands:sql_command", "Query the ledger with DuckDB (read-only views)."),
    "run": ("experiments.commands:run_command", "Run a replayable experiment."),
    "replay": ("experiments.commands:replay_command", "Re-run a recorded run; compare payload digests."),
    "sim": ("experiments.targets.sim.commands:sim_command", "Serve the simulated deployment."),
    "report": ("reports.commands:report_command", "The report derived from the ledger."),
    "audit": ("reports.commands:audit_command", "Audit findings; --publish gates publishing."),
    "attest": ("reports.commands:attest_command", "Write an in-toto statement binding a report."),
    "compare": ("reports.commands:compare_command", "Two runs' tables side by side, paired changes."),
    "probe": ("collectors.commands:probe_group", "GPU byte probes, recorded as events."),
    "checkpoint": ("collectors.commands:checkpoint_group", "Audit checkpoint files (SHA-256)."),
    "demo": ("ledger._demo:demo_command", "Validation + seed screening on sim, then report and audit."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported when first needed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(LAZY_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = LAZY_COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attribute = entry[0].split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise click.ClickException(f"`{cmd_name}` is not available: {exc}") from exc
        command: click.Command = getattr(module, attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing must not import every package: use the static short help.
        rows = [(name, LAZY_COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LedgerError as exc:
            # Every error a command raises on purpose: its reason and its own exit status, no traceback.
            click.echo(f"Error: {_redact(str(exc))}", err=True)
            sys.exit(exc.exit_status)
        except DBAPIError as exc:
            # An unreachable or wrong database is bad input too (exit 1 means a check failed).
            reason = str(exc.orig or exc).strip().splitlines()[0]
            click.echo(f"Error: cannot use the ledger database: {_redact(reason)}", err=True)
            sys.exit(EXIT_BAD_INPUT)


def _redact(message: str) -> str:
    """Hide any ``scheme://user:password@`` password a driver message might quote."""
    return _CREDENTIALS.sub(r"\1***@", message)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvledger")
@click.option(
    "--db",
    "db_url",
    default=None,
    metavar="URL",
    help="Ledger database URL for the command that follows (as its own --db would be).",
)
@click.pass_context
def cli(ctx: click.Context, db_url: str | None) -> None:
    """kvledger: an event-sourced, hash-chained ledger for LLM-serving experiments.

    Every launch, config, request, hit counter and assertion is an immutable
    event; reports and the audit are derived from the ledger.

    Example:

        ledger init && ledger run validation && ledger run screening && ledger audit
        ledger --db sqlite:///study.db audit --publish
    """
    if db_url is not None:
        ctx.meta[ROOT_DB_KEY] = db_url


def main() -> None:
    cli()
