"""``ledger report``, ``ledger audit`` and ``ledger attest``: read-only commands over the ledger."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import click

from ledger import Ledger, open_ledger
from ledger.cli_options import db_option, events_per_group_option, json_option, run_option, runs_option

from . import _render
from ._attest import build_statement, check_statement, open_envelope, report_files, sign
from ._audit import BLOCKING, EXAMPLES, audit_json, audit_object, audit_runs_json, grouped
from ._derive import derive_report
from ._source import Source, open_source
from ._stream import report_and_audit


def _open_source(led: Ledger, run_ids: tuple[str, ...], verify: bool = False) -> Source:
    # A run's report derives that run's observations (and its replays' and the validation runs'),
    # not every run's: on a ledger of many runs it costs the verification and the run's own rows.
    # Several runs share one source: one verification, their observations derived together.
    runs = list(dict.fromkeys(run_ids)) or None
    src = open_source(led, verify=verify, runs=runs)
    # A run of the ledger's own, or another tool's imported results (a run of its own too).
    known = "SELECT run_id FROM kv_runs UNION ALL SELECT run_id FROM kv_imports"
    for run_id in runs or ():
        if not src.scalar(f"SELECT count(*) FROM ({known}) WHERE run_id = $r", {"r": run_id}):
            src.close()
            raise click.BadParameter(f"no run {run_id!r} in the ledger", param_hint="--run")
    return src


@click.command("report")
@run_option
@json_option
@click.option("--markdown", "as_markdown", is_flag=True, help="Print Markdown.")
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write one static HTML file with figures.",
)
@click.option(
    "--pool-replays",
    is_flag=True,
    help="Add Table 3 over each run and its replays (same plan, config and hardware) pooled: their "
    "block pairs counted as one sample; a replay left out is named with what differs.",
)
@events_per_group_option
@db_option
def report_command(
    run_id: str | None,
    as_json: bool,
    as_markdown: bool,
    html_path: Path | None,
    pool_replays: bool,
    events_per_group: int | None,
    db_url: str,
) -> None:
    """The report derived from the ledger: pairing, exclusions, the study's tables.

    TTFT by size × locality (Table 3), session time by routing (Table 4), decode
    rate, window throughput, validation layers (Table 2) and accounting. The
    unit is the block pair: fewer than 6 pairs are reported descriptively. The
    same ledger head gives byte-identical JSON and Markdown; the report names
    that head.

    Example:

        ledger report --run 0193... --markdown > report.md && ledger report --html report.html

    A run replayed with `ledger replay` sent the same requests again; with
    --pool-replays, Table 3 is also given over the run and its replays together,
    so that three replays of a two-pair screening reach the six block pairs an
    interval needs. Only a replay on the same hardware (the device models its
    replicas reported) joins: one on another GPU is named beside the table,
    with both, and left out:

        ledger report --pool-replays --markdown
    """
    if as_json and as_markdown:
        raise click.UsageError("give at most one of --json and --markdown")
    led = open_ledger(db_url, create=False)
    if run_id is None:
        # The whole ledger's (group of runs by group of runs where it is large: the same bytes); the
        # HTML page opens with the audit's verdict, its chain checked as the rows are read.
        derived = report_and_audit(
            led,
            verify=html_path is not None,
            pool_replays=pool_replays,
            events_per_group=events_per_group,
            with_audit=html_path is not None,
        )
        assert derived.report is not None  # asked for
        report = derived.report
        audit = audit_object(derived.findings, derived.head) if html_path is not None else None
    else:
        src = _open_source(led, (run_id,), verify=html_path is not None)
        try:
            report = derive_report(src, run_id, pool_replays=pool_replays)
            audit = audit_json(src, run_id) if html_path is not None else None
        finally:
            src.close()
    if html_path is not None:
        from ._html import to_html

        html_path.write_text(to_html(report, audit), encoding="utf-8")
        click.echo(f"wrote {html_path}", err=True)
    if as_json:
        sys.stdout.write(_render.to_json(report))
    elif as_markdown:
        sys.stdout.write(_render.to_markdown(report))
    elif html_path is None:
        _render.print_terminal(report)


@click.command("audit")
@runs_option
@click.option("--publish", is_flag=True, help="Exit 1 if any finding is blocking (the publishing gate).")
@json_option
@events_per_group_option
@db_option
def audit_command(
    run_ids: tuple[str, ...], publish: bool, as_json: bool, events_per_group: int | None, db_url: str
) -> None:
    """Audit the ledger: chain, pairing, exclusions, assertions, provenance, validation.

    Prints every finding (code, severity, run, block, target, detail);
    severities are documented in reports/AUDIT.md. With --publish, exit 1 on
    any blocking finding. --run audits one run; repeated, several runs, with
    the ledger verified once for all of them (each run's findings are those
    its own audit gives, and a finding about the whole ledger is listed once).

    Example:

        ledger audit --publish --json
        ledger audit --run 0193...a --run 0193...b --publish
    """
    led = open_ledger(db_url, create=False)
    if not run_ids:
        # The whole ledger's (group of runs by group of runs where it is large: the same findings).
        derived = report_and_audit(led, events_per_group=events_per_group, with_report=False)
        result = audit_object(derived.findings, derived.head)
    else:
        src = _open_source(led, run_ids, verify=True)  # the chain is checked while the views are built
        try:
            result = audit_runs_json(src, list(dict.fromkeys(run_ids)))
        finally:
            src.close()
    findings = result["findings"]
    if as_json:
        sys.stdout.write(json.dumps(result, sort_keys=True, indent=2, ensure_ascii=False) + "\n")
    else:
        _print_findings(findings, result["head"])
    if publish and any(f["severity"] == BLOCKING for f in findings):
        sys.exit(1)


def _print_findings(findings: list[dict[str, object]], head: str | None) -> None:
    """One row per finding, except that a code found more than EXAMPLES times is one group row
    (its count) followed by its first EXAMPLES instances."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    blocking = sum(f["severity"] == BLOCKING for f in findings)
    groups = grouped(findings)
    shown_head = head if console.width >= _render.WIDE_TERMINAL else _render.short(head)
    counts = f"{len(findings)} finding(s) of {len(groups)} code(s), {blocking} blocking"
    console.print(f"audit at head {shown_head}: {counts}")
    if not findings:
        console.print("findings: none")
        return
    if console.width < _render.WIDE_TERMINAL:
        _print_findings_narrow(console, groups)
        return
    table = Table("severity", "code", "run", "block", "target", "detail")
    for group in groups:
        style = {"blocking": "red", "warning": "yellow"}.get(str(group["severity"]), "dim")
        severity, code = f"[{style}]{group['severity']}[/{style}]", str(group["code"])
        many = group["count"] > EXAMPLES
        if many:
            table.add_row(
                severity,
                f"{code} ×{group['count']}",
                "",
                "",
                "",
                f"{group['count']} findings; the first {EXAMPLES} follow (--json lists all)",
            )
        for f in group["examples"]:  # every instance when there are no more than EXAMPLES
            table.add_row(
                "" if many else severity,
                "  e.g." if many else code,
                str(f["run_id"] or "")[:13],
                str(f["block_id"] or "")[:13],
                str(f["target"] or "")[:20],
                str(f["detail"]),
            )
    console.print(table)


