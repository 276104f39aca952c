"""The ``sim`` command (wired into ``ledger`` elsewhere) and ``python -m`` entry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ._deployment import SimDeployment
from ._faults import parse_faults
from ._serve import serve_forever

__all__ = ["plain_main", "sim_command", "sim_options"]

F = TypeVar("F", bound=Callable[..., Any])


def _check_fault(_: click.Context, __: click.Parameter, value: str | None) -> str | None:
    try:
        parse_faults(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    return value


def sim_options(func: F) -> F:
    """The deployment options shared by ``ledger sim`` and ``python -m``."""
    options = [
        click.option(
            "--replicas", type=click.IntRange(min=1), default=2, show_default=True, help="Number of replicas."
        ),
        click.option(
            "--base-port",
            type=click.IntRange(0, 65535),
            default=0,
            show_default=True,
            help="Replica i listens on P+i, the tier on P+replicas; 0: OS-chosen.",
        ),
        click.option(
            "--shared",
            type=click.Choice(["on", "off"]),
            default="on",
            show_default=True,
            help="Connect replicas to the shared tier.",
        ),
        click.option(
            "--fault",
            default=None,
            callback=_check_fault,
            help="Fault spec, e.g. 'corrupt-transfer' or 'http-errors:every=3@replica=1'.",
        ),
        click.option(
            "--time-scale",
            type=click.FloatRange(min=0),
            default=1.0,
            show_default=True,
            help="Multiplies every simulated delay.",
        ),
        click.option(
            "--block-size",
            type=click.IntRange(min=1),
            default=16,
            show_default=True,
            help="Prefix-cache block size, tokens.",
        ),
        click.option(
            "--chunk-size",
            type=click.IntRange(min=1),
            default=256,
            show_default=True,
            help="Shared-tier chunk size, tokens.",
        ),
        click.option(
            "--capacity-blocks",
            type=click.IntRange(min=1),
            default=65_536,
            show_default=True,
            help="Each replica's prefix-cache capacity, blocks (num_gpu_blocks).",
        ),
        click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _deployment(
    replicas: int,
    base_port: int,
    shared: str,
    fault: str | None,
    time_scale: float,
    block_size: int,
    chunk_size: int,
    capacity_blocks: int,
    host: str,
) -> SimDeployment:
    return SimDeployment(
        replicas,
        shared=shared == "on",
        fault=fault,
        time_scale=time_scale,
        base_port=base_port,
        block_size=block_size,
        chunk_size=chunk_size,
        capacity_blocks=capacity_blocks,
        host=host,
    )


@click.command("sim")
@sim_options
def sim_command(**options: Any) -> None:
    """Serve a simulated vLLM + LMCache deployment on loopback until Ctrl-C.

    Starts REPLICAS simulated vLLM 0.33 replicas (OpenAI API, /metrics with
    vLLM's names, prefix caching with cache_salt) and one shared KV tier with
    LMCache's service surface, then prints their URLs.

    \b
    Example:
      ledger sim --replicas 2 --base-port 8100 --shared on --time-scale 0.01
      ledger sim --fault unordered-copy            # cross-replica answers off by 15
      ledger sim --fault 'http-errors:every=3@replica=1'
    """
    from rich.console import Console
    from rich.table import Table

    console = Console()

    def ready(dep: SimDeployment) -> None:
        table = Table(title="kvledger sim deployment", show_header=True)
        table.add_column("role")
        table.add_column("url")
        for i, url in enumerate(dep.replica_urls):
            table.add_row(f"replica {i}", url)
        table.add_row("shared tier" + ("" if dep.shared else " (OFF)"), dep.shared_url)
        console.print(table)
        console.print(f"faults: {dep.faults.spec()}  time scale: {dep.config.time_scale}")
        console.print("[dim]Serving until Ctrl-C.[/dim]")

    serve_forever(_deployment(**options), ready)


@click.command("sim")
@sim_options
def plain_main(**options: Any) -> None:
    """Serve the deployment; print replica URLs, the tier URL, then READY."""

    def ready(dep: SimDeployment) -> None:
        for url in [*dep.replica_urls, dep.shared_url]:
            click.echo(url)
        click.echo("READY")

    serve_forever(_deployment(**options), ready)
