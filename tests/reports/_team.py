"""The team ledger the run-scope, group-source and streamed-report tests share: sim runs
(validation, a clean screening, its replay, a screening with a planted namespace leak), a committed
GPU study with replays and validation runs of its own, GPU probe records and another tool's
imported result file, in one SQLite ledger."""

from __future__ import annotations

import lzma
import sqlite3
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from ledger import open_ledger
from ledger._cli import cli
from ledger._jsonl import read_jsonl
from tests.ledger._helpers import tamper_sqlite
from tests.reports._sim_shape import FAST, SMALL, VALIDATION

DATA = Path(__file__).parent.parent / "data"


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _run(url: str, experiment: str, *params: str) -> str:
    """``ledger run`` on the sim into ``url``; the new run's id."""
    before = _runs(url)
    result = _invoke("run", experiment, "--db", url, "--target", "sim", *FAST, *params)
    assert result.exit_code in (0, 1), result.output  # 1: the run itself found a failure
    (run,) = set(_runs(url)) - set(before)
    return run


def _runs(url: str) -> list[str]:
    path = url.removeprefix("sqlite:///")
    if not Path(path).exists():
        return []
    with sqlite3.connect(path) as con:
        rows = con.execute("SELECT run_id FROM events WHERE kind = 'run.started' ORDER BY seq").fetchall()
    return [str(r[0]) for r in rows]


def _append_export(url: str, path: Path) -> None:
    """A committed export (JSON Lines, ``.xz`` or plain) appended as another study of the ledger."""
    opener: Any = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rb") as lines:
        led = open_ledger(url)
        try:
            led.append_sealed(read_jsonl(iter(lines.read().splitlines())))
        finally:
            led.close()


class Team:
    """The shared ledger: its URL, the sim runs by role, and every run it holds."""

    def __init__(self, folder: Path) -> None:
        self.url = f"sqlite:///{folder / 'team.db'}"
        self.validation = _run(self.url, "validation", *VALIDATION)
        self.screening = _run(self.url, "screening", *SMALL)
        result = _invoke("replay", self.screening, "--db", self.url, "--target", "sim", "--no-progress")
        assert result.exit_code in (0, 1), result.output
        (self.replay,) = set(_runs(self.url)) - {self.validation, self.screening}
        self.leaky = _run(self.url, "screening", *SMALL, "--param", "fault=namespace-leak")
        _append_export(self.url, DATA / "gpu-pooled" / "ledger.jsonl.xz")
        _append_export(self.url, DATA / "probes" / "pinned_alloc.jsonl")
        bench = str(DATA / "imports" / "vllm-bench.json")
        result = _invoke("import", "--from", "vllm-bench", bench, "--db", self.url)
        assert result.exit_code == 0, result.output
        self.runs = _runs(self.url)
        with sqlite3.connect(self.url.removeprefix("sqlite:///")) as con:
            self.imported = [
                str(r[0]) for r in con.execute("SELECT run_id FROM events WHERE kind = 'import.recorded'")
            ]


def copy_of(team: Team, path: Path) -> str:
    """A copy of the team ledger at ``path`` (to change without changing the module's): its URL."""
    with sqlite3.connect(team.url.removeprefix("sqlite:///")) as source, sqlite3.connect(path) as copy:
        source.backup(copy)
    return f"sqlite:///{path}"


def edited_copy(team: Team, folder: Path, run: str | None = None) -> tuple[str, int]:
    """A copy of the team ledger with one row edited behind the ledger's back (the last response of
    ``run``, or of any run): its URL and the edited row's seq."""
    path = folder / "edited.db"
    copy_of(team, path)
    last = "SELECT max(seq) FROM events WHERE kind = 'response.received'"
    with sqlite3.connect(path) as con:
        (seq,) = con.execute(*((last,) if run is None else (f"{last} AND run_id = ?", (run,)))).fetchone()
    url = f"sqlite:///{path}"
    tamper_sqlite(
        url, [f"UPDATE events SET data = replace(data, '\"status\":200', '\"status\":201') WHERE seq = {seq}"]
    )
    return url, int(seq)
