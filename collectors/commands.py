"""Collector commands: ``ledger checkpoint audit`` and ``ledger probe ...``."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ledger import NewEvent, import_jsonl, open_ledger
from ledger.cli_options import db_option, json_option

from ._checkpoint import audit_checkpoint, manifest_for

console = Console()


@click.group("checkpoint")
def checkpoint_group() -> None:
    """Checkpoint provenance: hash model files and compare with a published revision.

    Example:

        ledger checkpoint audit ~/.cache/huggingface/hub/models--org--name/snapshots/REV
    """


@checkpoint_group.command("audit")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--revision", default=None, help="The published revision these files should match.")
@click.option(
    "--manifest",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Expected hashes: JSON {name: sha256} or sha256sum output.",
)
@click.option("--run", "run_id", default=None, help="Record the audit in this run.")
@click.option("--workers", type=int, default=None, help="Files hashed at once (default: CPUs).")
@json_option
@db_option
def checkpoint_audit_command(
    directory: Path,
    revision: str | None,
    manifest: Path | None,
    run_id: str | None,
    workers: int | None,
    as_json: bool,
    db_url: str,
) -> None:
    """Hash every file of a checkpoint (SHA-256) and record `checkpoint.audited`.

    Expected hashes come from --manifest (JSON {name: sha256}, as written by
    `ledger checkpoint manifest`, or sha256sum output), or from a Hugging
    Face cache snapshot (LFS blobs are named by their SHA-256, other files by
    their git blob SHA-1). Exit 1 if a file does not match, is missing, has
    no reference (unverified), or changed while it was read.

    Example:

        ledger checkpoint audit ./tiny-model --manifest ./tiny-model/MANIFEST.json
    """
    if not directory.is_dir():
        raise click.BadParameter(f"not a directory: {directory}", param_hint="DIRECTORY")
    try:
        audit = audit_checkpoint(directory, revision, manifest, workers)
    except ValueError as exc:  # a malformed manifest: nothing recorded
        raise click.BadParameter(str(exc), param_hint="--manifest") from None
    ledger = open_ledger(db_url)
    event = ledger.append(NewEvent("checkpoint.audited", audit.data(), run_id=run_id))
    if as_json:
        click.echo(json.dumps({"seq": event.seq, **audit.data()}))
    else:
        _print_audit(audit.data())
    for problem in audit.problems:
        click.echo(("unverified: " if audit.matched is None else "problem: ") + problem, err=True)
    sys.exit(0 if not audit.problems else 1)


@checkpoint_group.command("manifest")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write here instead of standard output.",
)
@click.option("--workers", type=int, default=None, help="Files hashed at once (default: CPUs).")
def checkpoint_manifest_command(directory: Path, output: Path | None, workers: int | None) -> None:
    """Print a checkpoint's manifest, JSON {file: sha256}, for later audits.

    Make it where the checkpoint is known good (as published, or right after
    its download was verified) and keep it apart from the files. Nothing is
    recorded in the ledger.

    Example:

        ledger checkpoint manifest ./my-model > my-model.manifest.json
        ledger checkpoint audit ./my-model --manifest my-model.manifest.json
    """
    text = json.dumps(manifest_for(directory, workers), indent=2, sort_keys=True) + "\n"
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)


def _print_audit(data: dict[str, object]) -> None:
    table = Table("file", "bytes", "sha256", "reference", box=None)
    files = data["files"]
    assert isinstance(files, list)
    for f in files:
        expected = f["expected_sha256"] or f.get("expected_git_sha1")
        kind = "sha256" if f["expected_sha256"] else "git-sha1"
        ok = expected in (f["sha256"], f.get("git_sha1"))
        verdict = "[green]ok[/green]" if ok else "[red]MISMATCH[/red]"
        mark = "—" if expected is None else f"{verdict} {kind}"
        table.add_row(f["name"], f"{f['bytes']:,}", f["sha256"][:16] + "…", mark)
    console.print(table)
    console.print(f"matched: {data['matched']}  stable: {data['stable']}  reference: {data['reference']}")


@click.group("probe")
def probe_group() -> None:
    """GPU byte probes of the KV transfer path, recorded as validation events.

    Example:

        ledger probe copy-ordering --db sqlite:///study.db
    """


def _run_probe(name: str, db_url: str, extra: tuple[str, ...]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "probe.jsonl"
        cmd = [sys.executable, "-m", "collectors.probes", name, "--jsonl", str(out), *extra]
        status = subprocess.call(cmd)
        if status != 0:
            sys.exit(status)
        ledger = open_ledger(db_url)
        count = import_jsonl(ledger, out)
    console.print(f"recorded {count:,} events from `{name}`")


@probe_group.command("copy-ordering", context_settings={"ignore_unknown_options": True})
@click.argument("probe_args", nargs=-1, type=click.UNPROCESSED)
@db_option
def copy_ordering_command(probe_args: tuple[str, ...], db_url: str) -> None:
    """Copy-ordering probe: raw cudaMemcpy fallback vs three ordered controls.

    Needs CUDA (exit 2 without). Events: `probe.copy`, one per check, inside a
    run of their own; the whole matrix is recorded atomically.

    Example:

        ledger probe copy-ordering --db sqlite:///study.db
    """
    _run_probe("copy-ordering", db_url, probe_args)


@probe_group.command("pinned-alloc", context_settings={"ignore_unknown_options": True})
@click.argument("probe_args", nargs=-1, type=click.UNPROCESSED)
@db_option
def pinned_alloc_command(probe_args: tuple[str, ...], db_url: str) -> None:
    """Pinned-allocation probe: power-of-two rounding with and without the threshold.

    Needs CUDA (exit 2 without). Events: `probe.pinned_alloc`.

    Example:

        ledger probe pinned-alloc --db sqlite:///study.db
    """
    _run_probe("pinned-alloc", db_url, probe_args)


@probe_group.command("helpers", context_settings={"ignore_unknown_options": True})
@click.argument("probe_args", nargs=-1, type=click.UNPROCESSED)
@db_option
def helpers_command(probe_args: tuple[str, ...], db_url: str) -> None:
    """Helper probe: LMCache's lazy and mixed allocators through its GPU copy helpers.

    Moves known bytes between an LMCache memory object (pinned host) and the
    GPU through lmcache.v1.gpu_connector.gpu_ops, both directions, with the
    producer stream delayed and not, with LMCache's compiled ops present and
    masked (its raw cudaMemcpy fallback). Needs CUDA and LMCache (exit 2
    without). Events: `probe.helper`, one per check. Arguments after the
    options go to `python -m collectors.probes helper-probes`.

    Example:

        ledger probe helpers --db sqlite:///study.db --devices 0 --trials 5
    """
    _run_probe("helper-probes", db_url, probe_args)


@probe_group.command("pinned-pool", context_settings={"ignore_unknown_options": True})
@click.argument("probe_args", nargs=-1, type=click.UNPROCESSED)
@db_option
def pinned_pool_command(probe_args: tuple[str, ...], db_url: str) -> None:
    """Pool probe: LMCache's local CPU pool at sizes around powers of two, reserved vs requested.

    Builds the pool from LMCACHE_MAX_LOCAL_CPU_SIZE as LMCache's local CPU
    backend does, with its ops present and masked and under each PyTorch
    host-allocator setting tried (a refused one is recorded). Needs CUDA and
    LMCache (exit 2 without). Events: `probe.pinned`.

    Example:

        ledger probe pinned-pool --db sqlite:///study.db --deadline 120
    """
    _run_probe("pinned-pool", db_url, probe_args)
