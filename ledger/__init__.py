"""kvledger's event store: an append-only, hash-chained ledger on SQLite or PostgreSQL.

>>> from ledger import open_ledger, NewEvent
>>> led = open_ledger("sqlite:///ledger.db")            # doctest: +SKIP
>>> led.append(NewEvent("note.added", {"text": "hi"}))   # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The error tree is imported at once: it has no dependencies, and standard-library-only modules
# (the CPU engine builder, the process launcher) derive their errors from it.
from ._errors import (
    EXIT_BAD_INPUT,
    EXIT_CHECK_FAILED,
    EXIT_OK,
    BackendError,
    CompactError,
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
from ._lazy import lazy_exports

if TYPE_CHECKING:
    from pathlib import Path

    from ._analytics import Analytics, check_read_only, view_name
    from ._analytics import to_format as to_format  # not in __all__, kept importable
    from ._backends import DEFAULT_URL, redact_url
    from ._canonical import canonical_json, sha256_hex
    from ._events import GENESIS, Event, Head, NewEvent, event_digest, next_chain
    from ._ids import new_id, utc_now
    from ._jsonl import export_jsonl, import_jsonl, read_jsonl
    from ._parquet import export_parquet
    from ._store import Ledger, open_ledger
    from ._verify import Verification
    from ._verify import native_path as native_path
    from ._verify import verify_ledger as verify_ledger
    from ._vocabulary import KINDS

# Imported on first use (PEP 562): the store, DuckDB and Arrow cost a second or more to import,
# and ``import ledger`` (or one of its submodules) must not pay for them.
_EXPORTS: dict[str, str] = {
    "Analytics": "._analytics",
    "DEFAULT_URL": "._backends",
    "Event": "._events",
    "GENESIS": "._events",
    "Head": "._events",
    "KINDS": "._vocabulary",
    "Ledger": "._store",
    "NewEvent": "._events",
    "Verification": "._verify",
    "native_path": "._verify",
    "to_format": "._analytics",
    "verify_ledger": "._verify",
    "canonical_json": "._canonical",
    "check_read_only": "._analytics",
    "event_digest": "._events",
    "export_jsonl": "._jsonl",
    "export_parquet": "._parquet",
    "import_jsonl": "._jsonl",
    "new_id": "._ids",
    "next_chain": "._events",
    "open_ledger": "._store",
    "read_jsonl": "._jsonl",
    "redact_url": "._backends",
    "sha256_hex": "._canonical",
    "utc_now": "._ids",
    "view_name": "._analytics",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


def verify(
    ledger: Ledger, expected_head: str | None = None, *, beside_other_work: bool = False
) -> Verification:
    """Recompute every digest and chain link of ``ledger``; names the first bad seq.

    ``beside_other_work``: the caller keeps the cores busy meanwhile (a report's
    views), so the native scanner uses one thread rather than one per core;
    the Python path keeps its worker processes (a thread of it would hold the GIL).
    """
    from ._verify import native_path, verify_ledger

    workers = 1 if beside_other_work and native_path(ledger) is not None else None
    return verify_ledger(ledger, expected_head, workers=workers)


def query(
    url_or_ledger: str | Ledger, statement: str, fmt: str = "arrow", snapshot_root: Path | None = None
) -> Any:
    """Run a reading SQL statement over the ledger; ``fmt``: arrow, pandas or polars."""
    from ._analytics import Analytics, to_format
    from ._store import open_ledger

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
    "CompactError",
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
