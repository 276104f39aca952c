"""Fixtures: synthetic ledgers imported into real databases (``ledger_url`` from tests/conftest.py:
SQLite, and PostgreSQL where the server is available)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ledger import Event, Ledger, open_ledger, query, read_jsonl
from reports import Source, open_source

from .._cli import ledger_cli
from ._team import Team


@pytest.fixture(autouse=True)
def _snapshot_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Parquet snapshots go under the test's tmp dir, never the user's cache.
    monkeypatch.setenv("KVLEDGER_CACHE", str(tmp_path / "cache"))


def import_envelopes(url: str, envelopes: list[dict[str, Any]]) -> Ledger:
    """An imported ledger: bare envelopes through the ledger's own JSONL validation."""
    led = open_ledger(url)
    led.append_sealed(read_jsonl(iter(orjson.dumps(e) for e in envelopes)))
    return led


def import_export(path: Path, url: str) -> list[Event]:
    """A committed export (JSON Lines, ``.xz`` as committed) imported by ``ledger import`` into
    the empty ledger at ``url``; its events, as the ledger now holds them."""
    result = ledger_cli("import", str(path), "--db", url)
    assert result.exit_code == 0, result.output
    led = open_ledger(url)
    try:
        return list(led.events())
    finally:
        led.close()


def ledger_rows(url: str, statement: str) -> list[dict[str, Any]]:
    """``statement`` over the ledger's views at ``url``, each row a dict."""
    led = open_ledger(url)
    try:
        rows: list[dict[str, Any]] = query(led, statement).to_pylist()
        return rows
    finally:
        led.close()


def payload_digests(events: list[Event], run: str) -> dict[str, str]:
    """Each request key of ``run`` and the SHA-256 of the payload it sent (one request per key)."""
    sent = [e for e in events if e.kind == "request.sent" and e.run_id == run]
    keys = [e.data["request_key"] for e in sent]
    assert len(keys) == len(set(keys))  # one request per key
    return {e.data["request_key"]: e.data["payload_sha256"] for e in sent}


def replica_gpus(events: list[Event], run: str) -> set[str]:
    """The UUIDs of the GPUs ``run``'s replicas were launched on, as the launches record them."""
    return {
        e.data["gpu"]["uuid"]
        for e in events
        if e.kind == "deployment.launched" and e.run_id == run and e.data["gpu"]
    }


POOLED_HEADER = "| size | cold | first local reuse | cross-replica reuse |"


def documented_table(header: str, section: str = "") -> dict[int, list[str]]:
    """The Markdown table of docs/gpu-study.md whose header line is ``header`` (the first after
    the heading ``section``, when given): its first column's size → the other cells as written."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "gpu-study.md").read_text()
    after = doc[doc.index(section) :] if section else doc
    table = after[after.index(header) :].split("\n\n")[0]
    documented = {}
    for line in table.splitlines()[2:]:
        size, *cells = [c.strip() for c in line.strip().strip("|").split("|")]
        documented[int(size.replace(",", ""))] = cells
    return documented


def documented_pooled_table(section: str) -> dict[int, list[str]]:
    """The pooled Table 3 that docs/gpu-study.md gives under the heading ``section``: size → its
    cells (cold, first local reuse, cross-replica reuse) as written."""
    return documented_table(POOLED_HEADER, section)


def pooled_table(report: dict[str, Any]) -> dict[int, list[str]]:
    """The report's pooled Table 3 (``--pool-replays``) written as the docs write it: the
    Hodges–Lehmann change and its Wilcoxon interval, per size in the report's order."""
    derived: dict[int, list[str]] = {}
    for cell in report["tables"]["ttft_series"]:
        estimate, ci = cell["inference"]["hodges_lehmann_change_pct"], cell["inference"]["wilcoxon_ci"]
        text = f"{estimate:+.1f} % [{ci['low']:+.1f}, {ci['high']:+.1f}]"
        derived.setdefault(cell["nominal_tokens"], []).append(text)
    return derived


@pytest.fixture
def build(ledger_url: str) -> Iterator[Any]:
    """``build(envelopes) -> Source`` over a fresh ledger at ``ledger_url``."""
    opened: list[Source] = []

    def _build(envelopes: list[dict[str, Any]]) -> Source:
        src = open_source(import_envelopes(ledger_url, envelopes))
        opened.append(src)
        return src

    yield _build
    for src in opened:
        src.close()
        src.ledger.close()


@pytest.fixture
def build_lite(sqlite_url: str) -> Iterator[Any]:
    """Like ``build`` but SQLite only: for tests about derivation rather than storage."""
    src_list: list[Source] = []

    def _build(envelopes: list[dict[str, Any]]) -> Source:
        src = open_source(import_envelopes(sqlite_url, envelopes))
        src_list.append(src)
        return src

    yield _build
    for src in src_list:
        src.close()
        src.ledger.close()


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Team:
    """The team ledger of tests/reports/_team.py, made once per module that asks for it."""
    return Team(tmp_path_factory.mktemp("team"))


@pytest.fixture
def team_ledger(team: Team) -> Iterator[Ledger]:
    """The team ledger, open."""
    led = open_ledger(team.url, create=False)
    yield led
    led.close()