def _print_findings_narrow(console: Any, groups: list[dict[str, Any]]) -> None:
    """The findings as a list that reads at 80 columns: a line per code, a line per instance
    (short run and block ids, the target), its detail indented below, wrapped as prose."""
    width = max(40, console.width)
    label = _render.terminal_run_label(
        sorted({str(f["run_id"]) for g in groups for f in g["examples"] if f["run_id"]})
    )
    for group in groups:
        style = {"blocking": "red", "warning": "yellow"}.get(str(group["severity"]), "dim")
        count = group["count"]
        more = f" (the first {EXAMPLES} follow; --json lists all)" if count > EXAMPLES else ""
        console.print(
            f"[{style}]{group['severity']}[/{style}] [bold]{group['code']}[/bold] ×{count}{more}",
            highlight=False,
        )
        for f in group["examples"]:
            where = [
                f"run {label(f['run_id'])}" if f["run_id"] else None,
                f"block {str(f['block_id'])[:8]}" if f["block_id"] else None,
                str(f["target"]) if f["target"] else None,
            ]
            console.print("  " + " · ".join(w for w in where if w), highlight=False, markup=False)
            detail = textwrap.fill(
                str(f["detail"]),
                width=width,
                initial_indent="    ",
                subsequent_indent="    ",
                break_on_hyphens=False,
                break_long_words=False,
            )
            console.print(detail, highlight=False, markup=False, soft_wrap=True)


