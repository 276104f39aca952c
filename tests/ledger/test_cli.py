"""The ``ledger`` command: help examples, exit codes, --db / KVLEDGER_URL, --json, redaction."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from sqlalchemy.engine import make_url

from ledger import open_ledger
from ledger._cli import LAZY_COMMANDS, cli

from ._helpers import notes, tamper_sqlite


def _exists(target: str) -> bool:
    module = target.split(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


AVAILABLE = sorted(name for name, (target, _) in LAZY_COMMANDS.items() if _exists(target))


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def filled(sqlite_url: str) -> str:
    ledger = open_ledger(sqlite_url)
    ledger.append_many(notes(5))
    ledger.close()
    return sqlite_url


@pytest.mark.parametrize("name", AVAILABLE)
def test_every_command_has_an_example(runner: CliRunner, name: str) -> None:
    result = runner.invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output


def test_root_help_lists_commands_and_has_example(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["--help"])
    assert result.exit_code == 0 and "Example" in result.output
    assert all(name in result.output for name in ("init", "import", "export", "events", "verify", "sql"))


def test_db_option_and_env(runner: CliRunner, filled: str) -> None:
    by_option = runner.invoke(cli, ["events", "--json", "--db", filled])
    by_env = runner.invoke(cli, ["events", "--json"], env={"KVLEDGER_URL": filled})
    assert by_option.exit_code == by_env.exit_code == 0
    assert by_option.output == by_env.output
    lines = [json.loads(line) for line in by_option.output.splitlines()]
    assert [e["seq"] for e in lines] == [1, 2, 3, 4, 5]
    assert set(lines[0]) == {"seq", "id", "ts", "kind", "run_id", "block_id", "data", "digest", "chain"}


def test_events_filters_and_table(runner: CliRunner, filled: str) -> None:
    result = runner.invoke(cli, ["events", "--kind", "note.added", "--limit", "2", "--db", filled])
    assert result.exit_code == 0 and "note.added" in result.output
    none = runner.invoke(cli, ["events", "--json", "--kind", "run.started", "--db", filled])
    assert none.exit_code == 0 and none.output == ""


def test_verify_exit_codes(runner: CliRunner, filled: str) -> None:
    ok = runner.invoke(cli, ["verify", "--json", "--db", filled])
    assert ok.exit_code == 0 and json.loads(ok.output)["ok"] is True
    wrong_head = runner.invoke(cli, ["verify", "--head", "f" * 64, "--db", filled])
    assert wrong_head.exit_code == 1
    tamper_sqlite(filled, ['UPDATE events SET data = \'{"text":"x"}\' WHERE seq = 2'])
    broken = runner.invoke(cli, ["verify", "--json", "--db", filled])
    assert broken.exit_code == 1 and json.loads(broken.output)["first_bad_seq"] == 2


def test_bad_usage_and_input_exit_2(runner: CliRunner, filled: str, tmp_path: Path) -> None:
    assert runner.invoke(cli, ["no-such-command"]).exit_code == 2
    assert runner.invoke(cli, ["export", "--db", filled]).exit_code == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": 1}\n')
    result = runner.invoke(cli, ["import", str(bad), "--db", filled])
    assert result.exit_code == 2 and "line 1" in result.output
    assert runner.invoke(cli, ["sql", "SELEC nonsense", "--db", filled]).exit_code == 2
    empty = f"sqlite:///{tmp_path / 'never-initialised.db'}"
    assert runner.invoke(cli, ["events", "--db", empty]).exit_code == 2


def test_export_import_roundtrip(runner: CliRunner, filled: str, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    assert (
        runner.invoke(
            cli, ["export", "--jsonl", str(out), "--parquet", str(tmp_path / "pq"), "--db", filled]
        ).exit_code
        == 0
    )
    assert (tmp_path / "pq" / "events.parquet").exists()
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    result = runner.invoke(cli, ["import", str(out), "--db", target])
    assert result.exit_code == 0, result.output
    first = open_ledger(filled).head()
    assert open_ledger(target).head() == first
    lines = out.read_bytes().splitlines()
    assert orjson.loads(lines[0])["seq"] == 1 and len(lines) == 5


@pytest.mark.parametrize("compress", ["xz", "gz"])
def test_a_compressed_export_imports_as_the_plain_one(
    runner: CliRunner, filled: str, tmp_path: Path, compress: str
) -> None:
    import gzip
    import lzma

    out = tmp_path / "out.jsonl"
    assert runner.invoke(cli, ["export", "--jsonl", str(out), "--db", filled]).exit_code == 0
    packed = tmp_path / f"out.jsonl.{compress}"
    packed.write_bytes((lzma.compress if compress == "xz" else gzip.compress)(out.read_bytes()))
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    result = runner.invoke(cli, ["import", str(packed), "--db", target])
    assert result.exit_code == 0, result.output
    assert open_ledger(target).head() == open_ledger(filled).head()
    # Bytes that are not what the name says: refused, naming the file, nothing written.
    broken = tmp_path / f"broken.jsonl.{compress}"
    broken.write_bytes(out.read_bytes())
    other = tmp_path / "other.db"
    result = runner.invoke(cli, ["import", str(broken), "--db", f"sqlite:///{other}"])
    assert result.exit_code == 2 and "not a readable compressed file" in result.output, result.output
    assert not other.exists() or open_ledger(f"sqlite:///{other}").head() is None


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE TABLE x (a INT)",
        "INSERT INTO events SELECT * FROM events",
        "COPY (SELECT 1) TO 'out.csv'",
        "ATTACH 'other.db'",
        "DROP VIEW events",
        "UPDATE events SET kind = 'x'",
        "DELETE FROM events",
        "PRAGMA threads=1",
        "SET threads=1",
        "INSTALL httpfs",
        "LOAD httpfs",
        "EXPORT DATABASE 'dir'",
        "SELECT 1; DROP VIEW events",
        "EXPLAIN ANALYZE COPY (SELECT 1) TO 'out.csv'",
        "CREATE MACRO m(a) AS a",
        "DETACH memory",
        "CHECKPOINT",
        "VACUUM",
    ],
)
def test_sql_refuses_writes(
    runner: CliRunner, filled: str, statement: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(cli, ["sql", statement, "--db", filled])
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "out.csv").exists()


def test_sql_reads(runner: CliRunner, filled: str) -> None:
    result = runner.invoke(
        cli, ["sql", "SELECT count(*) AS n FROM note_added", "--format", "json", "--db", filled]
    )
    assert result.exit_code == 0 and json.loads(result.output) == {"n": 5}
    views = runner.invoke(cli, ["sql", "--views", "--db", filled])
    assert views.exit_code == 0 and "note_added" in views.output


@pytest.mark.postgres
def test_password_never_printed(runner: CliRunner, pg_url: str, tmp_path: Path) -> None:
    secret = "s3cret-pw"
    url = make_url(pg_url).set(password=secret).render_as_string(hide_password=False)
    outputs = [
        runner.invoke(cli, ["init", "--db", url]),
        runner.invoke(cli, ["verify", "--db", url]),
        runner.invoke(cli, ["events", "--db", url]),
    ]
    missing = make_url(url).set(database="kvledger_no_such_db").render_as_string(hide_password=False)
    failing = runner.invoke(cli, ["events", "--db", missing])
    assert failing.exit_code == 2
    for result in [*outputs, failing]:
        assert secret not in result.output
        assert secret not in str(result.exception or "")
    assert outputs[0].exit_code == 0 and "***" in outputs[0].output
