"""kvledger's event store: an append-only, hash-chained ledger on SQLite or PostgreSQL.

>>> from ledger import open_ledger, NewEvent
>>> led = open_ledger("sqlite:///ledger.db")            # doctest: +SKIP
>>> led.append(NewEvent("note.added", {"text": "hi"}))   # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._analytics import Analytics, check_read_only, to_format, view_name
from ._backends import DEFAULT_URL, redact_url
from ._canonical import canonical_json, sha256_hex
from ._errors import (
    EXIT_BAD_INPUT,
    EXIT_CHECK_FAILED,
    EXIT_OK,
    BackendError,
    ConflictError,
    EventError,
    ExperimentError,
    ImportFileError,
    LedgerError,
    ParamError,
    QueryError,
    ReplayError,
    SchemaError,
    TargetError,
)
from ._events import GENESIS, Event, Head, NewEvent, event_digest, next_chain
from ._ids import new_id, utc_now
from ._jsonl import export_jsonl, import_jsonl, read_jsonl
from ._parquet import export_parquet
from ._store import Ledger, open_ledger
from ._verify import Verification, native_path, verify_ledger
from ._vocabulary import KINDS


def verify(
    ledger: Ledger, expected_head: str | None = None, *, beside_other_work: bool = False
) -> Verification:
    """Recompute every digest and chain link of ``ledger``; names the first bad seq.

    ``beside_other_work``: the caller keeps the cores busy meanwhile (a report's
    views), so the native scanner uses one thread rather than one per core;
    the Python path keeps its worker processes (a thread of it would hold the GIL).
    """
    workers = 1 if beside_other_work and native_path(ledger) is not None else None
    return verify_ledger(ledger, expected_head, workers=workers)


def query(
    url_or_ledger: str | Ledger, statement: str, fmt: str = "arrow", snapshot_root: Path | None = None
) -> Any:
    """Run a reading SQL statement over the ledger; ``fmt``: arrow, pandas or polars."""
    ledger = open_ledger(url_or_ledger, create=False) if isinstance(url_or_ledger, str) else url_or_ledger
    analytics = Analytics(ledger, snapshot_root)
    try:
        return to_format(analytics.sql(statement), fmt)
    finally:
        analytics.close()


__all__ = [
    "DEFAULT_URL",
    "EXIT_BAD_INPUT",
    "EXIT_CHECK_FAILED",
    "EXIT_OK",
    "GENESIS",
    "KINDS",
    "Analytics",
    "BackendError",
    "ConflictError",
    "Event",
    "EventError",
    "ExperimentError",
    "Head",
    "ImportFileError",
    "Ledger",
    "LedgerError",
    "NewEvent",
    "ParamError",
    "QueryError",
    "ReplayError",
    "SchemaError",
    "TargetError",
    "Verification",
    "canonical_json",
    "check_read_only",
    "event_digest",
    "export_jsonl",
    "export_parquet",
    "import_jsonl",
    "new_id",
    "next_chain",
    "open_ledger",
    "query",
    "read_jsonl",
    "redact_url",
    "sha256_hex",
    "utc_now",
    "verify",
    "view_name",
]