@click.command("attest")
@click.option("--run", "run_id", metavar="RUN_ID", default=None, help="The run whose report is attested.")
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the statement (or DSSE envelope when signed) here.",
)
@click.option(
    "--key",
    "key_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Ed25519 private key (PEM) to sign with (DSSE envelope).",
)
@click.option(
    "--report-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where report.json and report.md are written (default: next to --out).",
)
@click.option(
    "--verify",
    "verify_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Check this statement against the ledger instead of writing one.",
)
@click.option(
    "--pubkey",
    "pubkey_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Ed25519 public key (PEM) to check a signed statement with.",
)
@db_option
def attest_command(
    run_id: str | None,
    out_path: Path | None,
    key_path: Path | None,
    report_dir: Path | None,
    verify_path: Path | None,
    pubkey_path: Path | None,
    db_url: str,
) -> None:
    """Write an in-toto statement binding a run's report to the ledger head.

    Subjects: report.json and report.md (written to --report-dir) with their
    SHA-256. Predicate: ledger head, run ids, checkpoint and config digests,
    package versions, audit result. --key signs it (Ed25519, DSSE). --verify
    checks the signature (with --pubkey) and re-derives the reports at the
    attested head; exit 1 if anything differs.

    Example:

        ledger attest --run 0193... --out report.intoto.json --key key.pem
        ledger attest --verify report.intoto.json --pubkey key.pub.pem
    """
    if verify_path is not None:
        _verify_statement(verify_path, pubkey_path, report_dir, db_url)
        return
    if run_id is None or out_path is None:
        raise click.UsageError("give --run RUN_ID and --out FILE (or --verify FILE)")
    # The audit in the predicate checks the chain; the tables hold the run's observations.
    src = open_source(open_ledger(db_url, create=False), verify=True, runs=[run_id])
    try:
        if not src.scalar("SELECT count(*) FROM kv_runs WHERE run_id = $r", {"r": run_id}):
            raise click.BadParameter(f"no run {run_id!r} in the ledger", param_hint="--run")
        files = report_files(src, run_id)
        statement = build_statement(src, run_id, files)
    finally:
        src.close()
    directory = report_dir or out_path.parent
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    doc = sign(statement, key_path.read_bytes()) if key_path else statement
    out_path.write_text(
        json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    click.echo(f"wrote {out_path} ({'signed' if key_path else 'unsigned'}); reports in {directory}")


def _verify_statement(path: Path, pubkey_path: Path | None, report_dir: Path | None, db_url: str) -> None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        statement, problems = open_envelope(doc, pubkey_path.read_bytes() if pubkey_path else None)
        head = statement["predicate"]["ledger"]["head"]
        run = statement["predicate"]["scope"]["run"]
    except (ValueError, KeyError, TypeError) as exc:
        raise click.BadParameter(f"not a readable statement: {exc}", param_hint="--verify") from exc
    src = open_source(
        open_ledger(db_url, create=False),
        until_seq=head["seq"] if head else None,
        verify=True,
        runs=[run] if isinstance(run, str) else None,
    )
    try:
        problems += check_statement(statement, src, report_dir)
    finally:
        src.close()
    if problems:
        for p in problems:
            click.echo(f"FAIL: {p}", err=True)
        sys.exit(1)
    click.echo(
        f"ok: statement matches the ledger at seq {head['seq'] if head else 0}"
        + (" and its signature verifies" if "payloadType" in doc else "")
    )


@click.command("compare")
@click.argument("run_a", metavar="RUN_A")
@click.argument("run_b", metavar="RUN_B")
@json_option
@db_option
def compare_command(run_a: str, run_b: str, as_json: bool, db_url: str) -> None:
    """Two runs' tables side by side, each with its paired ON/OFF change.

    Per cell (size, locality, routing, ...): each run's OFF and ON medians and
    its change (Hodges–Lehmann with an exact interval from 6 block pairs up,
    else the descriptive mean), and B − A over the block pairs both runs have.
    Each run is named with the hardware its replicas reported, and two runs on
    different hardware are said to differ in it. Prints Markdown, or JSON with
    --json.

    Example:

        ledger compare 0193aaaa-... 0193bbbb-... --db sqlite:///study.db > compare.md
    """
    from ._compare import compare, compare_markdown

    src = open_source(open_ledger(db_url, create=False), runs=[run_a, run_b])
    try:
        for run in (run_a, run_b):
            if not src.scalar("SELECT count(*) FROM kv_runs WHERE run_id = $r", {"r": run}):
                raise click.BadParameter(f"no run {run!r} in the ledger", param_hint="RUN_A/RUN_B")
        result = compare(src, run_a, run_b)
    finally:
        src.close()
    sys.stdout.write(_render.to_json(result) if as_json else compare_markdown(result))
