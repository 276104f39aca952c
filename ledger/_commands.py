"""The store's own commands: init, import, export, events, verify, compact, sql."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import _migrate
from ._analytics import Analytics
from ._backends import redact_url
from ._jsonl import export_jsonl, import_jsonl
from ._parquet import export_parquet
from ._store import Ledger, open_ledger
from .cli_options import db_option, json_option, run_option

console = Console()


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,} events"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def _open(db_url: str) -> Ledger:
    return open_ledger(db_url, create=False)


@click.command("init")
@db_option
def init_command(db_url: str) -> None:
    """Create the ledger schema, or upgrade it to the current revision.

    Example:

        ledger init --db sqlite:///study.db
    """
    ledger = open_ledger(db_url, create=True)
    revision = _migrate.current_revision(ledger.database)
    console.print(f"ledger at {redact_url(db_url)} is at schema revision {revision}")


# Other tools' result files: read by the collectors, named here as strings and imported only when
# used (as the root names every package's commands), so the store imports nothing above it.
RESULT_TOOLS: dict[str, str] = {
    "vllm-bench": "collectors:result_events",
    "guidellm": "collectors:result_events",
}


@click.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--from",
    "tool",
    type=click.Choice(sorted(RESULT_TOOLS)),
    default=None,
    help="FILE is this tool's result file (not JSON Lines envelopes): record it as a run of its own.",
)
@db_option
def import_command(file: Path, tool: str | None, db_url: str) -> None:
    """Import a JSON Lines file of envelopes, atomically: all lines land, or none.

    FILE may be compressed (`.xz`, `.gz`), as exports are committed.

    Each line is validated (known kind, required fields and types, a given
    digest); an error names the line and field and nothing is written.

    With --from, FILE is another tool's result file (`vllm bench serve
    --save-result --save-detailed`, GuideLLM's JSON report): recorded as
    `import.recorded` (tool, version, the file's SHA-256, the tool's summary)
    and one `import.request` per request, in a run of its own; the audit says
    what such results lack. A file that is not that tool's is refused and
    nothing is written.

    \b
    Example:
      ledger import probes.jsonl
      ledger import tests/data/gpu-mp/ledger.jsonl.xz
      ledger import --from vllm-bench results.json
      ledger import --from guidellm benchmarks.json
    """
    if tool is not None:
        _import_results(tool, file, db_url)
        return
    ledger = open_ledger(db_url, create=True)
    with _progress() as progress:
        task = progress.add_task(f"importing {file.name}", total=None)
        count = import_jsonl(ledger, file, lambda n: progress.advance(task, n))
    head = ledger.head()
    console.print(f"imported {count:,} events; head seq {head.seq if head else 0}")


def _import_results(tool: str, file: Path, db_url: str) -> None:
    module_name, attribute = RESULT_TOOLS[tool].split(":")
    events = getattr(importlib.import_module(module_name), attribute)(tool, file)  # refused: nothing made
    ledger = open_ledger(db_url, create=True)
    try:
        head = ledger.extend(events)
    finally:
        ledger.close()
    run_id, requests = events[0].run_id, len(events) - 1
    console.print(
        f"recorded {tool} results {file.name} ({requests} requests) as run {run_id}; "
        f"head seq {head.seq if head else 0}\n"
        f"`ledger audit --run {run_id}` says what they lack: pairing, hit counters, validation"
    )


@click.command("export")
@click.option(
    "--jsonl",
    "jsonl_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write every envelope to this JSON Lines file ('-' for stdout).",
)
@click.option(
    "--parquet",
    "parquet_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write events.parquet and one file per kind into this directory.",
)
@db_option
def export_command(jsonl_path: Path | None, parquet_dir: Path | None, db_url: str) -> None:
    """Export the ledger as JSON Lines envelopes and/or Parquet files.

    Re-importing the JSON Lines into an empty ledger reproduces every digest
    and the chain.

    Example:

        ledger export --jsonl ledger.jsonl --parquet ./parquet
    """
    if jsonl_path is None and parquet_dir is None:
        raise click.UsageError("give --jsonl FILE and/or --parquet DIR")
    ledger = _open(db_url)
    if jsonl_path is not None:
        _export_jsonl(ledger, jsonl_path)
    if parquet_dir is not None:
        written = export_parquet(ledger, parquet_dir)
        console.print(f"wrote {len(written)} Parquet files to {parquet_dir}", style="green")


def _export_jsonl(ledger: Ledger, path: Path) -> None:
    if str(path) == "-":
        export_jsonl(ledger, sys.stdout.buffer)
        return
    total = ledger.count()
    tmp = path.with_name(path.name + ".partial")
    with _progress() as progress, open(tmp, "wb") as out:
        task = progress.add_task(f"exporting {path.name}", total=total)
        count = export_jsonl(ledger, out, lambda n: progress.advance(task, n))
    tmp.replace(path)
    console.print(f"exported {count:,} events to {path}")


@click.command("events")
@run_option
@click.option("--kind", "kinds", multiple=True, metavar="KIND", help="Only this kind (repeatable).")
@click.option("--limit", type=int, default=None, help="At most this many events.")
@json_option
@db_option
def events_command(
    run_id: str | None, kinds: tuple[str, ...], limit: int | None, as_json: bool, db_url: str
) -> None:
    """List events in seq order, filtered by run and kind.

    Example:

        ledger events --run 01930c1e-... --kind response.received --json
    """
    ledger = _open(db_url)
    events = ledger.events(run_id=run_id, kind=list(kinds) or None, limit=limit)
    if as_json:
        for event in events:
            sys.stdout.buffer.write(orjson.dumps(event.envelope()) + b"\n")
        return
    # Readable at 80 columns: whole seconds, 8-character ids, the data cut at the edge (--json has all).
    rows = list(events)
    widths = {
        "seq": max([3, *(len(str(e.seq)) for e in rows)]),
        "kind": max([4, *(len(e.kind) for e in rows)]),
        "ts": 19,
        "run": 8,
        "block": 8,
    }
    room = max(20, console.width - sum(widths.values()) - 2 * len(widths) - 1)
    table = Table(box=None)
    for name, width in widths.items():
        table.add_column(name, no_wrap=True, min_width=width)
    table.add_column("data", no_wrap=True)
    for event in rows:
        data = json.dumps(event.data, separators=(",", ":"))
        data = data if len(data) <= room else data[: room - 1] + "…"
        table.add_row(
            str(event.seq),
            event.kind,
            event.ts[:19],
            (event.run_id or "")[:8],
            (event.block_id or "")[:8],
            data,
        )
    console.print(table)


@click.command("verify")
@click.option(
    "--head",
    "expected_head",
    metavar="CHAIN",
    default=None,
    help="Also require the ledger's head chain to equal this (from a report or attestation).",
)
@click.option(
    "--snapshot",
    "check_snapshot",
    is_flag=True,
    help="Also prove the Parquet snapshot that reports read, in full; name any file that differs.",
)
@json_option
@db_option
def verify_command(expected_head: str | None, check_snapshot: bool, as_json: bool, db_url: str) -> None:
    """Recompute every digest and the hash chain; name the first bad seq.

    Detects edited data, deleted or reordered rows and a tail truncated below a
    recorded head. --snapshot also checks the report cache: every segment's rows
    verified again and chained to the database's own chain, every projection
    derived again and compared (nothing is rebuilt). Exit status 1 if anything
    is wrong.

    Example:

        ledger verify --snapshot --json
    """
    from . import verify
    from ._snapshot import Snapshot

    led = _open(db_url)
    result = verify(led, expected_head)
    out: dict[str, Any] = dict(result.__dict__)
    ok = result.ok
    if check_snapshot:
        snapshot = Snapshot.for_ledger(led)
        proof = snapshot.check(led)
        ok = ok and not proof.mismatches
        mismatches = [{"file": str(m.file), "problem": m.problem} for m in proof.mismatches]
        out["snapshot"] = {
            "ok": not mismatches,
            "directory": str(snapshot.directory),
            "head_seq": proof.head_seq,
            "files": proof.files,
            "stale_segments": proof.stale,
            "mismatches": mismatches,
        }
    if as_json:
        click.echo(json.dumps(out))
    else:
        if result.ok:
            console.print(f"[green]ok[/green]: {result.count:,} events, head {result.head_chain}")
        else:
            console.print(f"[red]broken at seq {result.first_bad_seq}[/red]: {result.problem}")
        if check_snapshot:
            _print_snapshot(out["snapshot"])
    sys.exit(0 if ok else 1)


@click.command("compact")
@click.option(
    "--page-size",
    type=click.Choice(["4096", "8192", "16384", "32768", "65536"]),
    default=None,
    help="Bytes per page of the rewritten file (default: what new ledgers get, 16384).",
)
@json_option
@db_option
def compact_command(page_size: str | None, as_json: bool, db_url: str) -> None:
    """Rewrite an SQLite ledger's file with 16 KiB pages and no free pages; every row as it was.

    A ledger made before new ledgers got 16 KiB pages keeps SQLite's 4 KiB ones, and every
    full read of its rows (verify, a verified report, the snapshot) makes four times the page
    reads. The ledger is verified before and after, and its head must not move; one that
    does not verify, or that another process has open, is refused with the file untouched
    (exit 2). SQLite only.

    Example:

        ledger compact --db sqlite:///study.db
    """
    from ._backends import PAGE_SIZE
    from ._compact import compact

    led = _open(db_url)
    try:
        done = compact(led, int(page_size) if page_size else PAGE_SIZE)
    finally:
        led.close()
    if as_json:
        click.echo(json.dumps(done.__dict__))
        return
    console.print(
        f"[green]compacted[/green] {done.path}: pages {done.page_size_before:,} → {done.page_size_after:,} "
        f"bytes, file {done.bytes_before / 1e6:,.1f} → {done.bytes_after / 1e6:,.1f} MB; "
        f"{done.events:,} events verified before and after, head {done.head_chain} ({done.seconds:.1f} s)"
    )


def _print_snapshot(snapshot: dict[str, Any]) -> None:
    for m in snapshot["mismatches"]:
        console.print(
            f"[red]snapshot mismatch[/red]: {m['file']}: {m['problem']}", highlight=False, soft_wrap=True
        )
    if snapshot["ok"]:
        stale = snapshot["stale_segments"]
        console.print(
            f"[green]snapshot ok[/green]: {snapshot['files']} files proven up to seq "
            f"{snapshot['head_seq']:,}"
            + (f"; {stale} stale segment(s) the next reader reads again" if stale else "")
            + f" ({snapshot['directory']})",
            highlight=False,
            soft_wrap=True,
        )


def _print_table(table: Any) -> None:
    out = Table(*table.column_names, box=None)
    for row in table.to_pylist():
        out.add_row(*("" if v is None else str(v) for v in row.values()))
    console.print(out)


@click.command("sql")
@click.argument("statement", required=False)
@click.option("--views", is_flag=True, help="List the views and their columns.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv"]),
    default="table",
    show_default=True,
    help="Output format.",
)
@db_option
def sql_command(statement: str | None, views: bool, fmt: str, db_url: str) -> None:
    """Query the ledger with DuckDB over read-only views.

    Views: ``events`` (the envelope, data as JSON) and one per kind with its
    data fields as columns (``request_sent``, ``response_received``, ...).
    Statements that would write are refused (exit 2).

    Example:

        ledger sql "SELECT kind, count(*) FROM events GROUP BY kind"
    """
    analytics = Analytics(_open(db_url))
    try:
        if views:
            for name, columns in analytics.views().items():
                console.print(f"[bold]{name}[/bold]: " + ", ".join(f"{c} {t}" for c, t in columns))
            return
        if not statement:
            raise click.UsageError("give a SQL statement, or --views")
        _emit(analytics.sql(statement), fmt)
    finally:
        analytics.close()


def _emit(table: Any, fmt: str) -> None:
    if fmt == "json":
        for row in table.to_pylist():
            click.echo(json.dumps(row, default=str))
    elif fmt == "csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, sys.stdout.buffer)
    else:
        _print_table(table)
