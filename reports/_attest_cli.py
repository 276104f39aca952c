"""``ledger attest``: write or verify an in-toto statement for a report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ledger import open_ledger
from ledger.cli_options import db_option

from ._attest import build_statement, check_statement, open_envelope, report_files, sign
from ._source import open_source


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
        _verify(verify_path, pubkey_path, report_dir, db_url)
        return
    if run_id is None or out_path is None:
        raise click.UsageError("give --run RUN_ID and --out FILE (or --verify FILE)")
    src = open_source(open_ledger(db_url, create=False), verify=True)  # the audit in the predicate checks it
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


def _verify(path: Path, pubkey_path: Path | None, report_dir: Path | None, db_url: str) -> None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        statement, problems = open_envelope(doc, pubkey_path.read_bytes() if pubkey_path else None)
        head = statement["predicate"]["ledger"]["head"]
    except (ValueError, KeyError, TypeError) as exc:
        raise click.BadParameter(f"not a readable statement: {exc}", param_hint="--verify") from exc
    src = open_source(open_ledger(db_url, create=False), until_seq=head["seq"] if head else None, verify=True)
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
