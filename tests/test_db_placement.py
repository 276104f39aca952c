"""``ledger --db URL COMMAND`` works as well as ``ledger COMMAND --db URL``, for every command taking --db."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from ledger import open_ledger
from ledger._cli import LAZY_COMMANDS, cli


def _commands_with_db() -> Iterator[tuple[str, ...]]:
    """Every command path (``("probe", "helpers")``) whose command has a ``--db`` option."""
    ctx = click.Context(cli)

    def walk(path: tuple[str, ...], command: click.Command) -> Iterator[tuple[str, ...]]:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                yield from walk((*path, name), sub)
        elif any(p.name == "db_url" for p in command.params):
            yield path

    for name in sorted(LAZY_COMMANDS):
        command = cli.get_command(ctx, name)
        assert command is not None
        yield from walk((name,), command)


DB_COMMANDS = sorted(_commands_with_db())


@pytest.fixture(autouse=True)
def _snapshot_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLEDGER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KVLEDGER_URL", raising=False)


def _both(*args: str, url: str, before: bool) -> Result:
    """``ledger --db URL ARGS`` (before) or ``ledger ARGS --db URL``."""
    argv = ["--db", url, *args] if before else [*args, "--db", url]
    return CliRunner().invoke(cli, argv, catch_exceptions=False)


def test_the_walk_finds_the_commands_that_open_a_ledger() -> None:
    names = {path[0] for path in DB_COMMANDS}
    assert {"init", "import", "events", "verify", "sql", "run", "report", "audit", "demo"} <= names
    assert ("probe", "helpers") in DB_COMMANDS and ("checkpoint", "audit") in DB_COMMANDS
    assert "sim" not in names  # serves loopback replicas, opens no ledger


@pytest.mark.parametrize("path", DB_COMMANDS, ids=" ".join)
def test_root_db_reaches_every_command(path: tuple[str, ...], tmp_path: Path) -> None:
    # Two different URLs, one on each side: the command resolves the root's URL, sees its own
    # differ and refuses at parse time, before it opens or writes anything.
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    result = CliRunner().invoke(cli, ["--db", f"sqlite:///{first}", *path, "--db", f"sqlite:///{second}"])
    assert result.exit_code == 2, result.output
    assert "given twice with different URLs" in result.output and str(first) in result.output
    assert not first.exists() and not second.exists()


def test_store_commands_read_the_same_ledger_either_way(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'placed.db'}"
    assert _both("init", url=url, before=True).exit_code == 0
    assert (tmp_path / "placed.db").exists()
    run = _both("run", "experiments/examples/hello.py", "--param", "time_scale=0.0001", url=url, before=True)
    assert run.exit_code == 0, run.output
    with open_ledger(url, create=False) as led:
        (started,) = list(led.events(kind="run.started"))
    run_id = str(started.run_id)
    for args in (
        ("events", "--json"),
        ("verify", "--json"),
        ("sql", "SELECT count(*) AS n FROM request_sent", "--format", "json"),
        ("report", "--run", run_id, "--json"),
        ("audit", "--run", run_id, "--json"),
    ):
        before, after = _both(*args, url=url, before=True), _both(*args, url=url, before=False)
        assert before.exit_code == after.exit_code == 0, (args, before.output)
        assert before.output == after.output and before.output.strip(), args


def test_writing_commands_write_to_the_root_url(tmp_path: Path) -> None:
    source = f"sqlite:///{tmp_path / 'source.db'}"
    run = _both(
        "run", "experiments/examples/hello.py", "--param", "time_scale=0.0001", url=source, before=True
    )
    assert run.exit_code == 0, run.output
    with open_ledger(source, create=False) as led:
        run_id = str(next(iter(led.events(kind="run.started"))).run_id)
        recorded = led.head()
    assert recorded is not None

    export = tmp_path / "source.jsonl"
    assert _both("export", "--jsonl", str(export), url=source, before=True).exit_code == 0
    copy = f"sqlite:///{tmp_path / 'copy.db'}"
    assert _both("import", str(export), url=copy, before=True).exit_code == 0
    with open_ledger(copy, create=False) as led:
        assert led.head() == recorded

    replay = _both("replay", run_id, "--no-progress", url=source, before=True)
    assert replay.exit_code == 0, replay.output
    statement = tmp_path / "statement.json"
    attest = _both("attest", "--run", run_id, "--out", str(statement), url=source, before=True)
    assert attest.exit_code == 0, attest.output

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "weights.bin").write_bytes(b"weights")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"weights.bin": hashlib.sha256(b"weights").hexdigest()}))
    audited = _both(
        "checkpoint", "audit", str(checkpoint), "--manifest", str(manifest), url=source, before=True
    )
    assert audited.exit_code == 0, audited.output

    with open_ledger(source, create=False) as led:
        kinds = [e.kind for e in led.events()]
        runs = {e.run_id for e in led.events(kind="run.started")}
    assert len(runs) == 2  # the run and its replay
    assert kinds.count("checkpoint.audited") == 1
    assert json.loads(statement.read_text())["predicateType"]
